"""The HTTPS front door for tests: Debian's nginx running the shipped site
(deploy/nginx/gpulab.conf) rendered for a free port, in front of a hub's proxy, with a
certificate from a CA the test makes (:func:`tests.support.tls.make_ca`)."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from .ports import free_port
from .tls import Pki

REPO = Path(__file__).resolve().parents[2]
NGINX = Path("/usr/sbin/nginx")
SITE = REPO / "deploy" / "nginx" / "gpulab.conf"


def spki(cert: Path) -> str:
    """base64 of the SHA-256 of a certificate's SubjectPublicKeyInfo: what Chromium's
    --ignore-certificate-errors-spki-list takes to trust that one certificate."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    key = x509.load_pem_x509_certificate(cert.read_bytes()).public_key()
    der = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


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
    pki: Pki
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
                "CERT": str(self.pki.cert),
                "KEY": str(self.pki.key),
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
