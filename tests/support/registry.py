"""A private image registry as a team runs one: Debian's docker-registry (distribution 2.8)
on a free loopback port, with TLS from a CA made here (tests/support/tls.py) and htpasswd
users (bcrypt, as the registry requires), and a tiny image pushed to it.

- :class:`PrivateRegistry`: start, wait until it answers 401 over TLS, stop.
- :func:`tiny_image`: an image of a few MB made from this machine's own ``dash`` and C
  library (no base image, no network): enough for a job's runner (``/bin/sh``).
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import requests

from .ports import free_port
from .tls import make_ca

with warnings.catch_warnings():  # deprecated (gone in 3.13), and enough for a test's users
    warnings.simplefilter("ignore", DeprecationWarning)
    # the registry's htpasswd needs bcrypt hashes: glibc's crypt makes them
    import crypt

REGISTRY = "docker-registry"


def registry_missing() -> str | None:
    if shutil.which(REGISTRY) is None:
        return "docker-registry is missing; run scripts/ensure-registry.sh"
    return None


@dataclass
class PrivateRegistry:
    directory: Path
    users: dict[str, str]
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> PrivateRegistry:
        d = self.directory
        pki = make_ca(d / "pki")
        self.ca = pki.ca
        (d / "data").mkdir(parents=True, exist_ok=True)
        salt = crypt.mksalt(crypt.METHOD_BLOWFISH)
        (d / "htpasswd").write_text(
            "".join(f"{u}:{crypt.crypt(p, salt)}\n" for u, p in self.users.items())
        )
        (d / "config.yml").write_text(
            f"""version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {d / "data"}
http:
  addr: {self.host}
  tls:
    certificate: {pki.cert}
    key: {pki.key}
auth:
  htpasswd:
    realm: gpulab-tests
    path: {d / "htpasswd"}
"""
        )
        log = open(d / "registry.log", "wb")  # noqa: SIM115 (the registry's own)
        self.proc = subprocess.Popen(
            [REGISTRY, "serve", str(d / "config.yml")], stdout=log, stderr=log
        )
        deadline = time.monotonic() + 20
        while True:
            try:  # a registry with users asks who is there: 401, over TLS the CA vouches for
                r = requests.get(f"https://{self.host}/v2/", verify=str(self.ca), timeout=2)
                if r.status_code == 401:
                    return self
            except requests.RequestException:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the registry did not start: {(d / 'registry.log').read_text()}"
                )
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _libraries(binary: str) -> list[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    libs = []
    for line in out.splitlines():
        parts = line.split()
        path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0]
        if path.startswith("/"):
            libs.append(path)
    return libs


def tiny_image(client, repository: str, tag: str) -> str:
    """Import an image named ``repository:tag`` holding /bin/sh (this machine's dash) and the
    C library it needs, /tmp and /workspace; return its name."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in ("bin", "tmp", "workspace", "lib", "lib64", "lib/x86_64-linux-gnu", "proc"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d in ("tmp", "workspace") else 0o755
            tar.addfile(info)
        dash = shutil.which("dash") or "/bin/dash"
        tar.add(dash, "bin/sh")
        for lib in _libraries(dash):
            tar.add(str(Path(lib).resolve()), lib.lstrip("/"))
    client.api.import_image_from_data(buf.getvalue(), repository=repository, tag=tag)
    return f"{repository}:{tag}"


def push(client, image: str, auth: dict[str, str]) -> None:
    repository, _, tag = image.rpartition(":")
    for event in client.api.push(repository, tag, auth_config=auth, stream=True, decode=True):
        if event.get("error"):
            raise RuntimeError(f"push of {image} failed: {event['error']}")
