"""A backend's life through the CLI (issue #14): add, show, update, remove; settings
checked by the model (CLI input strictly, rows written with SQL per backend); a running
cycle shown by status, refused by remove unless --force, which fences it.

Commands run as a user runs them (`python -m orphan_cleanup`, a subprocess) against the
tests' real Postgres; cycles are started with the bookkeeping the lister uses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from typing import Any

import pytest

from orphan_cleanup.core.backends import Backend
from orphan_cleanup.core.errors import ConfigError, LeaseLost
from orphan_cleanup.cycle.cycle_state import start_cycle
from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.store import LedgerStore
from tests.support.ledger_helpers import add_backend, add_instance, add_ref, add_volume, limits

ACCOUNT = "123456789012"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/orphan-cleanup"


@pytest.fixture
def db(emptied_db: Database) -> Database:
    return emptied_db


def cli(db: Database, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ORPHAN_CLEANUP_")}
    environ.update(DATABASE_URL=db.info.url(), NO_COLOR="1", ORPHAN_CLEANUP_DATA_DIR="/nonexistent/never-used", **env)
    return subprocess.run([sys.executable, "-m", "orphan_cleanup", *args], env=environ, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def ok(db: Database, *args: str) -> str:
    proc = cli(db, *args)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stdout


def fails(db: Database, code: int, *args: str) -> str:
    proc = cli(db, *args)
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("orphan-cleanup: error: "), proc.stderr
    return lines[0]


def row(db: Database, backend_id: str) -> dict[str, Any] | None:
    with db.connection() as conn:
        rows = conn.run("SELECT account, regions, settings, mode FROM backends WHERE id = :i", i=backend_id)
    if not rows:
        return None
    account, regions, settings, mode = rows[0]
    return {"account": account, "regions": regions, "settings": settings, "mode": mode}


def scalar(db: Database, sql: str, **params: Any) -> Any:
    with db.connection() as conn:
        return conn.run(sql, **params)[0][0]


def add(db: Database, backend_id: str = "aws-prod", *extra: str) -> None:
    ok(db, "backend", "add", backend_id, "--provider", "aws", "--account", ACCOUNT, "--regions", "us-east-1",
       *extra)


def running_cycle(db: Database, backend_id: str) -> str:
    """A scheduled cycle in progress: its lease is live."""
    add_ref(db)  # enrollment needs an issued ref
    started = start_cycle(LedgerStore(db), backend_id, "report", limits(), manual=False)
    assert started.cycle is not None
    return started.cycle.id


# -- show, update ---------------------------------------------------------------------------------


def test_show_then_update_merges_settings_and_keeps_the_platforms_own_keys(db):
    # given a backend whose row the platform also keeps a key of its own in
    add(db, "aws-prod", "--settings", json.dumps({"role_arn": ROLE, "max_deletes": 5}))
    with db.connection() as conn:
        conn.run("UPDATE backends SET settings = settings || '{\"team\": \"ml-infra\"}' WHERE id = 'aws-prod'")

    # when shown, then the stored, default and foreign keys are told apart
    doc = json.loads(ok(db, "backend", "show", "aws-prod", "--json"))
    assert (doc["id"], doc["account"], doc["regions"], doc["mode"], doc["effective_mode"]) == (
        "aws-prod", ACCOUNT, ["us-east-1"], None, "report")
    assert doc["settings"] == {"role_arn": ROLE, "max_deletes": 5}
    assert doc["effective_settings"]["tag_key"] == "provider_ref" and doc["effective_settings"]["max_deletes"] == 5
    assert doc["unused_settings"] == {"team": "ml-infra"}
    assert doc["running"] is None and doc["error"] is None and doc["status"]["open_orphans"] == 0
    human = ok(db, "backend", "show", "aws-prod")
    assert "not used by orphan-cleanup" in human and "team" in human and "tag_key" in human

    # when regions, mode and settings change (a null removes a key, back to its default)
    out = ok(db, "backend", "update", "aws-prod", "--regions", "us-east-1,eu-west-1", "--mode", "delete",
             "--settings", '{"max_deletes": null, "margin_seconds": 600}')

    # then exactly that is stored, the platform's key kept, and the change is said
    assert row(db, "aws-prod") == {"account": ACCOUNT, "regions": ["us-east-1", "eu-west-1"], "mode": "delete",
                                   "settings": {"role_arn": ROLE, "margin_seconds": 600, "team": "ml-infra"}}
    assert "regions us-east-1 -> us-east-1,eu-west-1" in out and "mode (global) -> delete" in out
    assert "-max_deletes" in out and "+margin_seconds" in out

    # and --mode none gives the backend back to the global mode, --settings-replace replaces all
    out = ok(db, "backend", "update", "aws-prod", "--mode", "none", "--settings-replace", '{"max_deletes": 1}')
    assert row(db, "aws-prod")["mode"] is None
    assert row(db, "aws-prod")["settings"] == {"max_deletes": 1}
    assert "dropped keys not used by orphan-cleanup: team" in out
    assert json.loads(ok(db, "backend", "show", "aws-prod", "--json"))["effective_mode"] == "report"


def test_an_edit_is_activity_for_the_next_scheduled_run(db):
    add(db)
    before = scalar(db, "SELECT count(*) FROM ledger_activity WHERE backend_id = 'aws-prod'")
    ok(db, "backend", "update", "aws-prod", "--regions", "us-east-1,us-west-2")
    assert scalar(db, "SELECT count(*) FROM ledger_activity WHERE backend_id = 'aws-prod'") == before + 1


BAD_UPDATES = [
    ("a misspelt key", ["--settings", '{"margin_secnods": 60}'],
     "unknown setting 'margin_secnods'; known: tag_key, protect_tag_key, protect_tag_keys, role_arn"),
    ("an unknown key in a replacement", ["--settings-replace", '{"teem": "x"}'], "unknown setting 'teem'"),
    ("a role that is no role ARN", ["--settings", '{"role_arn": "arn:aws:iam::123:user/bob"}'],
     "settings.role_arn: 'arn:aws:iam::123:user/bob' is not an IAM role ARN"),
    ("a delete role that is no ARN", ["--settings", '{"delete_role_arn": "deleter"}'], "settings.delete_role_arn"),
    ("an empty tag key", ["--settings", '{"tag_key": ""}'], "settings.tag_key: must not be empty"),
    ("an AWS-reserved tag key", ["--settings", '{"protect_tag_key": "aws:protect"}'],
     "settings.protect_tag_key: 'aws:protect' starts with 'aws:'"),
    ("a tag key over 128 characters", ["--settings", json.dumps({"tag_key": "k" * 129})], "longer than 128"),
    ("the protect key equal to the tag key", ["--settings", '{"protect_tag_key": "provider_ref"}'],
     "settings.protect_tag_key: 'provider_ref' is also the tag_key"),
    ("an unknown AWS region", ["--regions", "us-east-1,us-north-7"], "us-north-7: not an AWS region botocore"),
    ("an empty region list", ["--regions", " , "], "give at least one region"),
    ("a malformed account", ["--account", "1234"], "AWS account '1234' must be 12 digits"),
    ("a limit out of range", ["--settings", '{"max_delete_share": 2}'], "settings.max_delete_share"),
    ("nothing to change", [], "nothing to update"),
    ("a setting no code reads", ["--settings", '{"credentials_secret": "gcp-sa"}'],
     "unknown setting 'credentials_secret'; known: tag_key,"),
    ("credentials_json that is not JSON", ["--settings", json.dumps({"credentials_json": "{not json"})],
     "credentials_json: is not JSON"),
    ("credentials_json without a key", ["--settings", json.dumps({"credentials_json": '{"type": "service_account"}'})],
     "credentials_json: is not a service-account key: no client_email, private_key, token_uri"),
    ("credentials_json that is an object", ["--settings", '{"credentials_json": {"type": "service_account"}}'],
     "credentials_json: Input should be a valid string"),
    ("a margin of a thousand years", ["--settings", '{"margin_seconds": 31557600000}'],
     "margin_seconds: Input should be less than or equal to 31622400"),
    ("seconds as a string", ["--settings", '{"margin_seconds": "300"}'], "margin_seconds: Input should be a valid"),
    ("a boolean as a count", ["--settings", '{"max_deletes": true}'], "max_deletes: Input should be a valid"),
    ("a NUL character", ["--settings", '{"tag_key": "a\\u0000b"}'], "a NUL character"),
    ("an empty external id", ["--settings", '{"external_id": ""}'], "settings.external_id: '' is not an STS"),
]


@pytest.mark.parametrize("argv, says", [b[1:] for b in BAD_UPDATES], ids=[b[0] for b in BAD_UPDATES])
def test_a_bad_update_is_one_line_and_changes_nothing(db, argv, says):
    add(db, "aws-prod", "--settings", json.dumps({"role_arn": ROLE}))
    before = row(db, "aws-prod")

    line = fails(db, 2, "backend", "update", "aws-prod", *argv)

    assert says in line
    assert row(db, "aws-prod") == before


@pytest.mark.parametrize("settings, regions, says", [
    ({"tag_key": "Provider Ref"}, "us-central1", "settings.tag_key: 'Provider Ref' is not a GCP label key"),
    ({}, "us-central1,moon-base", "moon-base: not a GCP region or zone"),
    ({"protect_tag_key": "keep:me"}, "us-central1", "settings.protect_tag_key: 'keep:me' is not a GCP label key"),
], ids=["label key with capitals", "not a zone", "colon in a label key"])
def test_gcp_backends_follow_gcp_rules(db, settings, regions, says):
    line = fails(db, 2, "backend", "add", "gcp-main", "--provider", "gcp", "--account", "my-project-42",
                 "--regions", regions, "--settings", json.dumps(settings))
    assert says in line
    assert row(db, "gcp-main") is None


def test_backend_add_refuses_unknown_keys_and_accepts_every_partitions_region(db):
    line = fails(db, 2, "backend", "add", "b1", "--provider", "aws", "--account", ACCOUNT, "--regions", "us-east-1",
                 "--settings", '{"margin_secnods": 60}')
    assert "unknown setting 'margin_secnods'; known: " in line and "margin_seconds" in line
    ok(db, "backend", "add", "gov", "--provider", "aws", "--account", ACCOUNT, "--regions",
       "us-gov-west-1,cn-north-1,eu-central-2")
    assert row(db, "gov")["regions"] == ["us-gov-west-1", "cn-north-1", "eu-central-2"]


def service_account_key() -> str:
    """A service-account key file as Google issues one, with a real RSA key made here."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    return json.dumps({"type": "service_account", "project_id": "my-project-42", "private_key_id": "k1",
                       "private_key": pem, "client_email": "cleanup@my-project-42.iam.gserviceaccount.com",
                       "client_id": "1", "token_uri": "https://oauth2.googleapis.com/token"})


