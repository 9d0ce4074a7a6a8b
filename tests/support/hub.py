"""Start and drive a real JupyterHub process (with its proxy and the gpulab service) for tests.

Tests get hubs from the ``hub_with(config)`` fixture (tests/conftest.py), which keeps them in
a :class:`HubPool`: one running hub per configuration, shared by the modules that ask for it.
Whenever the pool stops a hub it reads the hub's log (the gpulab service writes to the same
file) and fails on any traceback there that :data:`ALLOWED_TRACEBACKS` does not excuse.

The hub loads the repository's own jupyterhub_config.py, then the test's overrides: its own
ports, data directory and gpulab instance name, so that tests never touch each other's (or a
developer's) containers.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import sys
import textwrap
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path

import docker
import requests

from .ports import free_port

REPO = Path(__file__).resolve().parents[2]
CHP_BIN = REPO / ".build" / "node" / "node_modules" / ".bin"


def _interruptible() -> None:
    """The hub and what it starts obey SIGINT as they would under a service manager, even when
    the tests run with SIGINT ignored (``nohup``, ``cmd &`` in a script): the hub stops its
    managed services with SIGINT, and jupyterhub-idle-culler, started ignoring it, held the
    hub's shutdown 10 s, long enough for JupyterHub's service health check to read the gpulab
    service's server after its stop had removed it (a traceback in the hub's log)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class SpawnFailed(RuntimeError):
    pass


#: what marks an unexpected error in a hub's or the gpulab service's log
ERROR_MARKERS = (
    "Traceback (most recent call last)",
    "Unhandled error",
    "can't be used in 'await' expression",
)

#: tracebacks a test provokes on purpose: (a regular expression found in the log block, why
#: it is expected). Keep it short: every other traceback fails the test run.
ALLOWED_TRACEBACKS: list[tuple[str, str]] = [
    (
        r"HTTPError: HTTP 400: .*\(Invalid notebook options: ",
        "a spawn form or request with invalid options (tests/browser/test_pages.py and others "
        "assert the 400 and its message): JupyterHub logs the refusal with its traceback",
    ),
]


#: JupyterHub's own races while it shuts down, excused only after its "initiating shutdown"
#: line (and before it runs again): (a regular expression found in the log block, why).
SHUTDOWN_RACES: list[tuple[str, str]] = [
    (
        r"check_services_health(.|\n)*AttributeError: 'NoneType' object has no attribute 'proto'",
        "JupyterHub 5's cleanup deletes a managed service's server row before the service has "
        "stopped; its periodic health check (every 60 s) that falls in that window reads the "
        "row as None (jupyterhub/app.py check_services_health; seen when a hub's 60 s tick "
        "came 0.3 s into its gpulab service's stop)",
    ),
]


#: a job's states once it ended
ENDED = ("DONE", "FAILED", "ERROR", "INTERRUPTED", "SYNC_FAILED")


class HubLogErrors(AssertionError):
    """A hub's log holds tracebacks that no test provoked on purpose."""


