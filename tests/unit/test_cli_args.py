"""CLI argument validation that needs no database (C3: bad input exits 2 with one line)."""

from __future__ import annotations

import pytest

from orphan_cleanup.cli.app import build_parser, main
from orphan_cleanup.cli.validation import validate_backend
from orphan_cleanup.core.errors import ConfigError

# Any database access would fail loudly with a connection error, not an argument error.
UNREACHABLE = "postgresql://postgres@127.0.0.1:1/postgres?sslmode=disable"


@pytest.fixture(autouse=True)
def no_database(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", UNREACHABLE)


def run_cli(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse exits through SystemExit
        return e.code


BAD_ARGS = [
    ("bad provider choice", ["backend", "add", "b1", "--provider", "azure", "--account", "123456789012",
                             "--regions", "us-east-1"], "azure"),
    ("missing account", ["backend", "add", "b1", "--provider", "aws", "--regions", "us-east-1"], "--account"),
    ("bad backend mode", ["backend", "add", "b1", "--provider", "aws", "--account", "123456789012",
                          "--regions", "us-east-1", "--mode", "nuke"], "nuke"),
    ("no command", [], "command"),
    ("unknown command", ["frobnicate"], "frobnicate"),
    ("backend without action", ["backend"], "action"),
    ("run without --backend", ["run"], "--backend"),
    ("run in mode off", ["run", "--backend", "b1", "--mode", "off"], "off"),
    ("unknown option", ["status", "--verbose"], "--verbose"),
]


@pytest.mark.parametrize("argv, mentions", [b[1:] for b in BAD_ARGS], ids=[b[0] for b in BAD_ARGS])
def test_bad_arguments_exit_2_with_one_line(argv, mentions, capsys):
    # when the CLI gets arguments it cannot accept
    code = run_cli(argv)
    out, err = capsys.readouterr()
    # then it exits 2 with one error line naming the problem, and nothing else
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("orphan-cleanup: error:")
    assert mentions in lines[0]
    assert "Traceback" not in err
    assert "database" not in err


def test_help_exits_0(capsys):
    assert run_cli(["--help"]) == 0
    assert "backend add" in capsys.readouterr().out


def parse_backend(*extra: str, provider: str = "aws", account: str = "123456789012",
                  regions: str = "us-east-1"):
    return build_parser().parse_args(["backend", "add", "b1", "--provider", provider, "--account", account,
                                      "--regions", regions, *extra])


GOOD_BACKENDS = [
    ("aws, one region", dict(), ["us-east-1"], {}),
    ("aws, regions with spaces", dict(regions="us-east-1, eu-west-1 ,us-gov-west-1"),
     ["us-east-1", "eu-west-1", "us-gov-west-1"], {}),
    ("gcp regions and zones", dict(provider="gcp", account="my-project-42", regions="us-central1,europe-west4-b"),
     ["us-central1", "europe-west4-b"], {}),
    ("settings object", dict(extra=("--settings", '{"role_arn": "arn:aws:iam::123456789012:role/x",'
                                                  ' "max_deletes": 5}')),
     ["us-east-1"], {"role_arn": "arn:aws:iam::123456789012:role/x", "max_deletes": 5}),
]


@pytest.mark.parametrize("kw, regions, settings", [g[1:] for g in GOOD_BACKENDS], ids=[g[0] for g in GOOD_BACKENDS])
def test_valid_backend(kw, regions, settings):
    extra = kw.pop("extra", ())
    assert validate_backend(parse_backend(*extra, **kw)) == (regions, settings)


BAD_BACKENDS = [
    ("aws account too short", dict(account="12345"), "account"),
    ("aws account with letters", dict(account="12345678901a"), "account"),
    ("gcp project with capitals", dict(provider="gcp", account="My-Project", regions="us-central1"), "project"),
    ("gcp project too short", dict(provider="gcp", account="abc", regions="us-central1"), "project"),
    ("empty region list", dict(regions=" , "), "region"),
    ("aws availability zone instead of region", dict(regions="us-east-1a"), "us-east-1a"),
    ("aws region in capitals", dict(regions="US-EAST-1"), "US-EAST-1"),
    ("duplicate region", dict(regions="us-east-1,us-east-1"), "region"),
    ("gcp region on aws", dict(regions="us-central1"), "us-central1"),
    ("aws region on gcp", dict(provider="gcp", account="my-project-42", regions="us-east-1"), "us-east-1"),
    ("settings not JSON", dict(extra=("--settings", "{nope")), "JSON"),
    ("settings not an object", dict(extra=("--settings", "[1, 2]")), "object"),
    ("settings with a bad value", dict(extra=("--settings", '{"max_delete_share": 2}')), "max_delete_share"),
]


@pytest.mark.parametrize("kw, mentions", [b[1:] for b in BAD_BACKENDS], ids=[b[0] for b in BAD_BACKENDS])
def test_invalid_backend(kw, mentions):
    extra = kw.pop("extra", ())
    with pytest.raises(ConfigError, match=mentions):
        validate_backend(parse_backend(*extra, **kw))


def test_bad_backend_id():
    args = build_parser().parse_args(["backend", "add", "bad id!", "--provider", "aws", "--account",
                                      "123456789012", "--regions", "us-east-1"])
    with pytest.raises(ConfigError, match="backend id"):
        validate_backend(args)