def test_credentials_json_is_checked_at_add_and_at_update_and_a_good_key_is_stored_hidden(db):
    gcp = ["--provider", "gcp", "--account", "my-project-42", "--regions", "us-central1"]
    line = fails(db, 2, "backend", "add", "gcp-main", *gcp, "--settings", json.dumps({"credentials_json": "{not json"}))
    assert "settings.credentials_json: is not JSON" in line and row(db, "gcp-main") is None
    broken = json.loads(service_account_key()) | {"private_key": "-----BEGIN PRIVATE KEY-----\nAAAA\n"
                                                                 "-----END PRIVATE KEY-----\n"}
    line = fails(db, 2, "backend", "add", "gcp-main", *gcp, "--settings",
                 json.dumps({"credentials_json": json.dumps(broken)}))
    assert "credentials_json: the key cannot be read" in line and "BEGIN" not in line  # never the secret

    key = service_account_key()
    ok(db, "backend", "add", "gcp-main", *gcp, "--settings", json.dumps({"credentials_json": key}))
    assert row(db, "gcp-main")["settings"] == {"credentials_json": key}
    line = fails(db, 2, "backend", "update", "gcp-main", "--settings", json.dumps({"credentials_json": "{x"}))
    assert "credentials_json: is not JSON" in line and row(db, "gcp-main")["settings"] == {"credentials_json": key}
    shown = ok(db, "backend", "show", "gcp-main")
    assert "credentials_json" in shown and "(set, hidden)" in shown and "PRIVATE KEY" not in shown