def log_problems(text: str, allowed=ALLOWED_TRACEBACKS, races=SHUTDOWN_RACES) -> list[str]:
    """The blocks of ``text`` (a hub's log) that show an unexpected error: each marker line
    with the log record it belongs to and the traceback lines after it, less the allowed (and
    less the shutdown races, between a shutdown and the next start)."""
    lines = text.splitlines()
    blocks, i, shutting_down = [], 0, False
    while i < len(lines):
        if "initiating shutdown" in lines[i]:
            shutting_down = True
        elif "JupyterHub is now running" in lines[i]:
            shutting_down = False
        if not any(m in lines[i] for m in ERROR_MARKERS):
            i += 1
            continue
        start = i
        while start > 0 and not lines[start].startswith("[") and i - start < 5:
            start -= 1  # the record's header line ([E 2026-... JupyterHub ...])
        end = i + 1
        while end < len(lines) and not lines[end].startswith("[") and end - i < 80:
            end += 1
        block = "\n".join(lines[start:end])
        excused = allowed + races if shutting_down else allowed
        if not any(re.search(pattern, block) for pattern, _ in excused):
            blocks.append(block)
        i = end
    return blocks


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
    #: the command that starts the hub (default: jupyterhub -f config_file with this Python);
    #: it is told the config file by GPULAB_CONFIG_FILE too (scripts/serve.sh reads that)
    argv: list[str] | None = None
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
                # the tests' GPUs are made up, on an engine without the NVIDIA runtime: no
                # start-up refusal of their gpu_mode (a test of that check turns it on)
                c.GpulabSettings.check_gpu_runtime = False
                # a home's push costs every stop a helper run: kept only where a test asks
                # (test_notebook_data.py)
                c.GpulabSettings.home_sync = False
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

    def use_site_file(self, text: str) -> Path:
        """Give this hub (before its start) a site file, as an installation's
        /etc/gpulab/gpulab_config.py (GPULAB_SITE_CONFIG names it)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        site = self.workdir / "gpulab_config.py"
        site.write_text(textwrap.dedent(text))
        self.env["GPULAB_SITE_CONFIG"] = str(site)
        return site

    #: Hub.start calls in this test process, for the run's summary
    started: typing.ClassVar[int] = 0
    #: every hub started, for the check of the logs of those no pool retired (at the end)
    instances: typing.ClassVar[list[Hub]] = []
    #: its log was checked when it was retired
    checked: bool = field(default=False, init=False)

    def start(self, timeout: float = 60, service: bool = True) -> Hub:
        """Start the hub and wait until its API and (``service``) the gpulab service answer."""
        Hub.started += 1
        if self not in Hub.instances:
            Hub.instances.append(self)
        self.write_config()
        env = {
            **os.environ,
            "GPULAB_PORT": str(self.port),
            "GPULAB_HUB_PORT": str(self.hub_port),
            "GPULAB_SERVICE_PORT": str(self.service_port),
            "GPULAB_PROXY_API_PORT": str(self.proxy_api_port),
            "GPULAB_DATA_DIR": str(self.workdir / "data"),
            "GPULAB_CONFIG_FILE": str(self.config_file),
            # no site file unless a test names one (never this machine's /etc/gpulab)
            "GPULAB_SITE_CONFIG": "",
            "PATH": f"{CHP_BIN}:{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
            **self.env,
        }
        log = open(self.log_file, "ab")  # noqa: SIM115 (handed to the hub process)
        self.proc = subprocess.Popen(
            self.argv or [sys.executable, "-m", "jupyterhub", "-f", str(self.config_file)],
            cwd=self.workdir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_interruptible,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"hub exited {self.proc.returncode}:\n{self.tail()}")
            try:
                # with this hub's own token: a port taken by another process's hub answers
                # too, and must not pass for this one
                if requests.get(f"{self.api}/user", headers=self._auth(), timeout=1).ok:
                    if service:
                        self._wait_service(deadline)
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"hub did not answer in {timeout} s:\n{self.tail()}")

    def start_refused(self, timeout: float = 60) -> str:
        """Start a hub that must refuse to: wait until it has exited (failing if it still runs
        after ``timeout`` s, or exited 0), stop the proxy JupyterHub leaves running when it
        exits so (its pid file stays, as the trace that a proxy was started), and return what
        the hub and its service wrote to the log during this start. ``self.proc.returncode``
        is its exit status."""
        log_start = self.log_file.stat().st_size if self.log_file.exists() else 0
        deadline = time.monotonic() + timeout
        try:
            with contextlib.suppress(RuntimeError):  # "hub exited": before its API answered
                self.start(timeout=timeout, service=False)
            try:
                code = self.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(
                    f"the hub still runs {timeout} s after its start:\n{self.tail()}"
                ) from None
        finally:
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(self.proxy_pid_file.read_text()), signal.SIGTERM)
        with open(self.log_file, "rb") as f:
            f.seek(log_start)
            said = f.read().decode(errors="replace")
        assert code != 0, f"the hub exited 0:\n{said[-3000:]}"
        return said

    @property
    def proxy_pid_file(self) -> Path:
        """Where JupyterHub writes the pid of the proxy it started."""
        return self.workdir / "data" / "jupyterhub-proxy.pid"

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"token {self.admin_token}"}

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
        if (client.info().get("Swarm") or {}).get("ControlAvailable"):
            # a Swarm hub's workloads are services (first: their tasks hold the overlays)
            for svc in client.api.services(filters={"label": label}):
                with contextlib.suppress(docker.errors.NotFound):
                    client.api.remove_service(svc["ID"])
        for c in client.containers.list(all=True, filters={"label": label}):
            c.remove(force=True)
        for v in client.volumes.list():
            if v.name.startswith(self.instance + "-"):
                v.remove(force=True)
        # users' networks: the engine's address pools hold only about 30 bridges
        for n in client.networks.list(filters={"label": label}):
            with contextlib.suppress(docker.errors.APIError):
                n.remove()

    def log_problems(self) -> list[str]:
        """Unexpected tracebacks in this hub's log (the hub's and the gpulab service's)."""
        try:
            return log_problems(self.log_file.read_text(errors="replace"))
        except OSError:
            return []

    def check_log(self) -> None:
        """Fail with the offending lines when the log holds an unexpected traceback."""
        self.checked = True
        problems = self.log_problems()
        if problems:
            kept = self.keep_logs()
            raise HubLogErrors(
                f"{len(problems)} unexpected error(s) in {self.log_file}, kept as {kept} (add a test's "
                "deliberate one to ALLOWED_TRACEBACKS in tests/support/hub.py, with why):\n\n"
                + "\n\n".join(problems)
            )

    def keep_logs(self) -> Path:
        """A copy of this hub's logs in artifacts/hub-logs/ (pytest removes its old temporary
        directories, and a rare error needs its whole log to be understood)."""
        import shutil

        dest = REPO / "artifacts" / "hub-logs" / f"{self.workdir.parent.name}-{self.workdir.name}"
        dest.mkdir(parents=True, exist_ok=True)
        for log in self.workdir.glob("*.log"):
            shutil.copy2(log, dest / log.name)
        return dest

    def reset(self, timeout: float = 120) -> None:
        """Stop every user's servers and interrupt their unfinished jobs (between two test
        modules that share this hub): the next module starts with free GPUs and no workload."""
        r = self.request("GET", "/users")
        r.raise_for_status()
        service = f"{self.url}/services/gpulab/api"
        headers = {"Authorization": f"token {self.admin_token}"}
        unfinished: list[str] = []
        for user in r.json():
            for server, model in (user.get("servers") or {}).items():
                if model.get("ready") or model.get("pending"):
                    self.stop_server(user["name"], server)
            jobs = requests.get(
                f"{service}/jobs", params={"user": user["name"]}, headers=headers, timeout=60
            )
            if jobs.status_code != 200:
                continue
            for job in jobs.json().get("jobs", []):
                if job["state"] not in ENDED:
                    requests.post(
                        f"{service}/jobs/{job['id']}/interrupt", headers=headers, timeout=60
                    )
                    unfinished.append(job["id"])
        deadline = time.monotonic() + timeout
        for job_id in unfinished:  # ended: its GPUs are back in the ledger
            while time.monotonic() < deadline:
                r = requests.get(f"{service}/jobs/{job_id}", headers=headers, timeout=60)
                if r.status_code != 200 or r.json()["state"] in ENDED:
                    break
                time.sleep(0.3)
        client = docker.from_env()
        label = f"org.gpulab.instance={self.instance}"
        while time.monotonic() < deadline:
            if not client.containers.list(filters={"label": label, "status": "running"}):
                return
            time.sleep(0.5)
        raise TimeoutError(f"workloads of {self.instance} still running after a reset")

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

    def user_model(self, name: str) -> dict | None:
        """The hub's model of a user (admin flag, groups, roles), None if there is none."""
        r = self.request("GET", f"/users/{name}")
        if r.status_code == 404:
            return None
        r.raise_for_status()
        return r.json()

    def token_of(self, name: str) -> str:
        """A new API token of an existing user, with all of the user's rights."""
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


