"""`orphan-cleanup report` as an operator runs it (C3): a subprocess against a real Postgres
whose orphans rows the test wrote with known lives, so every figure has a true value:
orphan-hours to the second, cost to the cent, the percentiles, the breakdowns, the period's
clipping; the human table with its reason legend; the self-contained HTML page."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from orphan_cleanup.core.costs import HOURS_PER_MONTH
from orphan_cleanup.ledger.db import Database

PRICES = {"instance_hour": {"m5.large": 0.10, "p3.2xlarge": 3.06}, "disk_gb_month": 0.08, "address_hour": 0.005}
H = timedelta(hours=1)
D = timedelta(days=1)
M = timedelta(minutes=1)
REPORT_KEYS = {"since", "until", "orphans_found", "orphans_deleted", "orphans_open", "orphan_hours", "cost",
               "by_reason", "by_backend", "time_to_detect_seconds", "time_to_delete_seconds"}


def cli(db: Database, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORPHAN_CLEANUP_")}
    env.update(DATABASE_URL=db.info.url(), NO_COLOR="1")
    proc = subprocess.run([sys.executable, "-m", "orphan_cleanup", *args], env=env, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL, cwd=cwd)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def report(db: Database, *args: str) -> dict[str, Any]:
    proc = cli(db, "report", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert set(doc) == REPORT_KEYS
    return doc


class Ledger:
    """Backends and orphans rows written with SQL, their times relative to ``t`` (the
    database clock when the ledger was built)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        with db.connection() as conn:
            self.t: datetime = conn.run("SELECT oc_clock()")[0][0]
        self.n = 0

    def backend(self, backend_id: str, provider: str, prices: dict[str, Any] | None) -> None:
        with self.db.connection() as conn:
            conn.run("INSERT INTO backends (id, provider, account, regions, settings)"
                     " VALUES (:i, :p, '123456789012', '{us-east-1}', CAST(:s AS jsonb))", i=backend_id, p=provider,
                     s=json.dumps({"prices": prices} if prices else {}))

    def orphan(self, backend_id: str, reason: str, *, since: timedelta | None, first_seen: timedelta,
               state: str = "deleted", deleted: timedelta | None = None, last_seen: timedelta | None = None,
               size: dict[str, Any] | None = None, verdict: str = "orphan") -> None:
        """An orphans row: times as offsets before ``t`` (``since`` None: a row older than
        migration 0018, as are ``deleted`` None on a deleted row and ``size`` None)."""
        self.n += 1
        ref = f"ref{self.n:09d}"
        seen = self.t - first_seen
        with self.db.connection() as conn:
            conn.run("INSERT INTO provider_refs (provider_ref, owner_id, owner_name) VALUES (:r, :o, :o)",
                     r=ref, o=f"inst-{self.n}")
            conn.run("INSERT INTO orphans (backend_id, group_key, provider_ref, region, primary_id, resources,"
                     " verdict, reason, state, first_seen, last_seen, orphan_since, deleted_at, size)"
                     " VALUES (:b, :k, :r, 'us-east-1', :p, '[]', :v, :reason, :s, :fs, :ls, :since, :del,"
                     " CAST(:size AS jsonb))",
                     b=backend_id, k=f"{ref}/us-east-1/i-{self.n}", r=ref, p=f"i-{self.n}", v=verdict, reason=reason,
                     s=state, fs=seen, ls=self.t - last_seen if last_seen is not None else seen,
                     since=None if since is None else self.t - since,
                     **{"del": None if deleted is None else self.t - deleted},
                     size=None if size is None else json.dumps(size))


def per_hour(size: dict[str, Any]) -> float:
    return (PRICES["instance_hour"].get(size.get("instance_type"), 0.0)
            + size.get("disk_gb", 0) * PRICES["disk_gb_month"] / HOURS_PER_MONTH
            + len(size.get("addresses", ())) * PRICES["address_hour"])


SMALL = {"instance_type": "m5.large", "disk_gb": 100, "addresses": ["3.3.3.3"]}
GPU = {"instance_type": "p3.2xlarge"}


