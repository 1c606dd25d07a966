"""Cloud Functions wiring: Pub/Sub queues, CloudEvent and HTTP payloads."""

from __future__ import annotations

import base64
import functools
import json
from typing import Any

from pydantic import BaseModel, ValidationError

from orphan_cleanup.core.errors import ConfigError
from orphan_cleanup.core.messages import DeleteRequest, ListerEvent, ListingJob
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.pipeline import Pipeline
from orphan_cleanup.entrypoints import common
from orphan_cleanup.queues.pubsub import PubSubQueue


class MalformedMessage(ConfigError):
    """A message that can never be processed: it fails (and lands in the dead-letter topic)."""


def _pubsub_queues(settings: Settings) -> tuple[PubSubQueue, PubSubQueue, PubSubQueue | None]:
    from google.cloud import pubsub_v1  # type: ignore[attr-defined]  # a namespace package without stubs

    if not settings.listing_topic or not settings.delete_topic:
        raise ConfigError("LISTING_TOPIC and DELETE_TOPIC must be set")
    publisher = pubsub_v1.PublisherClient()
    jobs = PubSubQueue(publisher, settings.jobs_topic) if settings.jobs_topic else None
    return PubSubQueue(publisher, settings.listing_topic), PubSubQueue(publisher, settings.delete_topic), jobs


@functools.cache  # one instance per process: it is part of the pipeline cache key
def _integrations() -> tuple[Any, ...]:
    try:
        from sentry_sdk.integrations.gcp import GcpIntegration
    except ImportError:
        return ()
    return (GcpIntegration(),)


def log_metric(name: str, value: float, backend: str) -> None:
    """A per-backend count as one structured log line on stdout (Cloud Logging reads it
    as ``jsonPayload``): ``infra/gcp/monitoring.tf``'s log-based metrics count them."""
    print(json.dumps({"severity": "INFO", "message": "metric", "metric": name, "value": value, "backend": backend}),
          flush=True)


def pipeline() -> Pipeline:
    return common.pipeline(_pubsub_queues, _integrations(), metrics=log_metric)


def run_tick() -> dict[str, Any]:
    """The tick, with its result logged as one structured line (``tick done``, with
    ``stalest_backend_seconds``: the log-based metric the staleness alert reads)."""
    result = pipeline().run_tick().model_dump()
    print(json.dumps({"severity": "INFO", "message": "tick done", "stalest_backend_seconds":
                      result.get("stalest_backend_seconds") or 0, "stalest_backend": result.get("stalest_backend"),
                      "jobs": len(result["jobs"])}), flush=True)
    return result


def decode_pubsub(data: Any) -> Any:
    """The JSON document inside a Pub/Sub CloudEvent (``{"message": {"data": b64}}``),
    or a plain JSON body as sent over HTTP."""
    if isinstance(data, (bytes, str)):
        try:
            data = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise MalformedMessage("payload is not JSON") from e
    if isinstance(data, dict) and isinstance(data.get("message"), dict) and "data" in data["message"]:
        try:
            return json.loads(base64.b64decode(data["message"]["data"], validate=True))
        except (ValueError, TypeError) as e:
            raise MalformedMessage("Pub/Sub message data is not base64 JSON") from e
    return data


def is_pubsub_push(data: Any) -> bool:
    """A Pub/Sub push delivery (``{"message": {"data": ...}, "subscription": ...}``), as
    the jobs topic's subscription sends them, rather than a JSON body of its own."""
    return isinstance(data, dict) and isinstance(data.get("message"), dict)


def run_lister(body: Any) -> dict[str, Any]:
    """The lister's HTTP body: ``{}`` (Cloud Scheduler's tick), a listing job (a
    Pub/Sub push of the jobs topic, or the same JSON posted) or ``{"backend": ID[,
    "mode": M]}`` (an operator's invocation). A Pub/Sub push is only ever a listing job,
    parsed strictly: whoever may publish to the topic never picks a backend's mode
    (SAFETY.md rule 12), as on AWS's jobs queue. Bad input raises ``MalformedMessage``;
    a job's unexpected error propagates (HTTP 500: Pub/Sub redelivers it)."""
    raw = body
    if isinstance(body, (bytes, str)):
        try:
            raw = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise MalformedMessage("payload is not JSON") from e
    if is_pubsub_push(raw):
        return pipeline().run_job(parse(ListingJob, raw)).model_dump()
    data = decode_pubsub(raw)
    if data == {}:
        return run_tick()
    if isinstance(data, dict) and "backends" in data:
        return pipeline().run_job(parse(ListingJob, data)).model_dump()
    event = parse(ListerEvent, data)
    return pipeline().run_lister(event.backend, mode=event.mode, manual=event.mode is not None).model_dump()


def run_delete(data: Any) -> str:
    """One delete request (a Pub/Sub CloudEvent's data), counted per backend."""
    request = parse(DeleteRequest, data)
    p = pipeline()
    status = p.handle_delete(request)  # a request naming another backend than its cycle's raised
    p.reporter.count(f"Delete_{status}", 1, request.backend)
    return str(status)


def parse(model: type[BaseModel], data: Any) -> Any:
    try:
        return model.model_validate(decode_pubsub(data))
    except ValidationError as e:
        raise MalformedMessage(f"malformed {model.__name__}: {e.errors()[0]['msg']}") from e
