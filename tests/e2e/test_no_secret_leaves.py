"""docs/SAFETY.md rule 22, end to end: no secret leaves its box.

Every secret is set to a unique canary: the database password (a SCRAM role on the TLS
Postgres of tests/integration/test_db_tls.py), the RDS IAM token (its SigV4 signature),
the Slack webhook URL, a service account key, the Sentry DSN's key. The real CLI (a
subprocess) and the deployed functions (in process) are driven through every path:
report, delete and failed cycles; the webhook without a scheme, with a space, refused,
answering 500, and a missing SNS topic; a wrong password; a rotation read again from
DATABASE_URL_SECRET_ARN; IAM auth; Sentry against a local sink of envelopes; a held
delete gate and a malformed message on the GCP deleter; `orphan-cleanup psql`.

Then every place a secret could reach is searched: each log line (caplog, the CLI's
stderr), the CLI's output, every row of every ledger table (events, journal, cycles...),
each body the webhook received, each Sentry envelope, the command lines of psql. No
canary may appear there, plain or URL-encoded; each kind of place is counted, so the
test cannot pass by searching nothing. The DSN's key is the Sentry envelope's own
routing (its ``trace.public_key`` header, Sentry's auth): only envelope items (events)
are searched for it."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import boto3
import pytest

from orphan_cleanup.ledger.db import Database
from orphan_cleanup.ledger.url import ConnInfo
from tests.integration.test_db_rds import Role, _admin, _run, rds_secret, role  # noqa: F401 - fixture
from tests.integration.test_db_tls import BINDIR, TlsServer, tls_server  # noqa: F401 - fixture
from tests.support.pubsub_harness import pubsub, pubsub_server  # noqa: F401 - fixtures
from tests.support.sqs_harness import MotoPlatform

pytestmark = [pytest.mark.skipif(BINDIR is None, reason="needs the TLS PostgreSQL of test_db_tls.py"),
              pytest.mark.usefixtures("moto_reset")]

BACKEND = "aws-prod"
MARGIN = 1
PASSWORD = "pw-Canary/7#q@x"  # every character that URL-encodes differently
WRONG_PASSWORD = "wrongpw-Canary-2e9d"
HOOK_SECRET = "T0CANARY/B0CANARY/hookCanary5a1f"
DSN_KEY = "dsnkeycanary6b2c0d"
SA_KEY = "MIIEsaKeyCanary8d3e"
SIGNATURE = re.compile(r"X-Amz-Signature=[0-9a-f]{64}")  # an RDS IAM token's secret part


def forms(value: str) -> set[str]:
    return {value, quote(value, safe=""), quote_plus(value), quote(value), value.lower()}


CANARIES = set().union(*(forms(v) for v in (PASSWORD, WRONG_PASSWORD, HOOK_SECRET, SA_KEY, "Canary/7#q")))
ALL_CANARIES = CANARIES | forms(DSN_KEY)


class Found:
    """The places searched, by kind, and any canary found in one of them."""

    def __init__(self) -> None:
        self.searched: Counter[str] = Counter()
        self.leaks: list[tuple[str, str, str]] = []

    def search(self, kind: str, text: str, canaries: set[str] = ALL_CANARIES) -> None:
        self.searched[kind] += 1
        low = text.lower()
        for canary in canaries:
            if canary.lower() in low:
                self.leaks.append((kind, canary, text[max(0, low.find(canary.lower()) - 120):][:300]))
        if SIGNATURE.search(text):
            self.leaks.append((kind, "X-Amz-Signature", SIGNATURE.search(text).group(0)))  # type: ignore[union-attr]


class Sink(BaseHTTPRequestHandler):
    """A webhook and a Sentry ingest in one: records every request (path and body);
    answers 500 on a path with ``/fail/``."""

    requests: list[tuple[str, dict[str, str], bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        Sink.requests.append((self.path, dict(self.headers), body))
        self.send_response(500 if "/fail/" in self.path else 200)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def sink() -> Iterator[str]:
    Sink.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def envelope_items(body: bytes, headers: dict[str, str]) -> tuple[str, list[str]]:
    """A Sentry envelope: (its header line, its items' lines), decompressed."""
    encoding = {k.lower(): v for k, v in headers.items()}.get("content-encoding", "")
    if encoding == "gzip":
        body = gzip.decompress(body)
    elif encoding == "br":
        import brotli  # type: ignore[import-not-found]

        body = brotli.decompress(body)
    elif encoding == "deflate":
        body = zlib.decompress(body)
    lines = body.decode("utf-8", "replace").split("\n")
    return lines[0], lines[1:]


def search_sentry(found: Found) -> None:
    for path, headers, body in Sink.requests:
        if "/envelope/" not in path and "/store/" not in path:
            continue
        header, items = envelope_items(body, headers)
        found.search("sentry envelope header", header, CANARIES)
        found.search("sentry envelope", "\n".join(items))
        assert '"vars"' not in "\n".join(items), "a frame's local variables were sent"


def search_tables(found: Found, db: Database) -> None:
    """Every row of every table of the ledger's schema, as text."""
    with db.connection() as conn:
        tables = conn.run("SELECT format('%I.%I', schemaname, tablename) FROM pg_tables"
                          " WHERE schemaname NOT IN ('pg_catalog', 'information_schema')")
        for [table] in tables:
            rows = conn.run(f"SELECT t::text FROM {table} t")  # noqa: S608 - names from the catalog
            found.searched[f"{table.split('.')[-1]} table"] += 0
            for [row] in rows:
                found.search(f"{table.split('.')[-1]} row", row)


class Cli:
    """`orphan-cleanup` as a subprocess; every output kept for the search."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.outputs: list[tuple[str, str, int]] = []

    def __call__(self, *args: str, **env: str) -> tuple[int, str, str]:
        environ = {**os.environ, **self.env, "NO_COLOR": "1", **env}
        environ.pop("ORPHAN_CLEANUP_MODE", None)
        proc = subprocess.run([sys.executable, "-m", "orphan_cleanup", *args], env=environ, capture_output=True,
                              text=True, timeout=120, stdin=subprocess.DEVNULL)
        self.outputs.append((" ".join(args), proc.stdout + proc.stderr, proc.returncode))
        return proc.returncode, proc.stdout, proc.stderr

    def psql_command_lines(self, *args: str, **env: str) -> list[list[str]]:
        """Run `orphan-cleanup psql` and read the command line of each child it starts
        (``/proc/PID/cmdline``) while the query runs."""
        environ = {**os.environ, **self.env, **env}
        proc = subprocess.Popen([sys.executable, "-m", "orphan_cleanup", "psql", "--", *args], env=environ,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        seen: dict[int, list[str]] = {}
        while proc.poll() is None:
            for child in _descendants(proc.pid):
                try:
                    argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if any(argv):  # (a zombie's command line is empty)
                    seen[child] = [a.decode(errors="replace") for a in argv if a]
            time.sleep(0.02)
        out = proc.stdout.read().decode() if proc.stdout else ""
        self.outputs.append(("psql", out, proc.returncode))
        return list(seen.values())


def _descendants(pid: int) -> list[int]:
    children: list[int] = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            child = int(stat.parent.name)
            children += [child, *_descendants(child)]
    return children


def test_no_secret_leaves_the_cli(tls_server: TlsServer, role: Role, sink: str, pg_server: ConnInfo):  # noqa: F811
    # given a role whose password is the canary, its database migrated by the CLI
    _run(tls_server, f"ALTER ROLE {role.name} PASSWORD '{PASSWORD}'")
    query = f"sslmode=verify-full&sslrootcert={quote(str(tls_server.ca))}&options=-csearch_path%3Dorphan_cleanup"
    url = f"postgresql://{role.name}:{quote(PASSWORD, safe='')}@127.0.0.1:{tls_server.port}/{role.database}?{query}"
    cli = Cli({"DATABASE_URL": url, "ORPHAN_CLEANUP_MARGIN_SECONDS": str(MARGIN),
               "SENTRY_DSN": f"http://{DSN_KEY}@{sink}/1"})
    assert cli("migrate")[0] == 0, cli.outputs[-1]
    db = Database.from_url(url)
    with db.connection() as conn:
        conn.run("INSERT INTO backends (id, provider, account, regions) VALUES"
                 " (:i, 'aws', '123456789012', '{us-east-1}')", i=BACKEND)
    platform = MotoPlatform(db, BACKEND)
    platform.tracked()
    platform.terminated_leak()
    platform.age_ledger()
    time.sleep(MARGIN + 0.1)
    missing_topic = boto3.client("sns", region_name="us-east-1").create_topic(Name="x")["TopicArn"][:-1] + "gone"

    # when report cycles run with every channel broken in each way (each run finds a new leak)
    broken = [f"hooks.slack.com/services/{HOOK_SECRET}", f"http://{sink}/services/T0 /{HOOK_SECRET}",
              f"http://127.0.0.1:1/services/{HOOK_SECRET}", f"http://{sink}/fail/services/{HOOK_SECRET}"]
    for hook in broken:
        code, out, err = cli("run", "--backend", BACKEND, "--json", SLACK_WEBHOOK_URL=hook,
                             NOTIFY_TOPIC_ARN=missing_topic)
        assert code == 0 and "not delivered to slack: SLACK_WEBHOOK_URL: " in err, err
        platform.terminated_leak()
        platform.age_ledger()
        time.sleep(MARGIN + 0.1)
    # and a delete cycle whose digest is delivered, then a failed cycle (not moto's account)
    code, out, err = cli("run", "--backend", BACKEND, "--json", "--mode", "delete", "--yes",
                         SLACK_WEBHOOK_URL=f"http://{sink}/services/{HOOK_SECRET}")
    assert code == 0, err
    with db.connection() as conn:
        conn.run("UPDATE backends SET account = '210987654321' WHERE id = :b", b=BACKEND)
    code, out, err = cli("run", "--backend", BACKEND, "--json", SLACK_WEBHOOK_URL=broken[0])
    assert code == 1 and json.loads(out)["outcome"] == "failed", err
    # and a wrong password, the events, and psql
    code, out, err = cli("status", DATABASE_URL=url.replace(quote(PASSWORD, safe=""), WRONG_PASSWORD))
    assert code != 0 and "28P01" in out + err, out + err
    assert cli("events")[0] == 0
    # (psql on the session's Postgres: the embedded psql may lack TLS; the password goes along all the same)
    plain = pg_server.url().replace("postgresql://postgres@", f"postgresql://postgres:{quote(PASSWORD, safe='')}@")
    command_lines = cli.psql_command_lines("-c", "SELECT pg_sleep(0.5)", DATABASE_URL=plain)
    assert cli.outputs[-1][2] == 0, cli.outputs[-1]
    assert any(Path(argv[0]).name == "psql" for argv in command_lines), command_lines

    # then no canary is anywhere
    found = Found()
    for _command, output, _ in cli.outputs:
        found.search("cli output", output)
    for argv in command_lines:
        found.search("child command line", " ".join(argv))
    for path, _, body in Sink.requests:
        if "/services/" in path:
            found.search("webhook body", body.decode())
    search_sentry(found)
    search_tables(found, _admin(tls_server, role.database))
    assert not found.leaks, found.leaks
    for kind in ("cli output", "child command line", "webhook body", "sentry envelope", "events row",
                 "cycles row", "provider_journal row"):
        assert found.searched[kind] > 0, (kind, found.searched)
    print(f"\nplaces searched: {dict(found.searched)}")


@pytest.fixture
def sentry_reset() -> Iterator[None]:
    """Sentry is process-wide: off before, closed and off after (other tests run without it)."""
    import sentry_sdk

    sentry_sdk.get_global_scope().set_client(None)
    yield
    sentry_sdk.get_client().close(timeout=2)
    sentry_sdk.get_global_scope().set_client(None)


def test_no_secret_leaves_the_gcp_functions(db, gcp, pubsub, monkeypatch, caplog, sink, sentry_reset, tmp_path):  # noqa: F811
    """The GCP functions with Sentry on: a held gate (429), a malformed message (a 500, its
    traceback logged and sent to Sentry without local variables), a broken webhook, and a
    Pub/Sub notifier whose service account key cannot be read."""
    import logging

    from orphan_cleanup.core.settings import Settings
    from orphan_cleanup.entrypoints.notifiers import notifiers
    from orphan_cleanup.ledger.store import LedgerStore
    from orphan_cleanup.notify.base import NotifyError
    from tests.e2e.test_gcp_functions_e2e import DELETE_TOPIC, LISTING_TOPIC, PROJECT, Deployment, Fleet
    from tests.integration.test_notify_adapters import DIGEST
    from tests.support.pubsub_harness import pubsub_cloudevent

    caplog.set_level(logging.INFO)
    deployment = Deployment(db, gcp, pubsub, monkeypatch)
    url = db.info.url().replace("postgresql://postgres@", f"postgresql://postgres:{quote(PASSWORD, safe='')}@")
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.setenv("SENTRY_DSN", f"http://{DSN_KEY}@{sink}/1")
    monkeypatch.setenv("SLACK_WEBHOOK_URL", f"hooks.slack.com/services/{HOOK_SECRET}")
    deployment.add_backend(mode="delete")
    fleet = Fleet(db, gcp)

    deployment.list()
    deployment.push(LISTING_TOPIC, deployment.classifier, f"projects/{PROJECT}/subscriptions/c", binary=True)
    [held, *rest] = deployment.pubsub.take(DELETE_TOPIC)
    ref = held.json()["group"]["provider_ref"]
    assert LedgerStore(db).acquire_gate(f"gcp:{PROJECT}", ref, "another", 60)
    responses = [deployment.deleter.post("/", **pubsub_cloudevent(held, subscription="s", binary=True))]
    responses.append(deployment.deleter.post("/", **pubsub_cloudevent(b"{not json", subscription="s", binary=True)))
    assert [r.status_code for r in responses] == [429, 500]
    LedgerStore(db).release_gate(f"gcp:{PROJECT}", ref, "another")
    for message in [held, *rest]:
        responses.append(deployment.deleter.post("/", **pubsub_cloudevent(message, subscription="s", binary=True)))
    assert not fleet.exists("instances", "leaked")

    # and a Pub/Sub notifier whose credentials file holds a key that cannot be read
    key = tmp_path / "sa.json"
    key.write_text(json.dumps({"type": "service_account", "project_id": PROJECT, "client_email": f"x@{PROJECT}.iam",
                               "private_key_id": "k1", "token_uri": "https://oauth2.googleapis.com/token",
                               "private_key": f"-----BEGIN PRIVATE KEY-----\n{SA_KEY}\n-----END PRIVATE KEY-----\n"}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    monkeypatch.delenv("PUBSUB_EMULATOR_HOST", raising=False)
    with pytest.raises(NotifyError) as caught:
        notifiers(Settings.explicit(notify_topic=f"projects/{PROJECT}/topics/d", notify_timeout=3))[0].send(DIGEST)

    import sentry_sdk

    sentry_sdk.get_client().flush(timeout=5)
    found = Found()
    found.search("error text", str(caught.value))
    for record in caplog.records:
        found.search("log line", logging.Formatter("%(message)s %(exc_info)s").format(record) + str(record.__dict__))
    for r in responses:
        found.search("http response", r.get_data(as_text=True))
    search_sentry(found)
    search_tables(found, db)
    assert not found.leaks, found.leaks
    for kind in ("error text", "log line", "http response", "sentry envelope", "events row", "provider_journal row"):
        assert found.searched[kind] > 0, (kind, found.searched)
    print(f"\nplaces searched: {dict(found.searched)}")


def test_no_secret_leaves_a_rotation_or_an_iam_token(tls_server, role, moto_reset, monkeypatch, caplog):  # noqa: F811
    """The deployed lister reads its database URL from DATABASE_URL_SECRET_ARN (RDS's JSON,
    the password a canary), is rotated (re-read on 28P01), then rotated behind the secret's
    back (an error); DATABASE_IAM_AUTH's token is refused. Errors and logs are searched."""
    import logging

    from functions.aws import lister
    from orphan_cleanup.core.errors import DatabaseError
    from orphan_cleanup.core.settings import Settings
    from orphan_cleanup.entrypoints import bootstrap
    from orphan_cleanup.ledger.migrate import migrate
    from tests.support.sqs_harness import context

    # INFO and up: the SDKs' own DEBUG wire logs (botocore's request and response bodies) are
    # off unless an operator turns them on, and then they show any secret they carry.
    caplog.set_level(logging.INFO)
    second = "pw-Canary/second-3c9e"
    canaries = CANARIES | forms(second)
    _run(tls_server, f"ALTER ROLE {role.name} PASSWORD '{PASSWORD}'")
    sm, sqs = boto3.client("secretsmanager"), boto3.client("sqs")
    arn = sm.create_secret(Name=f"canary-{role.name}", SecretString=rds_secret(tls_server, role, PASSWORD))["ARN"]
    migrate(bootstrap.open_database(Settings.explicit(database_url_secret_arn=arn, aws_endpoint_url=moto_reset),
                                    deployed=True))
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("DATABASE_URL_SECRET_ARN", arn)
    for name in ("JOBS", "LISTING", "DELETE"):
        monkeypatch.setenv(f"{name}_QUEUE_URL", sqs.create_queue(QueueName=f"{role.name}-{name.lower()}")["QueueUrl"])
    results: list[str] = []

    # a warm lister, rotated in Postgres and in the secret: the second tick re-reads it
    results.append(json.dumps(lister.handler({}, context("lister")), default=str))
    _run(tls_server, f"ALTER ROLE {role.name} PASSWORD '{second}'")
    _run(tls_server, f"SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE usename = '{role.name}'")
    sm.put_secret_value(SecretId=arn, SecretString=rds_secret(tls_server, role, second))
    results.append(json.dumps(lister.handler({}, context("lister")), default=str))
    assert all('"ok": true' in r for r in results), results
    # a rotation the secret does not follow: one error line
    _run(tls_server, f"ALTER ROLE {role.name} PASSWORD '{WRONG_PASSWORD}x'")
    _run(tls_server, f"SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE usename = '{role.name}'")
    with pytest.raises(DatabaseError) as rotated:
        lister.handler({}, context("lister"))
    # and an RDS IAM token the server refuses (the URL's own password a canary too)
    url = (f"postgresql://{role.name}:{quote(WRONG_PASSWORD)}@127.0.0.1:{tls_server.port}/{role.database}"
           f"?sslrootcert={tls_server.ca}")
    with pytest.raises(DatabaseError) as refused:
        bootstrap.open_database(Settings.explicit(database_url=url, database_iam_auth=True,
                                                  aws_endpoint_url=moto_reset)).connect()

    found = Found()
    for error in (rotated.value, refused.value):
        found.search("error text", f"{error} {error!r}", canaries)
        assert "28P01" in str(error)
    for result in results:
        found.search("handler result", result, canaries)
    for record in caplog.records:
        found.search("log line", logging.Formatter("%(message)s %(exc_info)s").format(record) + str(record.__dict__),
                     canaries)
    assert not found.leaks, found.leaks
    for kind in ("error text", "handler result", "log line"):
        assert found.searched[kind] > 0, (kind, found.searched)