@pytest.fixture
def ledger(db: Database) -> Ledger:
    """Two backends, one priced; orphans whose lives the test knows (offsets before t):

    1 owner_terminated  aws-a  became one 10d, first listed 5m later, deleted 3h after it became one
    2 owner_deleted     aws-a  5d, listed 10m later, deleted after 2h (a GPU VM)
    3 primary_mismatch  aws-a  3d, listed 1h later, open: alive to now
    4 primary_mismatch  aws-a  40d, listed 20m later, deleted 29d ago: 24h inside a 30d period
    5 owner_terminated  aws-a  60d to 50d: outside the period
    6 owner_deleted     aws-a  a row older than the report's columns: first listed 2d, deleted (last seen) 30m later
    7 protected         aws-a  not an orphan: never counted
    8 owner_terminated  aws-a  7d, listed 2m later, gone (not listed again) 1h after it became one, an address only
    9 owner_soft_deleted gcp-b (no prices) 1d, listed 1m later, deleted after 4h
    """
    lg = Ledger(db)
    lg.backend("aws-a", "aws", PRICES)
    lg.backend("gcp-b", "gcp", None)
    lg.orphan("aws-a", "owner_terminated", since=10 * D, first_seen=10 * D - 5 * M, deleted=10 * D - 3 * H,
              size=SMALL)
    lg.orphan("aws-a", "owner_deleted", since=5 * D, first_seen=5 * D - 10 * M, deleted=5 * D - 2 * H, size=GPU)
    lg.orphan("aws-a", "primary_mismatch", since=3 * D, first_seen=3 * D - H, state="open", last_seen=timedelta(0),
              size={"instance_type": "m5.large"})
    lg.orphan("aws-a", "primary_mismatch", since=40 * D, first_seen=40 * D - 20 * M, deleted=29 * D,
              size={"instance_type": "m5.large"})
    lg.orphan("aws-a", "owner_terminated", since=60 * D, first_seen=60 * D - M, deleted=50 * D, size=SMALL)
    lg.orphan("aws-a", "owner_deleted", since=None, first_seen=2 * D, last_seen=2 * D - 30 * M)
    lg.orphan("aws-a", "suspected_copy", since=3 * D, first_seen=3 * D, state="protected", verdict="protected",
              size=GPU)
    lg.orphan("aws-a", "owner_terminated", since=7 * D, first_seen=7 * D - 2 * M, state="gone",
              last_seen=7 * D - H, size={"addresses": ["1.2.3.4"]})
    lg.orphan("gcp-b", "owner_soft_deleted", since=D, first_seen=D - M, deleted=D - 4 * H,
              size={"instance_type": "n1-standard-1"})
    return lg


def by(rows: list[dict[str, Any]], key: str) -> dict[str, dict[str, Any]]:
    return {r[key]: r for r in rows}


