"""Start and drive a real JupyterHub process (with its proxy and the gpulab service) for tests.

The hub loads the repository's own jupyterhub_config.py, then the test's overrides: its own
ports, data directory and gpulab instance name, so that tests never touch each other's (or a
developer's) containers.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import docker
import requests

from .ports import free_port

REPO = Path(__file__).resolve().parents[2]
CHP_BIN = REPO / ".build" / "node" / "node_modules" / ".bin"


class SpawnFailed(RuntimeError):
    pass


@dataclass
class Hub:
    workdir: Path
    extra_config: str = ""
    instance: str = field(default_factory=lambda: "t" + secrets.token_hex(4))
    admin_token: str = field(default_factory=lambda: secrets.token_hex(24))
    port: int = field(default_factory=free_port)
    hub_port: int = field(default_factory=free_port)
    service_port: int = field(default_factory=free_port)
    proxy_api_port: int = field(default_factory=free_port)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api(self) -> str:
        return f"{self.url}/hub/api"

    @property
    def config_file(self) -> Path:
        return self.workdir / "test_config.py"

    @property
    def log_file(self) -> Path:
        return self.workdir / "hub.log"

    def write_config(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(
            textwrap.dedent(
                f"""
                load_subconfig({str(REPO / "jupyterhub_config.py")!r})
                c.GpulabSettings.instance = {self.instance!r}
                c.JupyterHub.log_level = "DEBUG"
                c.JupyterHub.services.append({{"name": "test-admin", "api_token": {self.admin_token!r}}})
                c.JupyterHub.load_roles.append({{
                    "name": "test-admin",
                    "scopes": ["admin:users", "admin:servers", "admin:groups", "tokens",
                               "access:servers", "access:services", "read:users",
                               "custom:gpulab:admin"],
                    "services": ["test-admin"],
                }})
                """
            )
            + textwrap.dedent(self.extra_config)
        )

    def start(self, timeout: float = 60) -> Hub:
        self.write_config()
        env = {
            **os.environ,
            "GPULAB_PORT": str(self.port),
            "GPULAB_HUB_PORT": str(self.hub_port),
            "GPULAB_SERVICE_PORT": str(self.service_port),
            "GPULAB_PROXY_API_PORT": str(self.proxy_api_port),
            "GPULAB_DATA_DIR": str(self.workdir / "data"),
            "GPULAB_CONFIG_FILE": str(self.config_file),
            "PATH": f"{CHP_BIN}:{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
            **self.env,
        }
        log = open(self.log_file, "ab")  # noqa: SIM115 (handed to the hub process)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(self.config_file)],
            cwd=self.workdir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"hub exited {self.proc.returncode}:\n{self.tail()}")
            try:
                if requests.get(f"{self.api}/", timeout=1).ok:
                    self._wait_service(deadline)
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"hub did not answer in {timeout} s:\n{self.tail()}")

    def _wait_service(self, deadline: float) -> None:
        url = f"{self.url}/services/gpulab/api/health"
        while time.monotonic() < deadline:
            try:
                if requests.get(url, timeout=1).ok:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"gpulab service did not answer:\n{self.tail()}")

    def descendants(self) -> list[int]:
        """Every process below the hub (JupyterHub starts services in sessions of their own)."""
        children: dict[int, list[int]] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        out, todo = [], [self.proc.pid] if self.proc else []
        while todo:
            pid = todo.pop()
            for child in children.get(pid, []):
                out.append(child)
                todo.append(child)
        return out

    def service_pid(self) -> int:
        """The gpulab service's process (started by the hub)."""
        for pid in self.descendants():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"gpulab.service" in argv:
                return pid
        raise RuntimeError(f"no gpulab service process below the hub:\n{self.tail()}")

    def service_rss(self) -> int:
        """The gpulab service's resident memory, in bytes (its VmRSS)."""
        status = Path(f"/proc/{self.service_pid()}/status").read_text()
        kib = next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))
        return int(kib) * 1024

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Kill the hub and every process it started, as a service manager's cgroup kill would."""
        if self.proc and self.proc.poll() is None:
            for pid in [self.proc.pid, *self.descendants()]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            family = self.descendants()
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
            for pid in family:  # anything the hub left behind
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def remove_workloads(self) -> None:
        client = docker.from_env()
        label = f"org.gpulab.instance={self.instance}"
        for c in client.containers.list(all=True, filters={"label": label}):
            c.remove(force=True)
        for v in client.volumes.list():
            if v.name.startswith(self.instance + "-"):
                v.remove(force=True)
        # users' networks: the engine's address pools hold only about 30 bridges
        for n in client.networks.list(filters={"label": label}):
            with contextlib.suppress(docker.errors.APIError):
                n.remove()

    def tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # --- REST API ------------------------------------------------------------------------

    def request(self, method: str, path: str, token: str | None = None, **kw) -> requests.Response:
        headers = {"Authorization": f"token {token or self.admin_token}"}
        return requests.request(method, self.api + path, headers=headers, timeout=120, **kw)

    def create_user(self, name: str, admin: bool = False) -> str:
        """Create a user and return an API token of theirs."""
        r = self.request("POST", f"/users/{name}")
        assert r.status_code in (201, 409), r.text
        if admin:
            self.request("PATCH", f"/users/{name}", json={"admin": True}).raise_for_status()
        r = self.request("POST", f"/users/{name}/tokens", json={"note": "test"})
        r.raise_for_status()
        return r.json()["token"]

    def server_path(self, user: str, server: str) -> str:
        return f"/users/{user}/servers/{server}" if server else f"/users/{user}/server"

    def spawn(self, user: str, server: str, options: dict, token: str | None = None):
        return self.request(
            "POST", self.server_path(user, server), token=token, json={"user_options": options}
        )

    def server_model(self, user: str, server: str) -> dict | None:
        r = self.request("GET", f"/users/{user}")
        r.raise_for_status()
        return r.json().get("servers", {}).get(server)

    def wait_ready(self, user: str, server: str, timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            model = self.server_model(user, server)
            if model and model.get("ready"):
                return model
            if not model or not model.get("pending"):
                raise SpawnFailed(f"{user}/{server} is neither ready nor starting: {model}")
            time.sleep(0.2)
        raise TimeoutError(f"{user}/{server} not ready in {timeout} s:\n{self.tail()}")

    def wait_stopped(self, user: str, server: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            model = self.server_model(user, server)
            if model is None or (not model.get("ready") and not model.get("pending")):
                return
            time.sleep(0.2)
        raise TimeoutError(f"{user}/{server} did not stop in {timeout} s")

    def stop_server(self, user: str, server: str, remove: bool = False) -> None:
        body = {"remove": True} if remove else None
        r = self.request("DELETE", self.server_path(user, server), json=body)
        assert r.status_code in (202, 204), r.text
        if r.status_code == 202:
            self.wait_stopped(user, server)

    def wait_state(self, user: str, server: str, state: str, timeout: float = 60) -> dict:
        """Poll the service until the notebook reaches ``state``; returns the notebook."""
        deadline = time.monotonic() + timeout
        nb: dict = {}
        while time.monotonic() < deadline:
            r = self.notebook(user, server)
            if r.status_code == 200:
                nb = r.json()
                if nb["state"] == state:
                    return nb
            time.sleep(0.2)
        raise TimeoutError(f"{user}/{server} not {state} in {timeout} s: {nb}\n{self.tail()}")

    def notebook(self, user: str, server: str, token: str | None = None) -> requests.Response:
        """The gpulab service's view of a notebook: state and history."""
        return requests.get(
            f"{self.url}/services/gpulab/api/notebooks/{user}/{server}",
            headers={"Authorization": f"token {token or self.admin_token}"},
            timeout=30,
        )


def login(hub, user: str) -> requests.Session:
    """Log in through the hub's login form with the generated shared password."""
    passwords = dict(
        line.split("=", 1) for line in (hub.workdir / "data" / "passwords.txt").read_text().split()
    )
    s = requests.Session()
    s.get(f"{hub.url}/hub/login", timeout=30).raise_for_status()
    r = s.post(
        f"{hub.url}/hub/login",
        data={"username": user, "password": passwords["user"], "_xsrf": s.cookies["_xsrf"]},
        timeout=30,
    )
    assert r.ok and "jupyterhub-session-id" in s.cookies, r.text[-500:]
    return s
