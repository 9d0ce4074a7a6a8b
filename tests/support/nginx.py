"""The HTTPS front door for tests: a CA of the test's own, a server certificate it signed for
127.0.0.1 and localhost, and Debian's nginx running the shipped site (deploy/nginx/gpulab.conf)
rendered for a free port, in front of a hub's proxy."""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from .ports import free_port

REPO = Path(__file__).resolve().parents[2]
NGINX = Path("/usr/sbin/nginx")
SITE = REPO / "deploy" / "nginx" / "gpulab.conf"


@dataclass(frozen=True)
class TestCertificates:
    """A CA's certificate, and a server certificate (full chain) and key it signed."""

    ca: Path
    cert: Path
    key: Path
    #: base64 of the SHA-256 of the server key's SubjectPublicKeyInfo: what Chromium's
    #: --ignore-certificate-errors-spki-list takes to trust this one certificate
    spki: str


def make_certificates(directory: Path, names=("localhost",), ips=("127.0.0.1",)):
    """A fresh CA and a server certificate for ``names`` and ``ips``, written in ``directory``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpulab test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans = [x509.DNSName(n) for n in names] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    paths = TestCertificates(
        ca=directory / "ca.pem",
        cert=directory / "server-chain.pem",
        key=directory / "server-key.pem",
        spki=base64.b64encode(
            hashlib.sha256(
                key.public_key().public_bytes(
                    serialization.Encoding.DER,
                    serialization.PublicFormat.SubjectPublicKeyInfo,
                )
            ).digest()
        ).decode(),
    )
    paths.ca.write_bytes(ca.public_bytes(pem))
    paths.cert.write_bytes(cert.public_bytes(pem) + ca.public_bytes(pem))
    paths.key.touch(mode=0o600)
    paths.key.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


def render_site(values: dict[str, str], template: str | None = None) -> str:
    """The shipped site with its ``@NAME@`` placeholders replaced; every one must be given."""
    text = SITE.read_text() if template is None else template
    # the comments name the placeholders too: only the directives' must all be filled
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    wanted = set(re.findall(r"@([A-Z_]+)@", body))
    missing = wanted - set(values)
    assert not missing, f"no value for the site's placeholders {sorted(missing)}"
    for name, value in values.items():
        text = text.replace(f"@{name}@", value)
    return text


@dataclass
class FrontDoor:
    """nginx with the shipped site, TLS on ``https_port`` and the redirect on ``http_port``
    (both on 127.0.0.1), in front of the hub's proxy at ``hub_address`` (host:port)."""

    workdir: Path
    certificates: TestCertificates
    hub_address: str
    https_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.https_port}"

    def start(self, timeout: float = 20) -> FrontDoor:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for temp in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (self.workdir / "tmp" / temp).mkdir(parents=True, exist_ok=True)
        site = render_site(
            {
                "SERVER_NAME": "127.0.0.1 localhost",
                "HTTPS_LISTEN": f"127.0.0.1:{self.https_port}",
                "HTTP_LISTEN": f"127.0.0.1:{self.http_port}",
                "HTTPS_PORT": f":{self.https_port}",
                "CERT": str(self.certificates.cert),
                "KEY": str(self.certificates.key),
                "HUB_ADDRESS": self.hub_address,
                "MAX_BODY": "1g",
            }
        )
        (self.workdir / "gpulab.conf").write_text(site)
        w = self.workdir
        temps = "\n".join(
            f"    {kind}_temp_path {w}/tmp/{name};"
            for kind, name in (
                ("client_body", "body"),
                ("proxy", "proxy"),
                ("fastcgi", "fastcgi"),
                ("uwsgi", "uwsgi"),
                ("scgi", "scgi"),
            )
        )
        (w / "nginx.conf").write_text(
            ("user root;\n" if os.geteuid() == 0 else "")
            + f"""worker_processes 1;
pid {w}/nginx.pid;
error_log {w}/error.log info;
events {{ worker_connections 512; }}
http {{
    access_log {w}/access.log;
{temps}
    include {w}/gpulab.conf;
}}
"""
        )
        log = open(w / "nginx.out", "ab")  # noqa: SIM115 (handed to nginx)
        self.proc = subprocess.Popen(
            [str(NGINX), "-p", str(w), "-c", str(w / "nginx.conf"), "-g", "daemon off;"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited {self.proc.returncode}:\n{self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.https_port), timeout=1):
                    return self
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"nginx did not listen in {timeout} s:\n{self.log()}")

    def log(self) -> str:
        return "\n".join(
            p.read_text(errors="replace")[-4000:]
            for p in (self.workdir / "nginx.out", self.workdir / "error.log")
            if p.exists()
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # nginx's fast shutdown: open websockets are cut
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)  # its workers too (its own group)
                self.proc.wait(5)