def test_the_report_of_a_known_ledger_gives_its_true_figures(ledger):
    # when the operator asks for the last 30 days
    doc = report(ledger.db)

    # then the period is 30 days up to the database clock, after the ledger was built
    since, until = datetime.fromisoformat(doc["since"]), datetime.fromisoformat(doc["until"])
    assert until - since == 30 * D and until >= ledger.t
    # found: first listed in the period (1, 2, 3, 6, 8, 9); deleted in it (1, 2, 4, 6, 9); open now (3)
    assert (doc["orphans_found"], doc["orphans_deleted"], doc["orphans_open"]) == (6, 5, 1)
    # hours: 3 + 2 + (72 + d) + (24 - d) + 0.5 + 1 + 4, d being the time from building to reporting:
    # the open orphan gains what the clipped one loses, so the sum is exact to the second
    assert doc["orphan_hours"] == pytest.approx(106.5, abs=1 / 3600)
    reasons = by(doc["by_reason"], "reason")
    assert set(reasons) == {"owner_terminated", "owner_deleted", "primary_mismatch", "owner_soft_deleted"}
    assert reasons["primary_mismatch"]["count"] == 2
    assert reasons["primary_mismatch"]["orphan_hours"] == pytest.approx(96, abs=1 / 3600)
    assert reasons["primary_mismatch"]["cost"] == pytest.approx(96 * 0.10, abs=0.005)
    assert (reasons["owner_terminated"]["count"], reasons["owner_terminated"]["orphan_hours"]) == (2, 4.0)
    assert reasons["owner_terminated"]["cost"] == pytest.approx(3 * per_hour(SMALL) + 0.005, abs=0.005)
    # a row older than the report's columns counts from its first listing to its last, unpriced (no size)
    assert (reasons["owner_deleted"]["count"], reasons["owner_deleted"]["orphan_hours"]) == (2, 2.5)
    assert reasons["owner_deleted"]["cost"] == pytest.approx(2 * 3.06, abs=0.005)
    # an orphan of a backend without prices has hours and no cost
    assert reasons["owner_soft_deleted"] == {"reason": "owner_soft_deleted", "count": 1, "orphan_hours": 4.0,
                                             "cost": None}
    total = 3 * per_hour(SMALL) + 2 * 3.06 + 96 * 0.10 + 0.005
    assert doc["cost"] == pytest.approx(total, abs=0.005)
    backends = by(doc["by_backend"], "backend")
    assert backends["gcp-b"] == {"backend": "gcp-b", "count": 1, "orphan_hours": 4.0, "cost": None}
    assert backends["aws-a"]["count"] == 6 and backends["aws-a"]["cost"] == pytest.approx(total, abs=0.005)
    assert backends["aws-a"]["orphan_hours"] == pytest.approx(102.5, abs=1 / 3600)
    # detect: 300, 600, 3600, 0 (an older row: first listing), 120, 60 s; delete: 3h, 2h, 11d, 30m, 4h
    assert doc["time_to_detect_seconds"] == {"p50": 210.0, "p90": 2100.0}
    assert doc["time_to_delete_seconds"] == {"p50": 10800.0, "p90": 14400 + 0.6 * (950400 - 14400)}


def test_one_backend_and_a_short_period_are_clipped(ledger):
    # one backend: its own orphans only; without a price table, no cost
    doc = report(ledger.db, "--backend", "gcp-b")
    assert (doc["orphans_found"], doc["orphans_deleted"], doc["orphans_open"], doc["orphan_hours"], doc["cost"]) == (
        1, 1, 0, 4.0, None)
    assert doc["time_to_detect_seconds"] == {"p50": 60.0, "p90": 60.0}
    assert doc["time_to_delete_seconds"] == {"p50": 14400.0, "p90": 14400.0}

    # the last 2 hours: only the open orphan, for exactly those 2 hours (both ends move with now)
    doc = report(ledger.db, "--since", "2h")
    assert (doc["orphans_found"], doc["orphans_deleted"], doc["orphans_open"]) == (0, 0, 1)
    assert doc["orphan_hours"] == pytest.approx(2.0, abs=1 / 3600)
    assert doc["cost"] == pytest.approx(0.20, abs=0.005)
    assert doc["time_to_detect_seconds"] == {"p50": None, "p90": None}

    # the last 3 days and 30 minutes: orphan 9 (4h), 6 (30m) and 3 (all of its ~72h)
    doc = report(ledger.db, "--since", "4410m", "--backend", "aws-a")
    assert doc["orphans_found"] == 2 and doc["orphans_deleted"] == 1
    assert doc["orphan_hours"] == pytest.approx(72.5, abs=60 / 3600)  # 72 h and the seconds the run took

    # nothing in an empty period of a backend; an unknown backend is bad input
    assert cli(ledger.db, "report", "--backend", "nope").returncode == 2
    assert cli(ledger.db, "report", "--since", "yesterday").returncode == 2


def test_the_table_names_the_figures_and_what_each_reason_stands_for(ledger):
    proc = cli(ledger.db, "report")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "6 found, 5 deleted, 1 open now; 106.5 orphan-hours" in out
    assert "time to detect: p50 3m, p90 35m; time to delete: p50 3h, p90 6d" in out
    assert re.search(r"primary_mismatch\s+2\s+96\.0\s+9\.60", out), out
    assert re.search(r"gcp-b\s+1\s+4\.0\s+-", out), out
    assert "what each reason stands for:" in out
    assert re.search(r"owner_deleted\s+the owner row was hard-deleted: a failed placeholder, a crash before the"
                     r" commit", out), out
    assert "a lost attempt" in out and "a termination that gave up" in out