def test_show_prints_each_effective_value_with_its_source(db):
    # given a backend with one limit of its own, and a margin left to the environment
    add(db, "aws-prod", "--settings", json.dumps({"role_arn": ROLE, "max_deletes": 5}))

    proc = cli(db, "backend", "show", "aws-prod", "--json", ORPHAN_CLEANUP_MARGIN_SECONDS="120")
    human = cli(db, "backend", "show", "aws-prod", ORPHAN_CLEANUP_MARGIN_SECONDS="120").stdout

    doc = json.loads(proc.stdout)
    effective, sources = doc["effective_settings"], doc["setting_sources"]
    gcp_only = {"project", "credentials_json", "credentials_file"}  # an AWS backend lists only AWS's keys
    assert set(effective) == set(sources) == set(Backend.model_fields["settings"].annotation.model_fields) - gcp_only
    assert (effective["max_deletes"], sources["max_deletes"]) == (5, "backend")
    assert (effective["margin_seconds"], sources["margin_seconds"]) == (120, "environment")
    assert (effective["interval_seconds"], sources["interval_seconds"]) == (900, "default")
    assert effective["delete_role_arn"] == ROLE  # what is used, never null
    assert (effective["tag_key"], sources["tag_key"]) == ("provider_ref", "default")
    lines = {line.split()[0]: line for line in human.splitlines() if line.startswith("  ") and line.split()}
    assert lines["margin_seconds"].split()[1:] == ["120", "(environment:", "ORPHAN_CLEANUP_MARGIN_SECONDS)"]
    assert lines["max_deletes"].split()[1:] == ["5", "(backend)"]
    assert lines["interval_seconds"].split()[1:] == ["900", "(default", "of", "ORPHAN_CLEANUP_INTERVAL_SECONDS)"]
    assert lines["delete_role_arn"].split()[1:] == [ROLE, "(default:", "role_arn)"]
    assert " - " not in human and "  -  " not in human


