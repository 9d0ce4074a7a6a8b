"""An object store behind TLS with a private CA, as sites run MinIO or Ceph's RGW: Debian's
nginx (scripts/ensure-nginx.sh) terminating TLS in front of an S3-speaking server, with a
certificate for 127.0.0.1 from a CA made here (the ``cryptography`` package).

- :func:`make_ca`: a CA and a server certificate signed by it, as PEM files.
- :class:`TlsProxy`: nginx on a free port, serving https:// with that certificate and passing
  every request to ``upstream`` (plain HTTP on loopback).
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .ports import free_port

NGINX = Path("/usr/sbin/nginx")


def nginx_missing() -> str | None:
    """What of nginx is missing on this machine, or None."""
    if not NGINX.exists():
        return f"{NGINX} is missing; run scripts/ensure-nginx.sh"
    return None


@dataclass(frozen=True)
class Pki:
    """The PEM files of a test CA and of a server certificate it signed."""

    ca: Path  # the CA's certificate: what a client is given as its CA bundle
    cert: Path  # the server's certificate
    key: Path  # the server's private key


def _name(common: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpulab tests"),
            x509.NameAttribute(NameOID.COMMON_NAME, common),
        ]
    )


def make_ca(directory: Path, host: str = "127.0.0.1") -> Pki:
    """A CA ("gpulab test CA") and a certificate for ``host`` (an IP address) signed by it."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("gpulab test CA")
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(host))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]), False
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pki = Pki(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    pki.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pki.key.touch(mode=0o600)
    pki.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return pki


@dataclass
class TlsProxy:
    """nginx terminating TLS on 127.0.0.1:``port`` for ``upstream`` (``http://host:port``):
    ``start()`` writes its configuration under ``workdir`` and waits until it listens."""

    workdir: Path
    pki: Pki
    upstream: str
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def _config(self) -> Path:
        w = self.workdir
        for d in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (w / d).mkdir(parents=True, exist_ok=True)
        conf = w / "nginx.conf"
        conf.write_text(
            f"""
daemon off;
worker_processes 1;
pid {w}/nginx.pid;
error_log {w}/error.log info;
{"user root;" if os.geteuid() == 0 else ""}
events {{ worker_connections 256; }}
http {{
    access_log {w}/access.log;
    client_body_temp_path {w}/body;
    proxy_temp_path {w}/proxy;
    fastcgi_temp_path {w}/fastcgi;
    uwsgi_temp_path {w}/uwsgi;
    scgi_temp_path {w}/scgi;
    client_max_body_size 0;
    server {{
        listen 127.0.0.1:{self.port} ssl;
        ssl_certificate {self.pki.cert};
        ssl_certificate_key {self.pki.key};
        location / {{
            proxy_pass {self.upstream};
            proxy_http_version 1.1;
            proxy_set_header Host $http_host;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""
        )
        return conf

    def start(self, timeout: float = 20) -> TlsProxy:
        conf = self._config()
        log = open(self.workdir / "nginx.out", "ab")  # noqa: SIM115 (handed to nginx)
        self.proc = subprocess.Popen(
            [str(NGINX), "-p", str(self.workdir), "-c", str(conf), "-e", "stderr"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited {self.proc.returncode}:\n{self.log()}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 1),
            ):
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"nginx did not listen on {self.port}:\n{self.log()}")

    def log(self) -> str:
        parts = []
        for name in ("nginx.out", "error.log"):
            with contextlib.suppress(OSError):
                parts.append((self.workdir / name).read_text(errors="replace"))
        return "\n".join(parts)[-4000:]

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        proc.terminate()  # nginx's fast shutdown
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> TlsProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
