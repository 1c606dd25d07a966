"""The Compute Engine clients a ``GcpProvider`` talks through, and the credentials they
use: a local endpoint (anonymous), a service-account key (the CLI's ``credentials_json``
or ``credentials_file``) or Application Default Credentials."""

from __future__ import annotations

import functools
import json
from typing import Any
from urllib.parse import urlsplit

import google.auth
import google.auth.exceptions as auth_exceptions
from google.auth.credentials import AnonymousCredentials, Credentials
from google.cloud import compute_v1
from google.oauth2 import service_account

from orphan_cleanup.core.backends import CREDENTIALS_DIGEST, BackendSettings
from orphan_cleanup.core.errors import AccessDenied, ConfigError

COMPUTE_SCOPE = "https://www.googleapis.com/auth/compute"


def build_gcp_clients(settings: BackendSettings, *, endpoint: str | None = None) -> dict[str, Any]:
    """The ten ``compute_v1`` clients ``GcpProvider`` takes, as keyword arguments (REST transport).

    ``endpoint`` (``http://host:port``, from ``ORPHAN_CLEANUP_GCP_ENDPOINT``) sends
    every call there with anonymous credentials, operation polling included (the
    operations clients are built for it too; left to the SDK they would poll the
    public endpoint). Otherwise credentials come from ``settings.credentials_json``
    (a service-account key) or Application Default Credentials.
    """
    if endpoint:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"GCP endpoint must look like http://host:port, got {endpoint!r}")
        credentials: Credentials = AnonymousCredentials()
        options: dict[str, str] | None = {"api_endpoint": parts.netloc}
        scheme = parts.scheme
    else:
        credentials, options, scheme = _credentials(settings), None, "https"

    def make(client_cls: Any) -> Any:
        transport = functools.partial(client_cls.get_transport_class("rest"), url_scheme=scheme)
        return client_cls(credentials=credentials, client_options=options, transport=transport)

    return {
        "instances": make(compute_v1.InstancesClient),
        "disks": make(compute_v1.DisksClient),
        "addresses": make(compute_v1.AddressesClient),
        "zone_operations": make(compute_v1.ZoneOperationsClient),
        "region_operations": make(compute_v1.RegionOperationsClient),
        "projects": make(compute_v1.ProjectsClient),
        "snapshots": make(compute_v1.SnapshotsClient),
        "global_operations": make(compute_v1.GlobalOperationsClient),
        "forwarding_rules": make(compute_v1.ForwardingRulesClient),
        "images": make(compute_v1.ImagesClient),
    }


def _credentials(settings: BackendSettings) -> Credentials:
    if not settings.credentials_json and (settings.model_extra or {}).get(CREDENTIALS_DIGEST):
        # A cycle that started with a key whose row no longer holds it (SAFETY.md rule 18):
        # never the function's own credentials instead.
        raise AccessDenied("the service-account key this cycle started with is no longer the backend's")
    key = settings.key_text
    if key is not None:
        try:
            info = json.loads(key)
            return service_account.Credentials.from_service_account_info(info, scopes=[COMPUTE_SCOPE])
        except (ValueError, TypeError, KeyError) as e:
            raise ConfigError("settings.credentials_json is not a service-account key") from e
    if settings.credentials_file is not None:
        try:
            return service_account.Credentials.from_service_account_file(settings.credentials_file,
                                                                         scopes=[COMPUTE_SCOPE])
        except OSError as e:
            raise ConfigError(f"settings.credentials_file {settings.credentials_file!r} cannot be read:"
                              f" {e.strerror or type(e).__name__}") from e
        except (ValueError, TypeError, KeyError) as e:
            raise ConfigError(f"settings.credentials_file {settings.credentials_file!r} is not a service-account"
                              " key file") from e
    try:
        credentials, _ = google.auth.default(scopes=[COMPUTE_SCOPE])
    except auth_exceptions.DefaultCredentialsError as e:
        raise AccessDenied(no_credentials_message()) from e
    return credentials


def no_credentials_message() -> str:
    """Why Application Default Credentials found nothing, and what works where: the deployed
    functions run as their own service account (they refuse a key stored in the ledger);
    the CLI takes a key file (``credentials_file``) or the operator's ADC."""
    import os

    path = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    cause = (f"GOOGLE_APPLICATION_CREDENTIALS names {path!r}, which is not a readable key file" if path
             else "Application Default Credentials found none (no GOOGLE_APPLICATION_CREDENTIALS, no gcloud"
                  " login, no metadata server)")
    return (f"no GCP credentials: {cause}. Deployed functions: they run as the function's service account"
            " (workload identity; docs/DEPLOY.md); the CLI: set the backend's credentials_file (a key file's"
            " path) or run `gcloud auth application-default login`")