def test_update_of_an_unknown_backend_is_bad_input(db):
    assert "unknown backend 'nope'" in fails(db, 2, "backend", "update", "nope", "--mode", "off")
    assert "unknown backend 'nope'" in fails(db, 2, "backend", "show", "nope")
    assert "unknown backend 'nope'" in fails(db, 2, "backend", "remove", "nope")


# -- rows written with plain SQL -------------------------------------------------------------------


BAD_ROWS = [
    ("empty tag key", "{us-east-1}", {"tag_key": ""}, "settings.tag_key: must not be empty"),
    ("a margin past any clock", "{us-east-1}", {"margin_seconds": 10 ** 20}, "settings.margin_seconds"),
    ("credentials_json not JSON", "{us-east-1}", {"credentials_json": "{not json"},
     "settings.credentials_json: is not JSON"),
    ("no region", "{}", {}, "regions: is empty"),
    ("bad role ARN", "{us-east-1}", {"role_arn": "not-an-arn"}, "settings.role_arn: 'not-an-arn' is not an IAM"),
]


@pytest.mark.parametrize("regions, settings, says", [b[1:] for b in BAD_ROWS], ids=[b[0] for b in BAD_ROWS])
def test_a_misconfigured_row_fails_that_backend_alone(db, regions, settings, says):
    # given a good backend and one a platform wrote with plain SQL and a bad value
    add(db, "aws-good")
    with db.connection() as conn:
        conn.run("INSERT INTO backends (id, provider, account, regions, settings) VALUES"
                 " ('aws-bad', 'aws', :a, CAST(:r AS text[]), CAST(:s AS jsonb))", a=ACCOUNT, r=regions,
                 s=json.dumps(settings))

    # when it is run, then one line names the backend and the field
    line = fails(db, 2, "run", "--backend", "aws-bad", "--json")
    assert "backend 'aws-bad' is misconfigured" in line and says in line

    # and the list still lists both, the bad one marked
    proc = cli(db, "backend", "list", "--json")
    assert proc.returncode == 0
    listed = {b["id"]: b for b in json.loads(proc.stdout)}
    assert listed["aws-good"]["error"] is None and says in listed["aws-bad"]["error"]
    assert "aws-bad" in proc.stderr and says in proc.stderr
    table = ok(db, "backend", "list")
    bad_line = next(line for line in table.splitlines() if line.startswith("aws-bad"))
    assert bad_line.split()[-1] == "misconfigured"
    # show says what is wrong (and exits 2), the good one is untouched
    proc = cli(db, "backend", "show", "aws-bad", "--json")
    assert proc.returncode == 2 and says in json.loads(proc.stdout)["error"]
    assert cli(db, "backend", "show", "aws-good").returncode == 0

    # and the tick reads every other backend (the bad one is left out, never the whole tick)
    with LedgerStore(db).session() as session:
        assert [r.backend.id for r in session.tick_rows()] == ["aws-good"]
        with pytest.raises(ConfigError, match="aws-bad"):
            session.backend("aws-bad")

    # and `backend update` repairs it
    repair = ["--regions", "us-east-1"] if regions == "{}" else ["--settings", json.dumps(
        {k: None for k in settings})]
    ok(db, "backend", "update", "aws-bad", *repair)
    assert cli(db, "backend", "show", "aws-bad").returncode == 0


