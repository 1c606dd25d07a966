"""SAFETY.md rule 22: no repr of the settings or of a connection's parameters prints a
secret (a traceback's frame locals, a log of an object), and the redaction Sentry's
``before_send`` applies masks remembered secrets and secret-shaped text."""

from __future__ import annotations

from urllib.parse import quote

from orphan_cleanup.core import redact
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.cycle.reporting import known_secrets
from orphan_cleanup.ledger.url import parse_database_url

PASSWORD = "pw-CANARY/1#x"
URL = f"postgresql://postgres:{quote(PASSWORD, safe='')}@db.example:5432/oc"
HOOK = "https://hooks.slack.com/services/T0/B0/hookCANARY"
DSN = "https://dsnkeyCANARY@o1.ingest.sentry.io/42"


def test_no_repr_of_the_settings_or_a_connection_shows_a_secret():
    settings = Settings.explicit(database_url=URL, slack_webhook_url=HOOK, sentry_dsn=DSN)

    for text in (repr(settings), str(settings), repr(parse_database_url(URL)), str(settings.model_dump())):
        assert "CANARY" not in text, text
    assert settings.database_url is not None and settings.database_url.get_secret_value() == URL
    assert hash(settings) == hash(Settings.explicit(database_url=URL, slack_webhook_url=HOOK, sentry_dsn=DSN))


def test_a_bad_database_url_names_the_setting_never_the_value():
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as caught:
        Settings.explicit(database_url="mysql://u:pwCANARY@h/db")
    assert caught.value.errors()[0]["msg"] == "Value error, DATABASE_URL must start with postgresql://"


def test_redact_masks_remembered_secrets_in_every_form_and_secret_shapes():
    settings = Settings.explicit(database_url=URL, slack_webhook_url=HOOK, sentry_dsn=DSN)
    redact.remember(*known_secrets(settings))

    event = {"message": f"cannot connect {URL} as {PASSWORD} ({quote(PASSWORD, safe='')}), posting to {HOOK}",
             "extra": {"dsn": DSN, "nested": [f"key {DSN.split('@')[0]}"]},
             "other": "postgresql://u:unknownCANARY@h/db https://hooks.slack.com/services/X/Y/otherCANARY"
                      " -----BEGIN PRIVATE KEY-----\nkeyCANARY\n-----END PRIVATE KEY-----"
                      " h:5432/?Action=connect&X-Amz-Signature=sigCANARY"}

    assert "CANARY" not in str(redact.redact_tree(event))
    assert redact.redact("cycle c1 of aws-prod finished clean") == "cycle c1 of aws-prod finished clean"