class Page(HTMLParser):
    """What the test reads of the page: the rects of each svg, every src/href, the text."""

    def __init__(self) -> None:
        super().__init__()
        self.svg: str | None = None
        self.rects: dict[str, list[str]] = {}
        self.links: list[str] = []
        self.text: list[str] = []
        self._title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.links += [v or "" for k, v in attrs if k in ("src", "href", "xlink:href", "action")]
        if tag == "svg":
            self.svg = a.get("id") or "?"
            self.rects[self.svg] = []
        elif tag == "title" and self.svg is not None:
            self._title = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self.svg = None
        elif tag == "title":
            self._title = False

    def handle_data(self, data: str) -> None:
        if self._title and self.svg is not None:
            self.rects[self.svg].append(data)
        self.text.append(data)


def test_the_html_page_is_self_contained_and_draws_a_bar_per_day_and_reason(ledger, tmp_path):
    # given an orphan whose reason is markup (a platform's text is escaped, never markup)
    ledger.orphan("aws-a", "<script>alert(1)</script>", since=2 * H, first_seen=2 * H, deleted=H, size=GPU)
    target = tmp_path / "leaks.html"

    proc = cli(ledger.db, "report", "--since", "7d", "--json", "--html", str(target))

    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    html = target.read_text()
    assert "<script" not in html and "&lt;script&gt;" in html
    page = Page()
    page.feed(html)
    assert not [u for u in page.links if re.match(r"\s*(https?:)?//", u)], page.links
    assert "http://" not in html and "https://" not in html
    text = " ".join(page.text)
    for figure in (str(doc["orphans_found"]), f"{doc['orphan_hours']:,.1f}", f"{doc['cost']:,.2f}"):
        assert figure in text, figure
    # one rect per day and reason with an orphan alive that day: the period's days, from the ledger
    since, until = datetime.fromisoformat(doc["since"]), datetime.fromisoformat(doc["until"])
    lives = {  # reason: [became one, ended) as offsets before t (orphans 2, 3, 6, 8, 9 and the new one)
        "owner_deleted": [(5 * D, 5 * D - 2 * H), (2 * D, 2 * D - 30 * M)],
        "primary_mismatch": [(3 * D, -D)],  # open: to the end of the period
        "owner_terminated": [(7 * D, 7 * D - H)],
        "owner_soft_deleted": [(D, D - 4 * H)],
        "<script>alert(1)</script>": [(2 * H, H)],
    }
    expected = set()
    for reason, spans in lives.items():
        for start, end in spans:
            first, last = max(ledger.t - start, since).astimezone(UTC), min(ledger.t - end, until).astimezone(UTC)
            day = first.replace(hour=0, minute=0, second=0, microsecond=0)
            while day < last:
                expected.add(f"{day:%Y-%m-%d} {reason}")
                day += D
    drawn = {t.rsplit(":", 1)[0] for t in page.rects["orphans-chart"]}
    assert len(page.rects["orphans-chart"]) == len(drawn)  # one rect per day and reason
    assert drawn == expected
    assert page.rects["cost-chart"]  # priced: the cost chart is drawn too


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
        if path := shutil.which(name):
            return path
    return None


@pytest.mark.slow
def test_a_headless_browser_draws_the_chart(ledger, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium binary on PATH")
    # given the page of the known ledger
    target = tmp_path / "leaks.html"
    assert cli(ledger.db, "report", "--html", str(target)).returncode == 0
    source = Page()
    source.feed(target.read_text())
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}"]

    # when Chromium loads it (no network needed: the page has no external reference)
    dom = subprocess.run([browser, *flags, "--dump-dom", target.as_uri()], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    shot = tmp_path / "shot.png"
    subprocess.run([browser, *flags, f"--screenshot={shot}", "--window-size=1000,1400", target.as_uri()],
                   capture_output=True, timeout=120, check=True)

    # then its DOM holds the chart's bars, and the screenshot shows them in the bars' colors
    drawn = Page()
    drawn.feed(dom)
    assert drawn.rects["orphans-chart"] == source.rects["orphans-chart"] != []
    from PIL import Image

    from orphan_cleanup.cli.report_html import PALETTE

    colors = {tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c in PALETTE}
    pixels = Image.open(shot).convert("RGB").getdata()
    assert sum(1 for p in pixels if p in colors) > 2000  # bars, not only the legend's swatches