def test_rows_may_keep_keys_of_their_own(db):
    add_backend(db, "aws-platform", settings={"team": "ml", "tag_key": "platform_ref"})
    backend = LedgerStore(db).backends()[0]
    assert isinstance(backend, Backend) and backend.settings.tag_key == "platform_ref"
    doc = json.loads(ok(db, "backend", "show", "aws-platform", "--json"))
    assert doc["unused_settings"] == {"team": "ml"} and doc["error"] is None


# -- a running cycle: status shows it, update and remove respect it ---------------------------------


def test_status_shows_the_running_cycle(db):
    add(db)
    cycle_id = running_cycle(db, "aws-prod")

    rows = json.loads(ok(db, "status", "--json"))

    running = rows[0]["running"]
    assert set(running) == {"cycle_id", "started_at", "lease_expires_at"} and running["cycle_id"] == cycle_id
    assert datetime.fromisoformat(running["lease_expires_at"]) > datetime.fromisoformat(running["started_at"])
    human = ok(db, "status")
    assert "running now:" in human and f"aws-prod: cycle {cycle_id} since " in human and "lease until" in human
    assert json.loads(ok(db, "backend", "show", "aws-prod", "--json"))["running"]["cycle_id"] == cycle_id


def test_an_expired_lease_is_not_running(db):
    add(db)
    running_cycle(db, "aws-prod")
    with db.connection() as conn:
        conn.run("UPDATE cleanup SET lease_expires_at = oc_clock() - interval '1 second'")
    assert json.loads(ok(db, "status", "--json"))[0]["running"] is None


def test_update_while_a_cycle_runs_changes_only_the_mode(db):
    add(db)
    cycle_id = running_cycle(db, "aws-prod")

    line = fails(db, 3, "backend", "update", "aws-prod", "--regions", "us-east-1,eu-west-1")
    assert f"cycle {cycle_id} is running" in line and "only --mode" in line
    assert row(db, "aws-prod")["regions"] == ["us-east-1"]
    # the running cycle keeps its own mode (SAFETY.md rule 12): a mode change is safe
    ok(db, "backend", "update", "aws-prod", "--mode", "off")
    assert row(db, "aws-prod")["mode"] == "off"


def test_remove_refuses_while_a_cycle_runs(db):
    add(db)
    cycle_id = running_cycle(db, "aws-prod")

    line = fails(db, 3, "backend", "remove", "aws-prod")

    assert f"cycle {cycle_id} is running" in line and "--force" in line
    assert row(db, "aws-prod") is not None
    with LedgerStore(db).cycle(cycle_id):  # still live: nothing was fenced
        pass