def login_form(hub, user: str, password: str) -> tuple[requests.Session, requests.Response]:
    """Post the hub's login form as a browser does; the session and the form's answer (a
    refused log-in is the form again, 403)."""
    s = requests.Session()
    s.get(f"{hub.url}/hub/login", timeout=30).raise_for_status()
    r = s.post(
        f"{hub.url}/hub/login",
        data={"username": user, "password": password, "_xsrf": s.cookies["_xsrf"]},
        timeout=30,
    )
    return s, r


def login(hub, user: str, password: str | None = None) -> requests.Session:
    """Log in through the hub's login form, with the generated shared password unless
    ``password`` is given."""
    if password is None:
        passwords = dict(
            line.split("=", 1)
            for line in (hub.workdir / "data" / "passwords.txt").read_text().split()
        )
        password = passwords["user"]
    s, r = login_form(hub, user, password)
    assert r.ok and "jupyterhub-session-id" in s.cookies, r.text[-500:]
    return s


def hub_groups(order: dict[str, int], wanted: dict[str, list[int]]) -> dict[str, str]:
    """Each test module's group: the modules that share a hub configuration (``wanted``:
    config text -> the run-order positions of the modules that ask for it; ``order``: module
    -> position), directly or through another module, form one group, named after its first
    module; a module that shares no hub is a group of its own."""
    parent = list(range(len(order)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for positions in wanted.values():
        for i in positions[1:]:
            a, b = root(positions[0]), root(i)
            parent[max(a, b)] = min(a, b)
    names = {i: name for name, i in order.items()}
    return {name: names[root(i)] for name, i in order.items()}


class HubPool:
    """The running hubs of a test session, for the ``hub_with`` fixture.

    A shared hub serves every module that asks for its configuration (the extra config's
    text). When a module ends, each shared hub it used is reset (its servers stopped, its jobs
    interrupted) if a later module will ask for that configuration (``wanted``: config text ->
    the run-order positions of the modules that ask for it, read at collection), and retired
    otherwise. A fresh hub (``fresh=True``, or ``start=False``) is the caller's alone: retired
    at the end of the test that made it, or of its module when a fixture made it. Retiring a
    hub stops it, removes its workloads and checks its log (:meth:`Hub.check_log`)."""

    def __init__(self, workdir, module, wanted: dict[str, list[int]], order: dict[str, int]):
        self._workdir = workdir  # name -> a new directory
        self._module = module  # () -> the running test module's name
        self._wanted = wanted
        self._order = order
        self.shared: dict[str, Hub] = {}
        self._users: dict[str, set[str]] = {}
        self._fresh: list[tuple[Hub, str | None]] = []  # (hub, the test's module or None)
        self.in_test = False

    def get(self, extra_config: str = "", fresh: bool = False, start: bool = True) -> Hub:
        module = self._module()
        if fresh or not start:
            hub = Hub(workdir=self._workdir("hub"), extra_config=extra_config)
            self._fresh.append((hub, "test" if self.in_test else module))
            return hub.start() if start else hub
        hub = self.shared.get(extra_config)
        if hub is not None and (hub.proc is None or hub.proc.poll() is not None):
            self._retire([self.shared.pop(extra_config)])  # stopped by a test: a new one
            hub = None
        if hub is None:
            hub = Hub(workdir=self._workdir("shared"), extra_config=extra_config).start()
            self.shared[extra_config] = hub
            self._users[extra_config] = set()
        self._users[extra_config].add(module)
        return hub

    def end_test(self) -> None:
        done = [h for h, owner in self._fresh if owner == "test"]
        self._fresh = [(h, owner) for h, owner in self._fresh if owner != "test"]
        self._retire(done)

    def end_module(self, module: str) -> None:
        done = [h for h, owner in self._fresh if owner in (module, "test")]
        self._fresh = [(h, owner) for h, owner in self._fresh if owner not in (module, "test")]
        here = self._order.get(module, -1)
        for config, hub in list(self.shared.items()):
            if module not in self._users[config]:
                continue
            if any(i > here for i in self._wanted.get(config, ())):
                hub.reset()
            else:
                done.append(self.shared.pop(config))
        self._retire(done)

    def close(self) -> None:
        done = [h for h, _ in self._fresh] + list(self.shared.values())
        self._fresh, self.shared = [], {}
        self._retire(done)

    @staticmethod
    def _retire(hubs: list[Hub]) -> None:
        problems = []
        for hub in hubs:
            hub.stop()
            hub.remove_workloads()
            try:
                hub.check_log()
            except HubLogErrors as e:
                problems.append(str(e))
        if problems:
            raise HubLogErrors("\n\n".join(problems))