def test_remove_force_fences_the_running_cycle_and_keeps_the_history(db):
    # given a backend with history (an owner naming it, an orphan row) and a running cycle
    add(db)
    add_instance(db, backend_id="aws-prod", primary_id="i-0abc")
    add_volume(db, backend_id="aws-prod", primary_id="vol-0abc")  # a volume owner names it too (README, C1)
    add_volume(db, backend_id="aws-prod", primary_id="vol-0def", status="deleted")  # not live
    cycle_id = running_cycle(db, "aws-prod")
    with db.connection() as conn:
        conn.run("INSERT INTO orphans (backend_id, group_key, provider_ref, region, resources, reason)"
                 " VALUES ('aws-prod', 'g1', 'abcdef123456', 'us-east-1', '[]', 'owner_terminated')")
        fence = conn.run("SELECT fence FROM cleanup WHERE backend_id = 'aws-prod'")[0][0]

    # when it is removed with --force
    out = ok(db, "backend", "remove", "aws-prod", "--force")

    # then the row and its schedule are gone: no future cycle
    assert f"its running cycle {cycle_id} was stopped" in out
    assert "kept for audit: 1 cycle(s), 1 orphan record(s)" in out and "2 live owner(s)" in out
    assert row(db, "aws-prod") is None
    assert scalar(db, "SELECT count(*) FROM cleanup") == 0
    # the running cycle is fenced: nothing of it applies any more, and it reads as failed
    with pytest.raises(LeaseLost):
        with LedgerStore(db).cycle(cycle_id):
            pass
    with db.connection() as conn:
        assert conn.run("SELECT outcome, error FROM cycles WHERE id = :c", c=cycle_id) == [
            ["failed", "the backend was removed (backend remove)"]]
        assert conn.run("SELECT count(*) FROM orphans WHERE backend_id = 'aws-prod'") == [[1]]
        # the events say why the cycle failed, then the removal (README, "When one fires")
        assert conn.run("SELECT kind, cycle_id, coalesce(details->>'forced', message) FROM events"
                        " WHERE backend_id = 'aws-prod' ORDER BY id") == [
            ["cycle_failed", cycle_id, "the backend was removed (backend remove)"],
            ["backend_removed", cycle_id, "true"]]
        # the activity trigger logged the delete (same-account backends' STEP 1 sees it)
        assert conn.run("SELECT count(*) FROM ledger_activity WHERE backend_id = 'aws-prod'"
                        " AND kind = 'backend_delete'") == [[1]]
    assert fence is not None
    # what it covered stays listed, report-only, as a retired coverage (docs/SAFETY.md rule 24)
    [retired] = json.loads(ok(db, "status", "--json"))
    assert (retired["backend"], retired["retired"], retired["mode"]) == ("aws-prod", True, "report")
    # and the id may be registered again
    add(db)
    assert json.loads(ok(db, "backend", "show", "aws-prod", "--json"))["running"] is None


def test_remove_of_an_idle_backend(db):
    add(db, "aws-old")
    add(db, "aws-new")
    out = ok(db, "backend", "remove", "aws-old")
    assert out.startswith("removed backend aws-old: no cycle of it runs any more\n")
    cov = scalar(db, "SELECT id FROM retired_coverages")
    assert (f"still listed: retired coverage {cov} (aws {ACCOUNT}, us-east-1, mode of the stack, never loosened)"
            f" until clean cycles there find nothing of aws-old (docs/SAFETY.md rule 24); to stop it now:"
            f" orphan-cleanup backend forget-coverage {cov}\n") in out
    assert [b["id"] for b in json.loads(ok(db, "backend", "list", "--json"))] == ["aws-new"]


def test_no_secret_is_ever_printed_and_a_key_file_path_is_accepted(db, tmp_path):
    # given a GCP backend holding a key, and one naming a key file (the CLI's way)
    gcp = ["--provider", "gcp", "--account", "my-project-42", "--regions", "us-central1"]
    key = service_account_key()
    ok(db, "backend", "add", "gcp-key", *gcp, "--settings", json.dumps({"credentials_json": key}))
    key_file = tmp_path / "sa-key.json"
    key_file.write_text(key)
    ok(db, "backend", "add", "gcp-file", *gcp, "--settings", json.dumps({"credentials_file": str(key_file)}))
    assert row(db, "gcp-file")["settings"] == {"credentials_file": str(key_file)}

    # then no output of show or list carries the key, in text or JSON
    private = json.loads(key)["private_key"].splitlines()[1]
    for args in (["backend", "show", "gcp-key"], ["backend", "show", "gcp-key", "--json"], ["backend", "list", "--json"],
                 ["backend", "list"]):
        out = ok(db, *args)
        assert private not in out and "PRIVATE KEY" not in out, args
    doc = json.loads(ok(db, "backend", "show", "gcp-file", "--json"))
    assert doc["effective_settings"]["credentials_file"] == str(key_file)
    # and the model holds the key as a secret: not in its repr, nor in a validation error
    backend = LedgerStore(db).backend_row("gcp-key").backend
    assert backend is not None and private not in repr(backend) and "**********" in repr(backend.settings)
    assert backend.settings.key_text == key
