"""Fault injection: the real gpulab service is SIGKILLed at each step of a job's life and
started again; then the platform's invariants are checked against the database, the engine
and the object store.

The service runs standalone here (``python -m gpulab.service``, no hub): its supervisor is
what acts on jobs, and jobs are submitted straight into its database, so that each kill and
restart costs about a second. ``GPULAB_FAULT_FILE`` names a file holding one point
(``transition:RUNNING``, ``engine:start``, ...); the service kills itself with SIGKILL the
first time it crosses it (``gpulab/jobs/faults.py``).

Invariants (docs/reliability.md): every job ends in a terminal state; its command ran as
many times as its story says (once, or once more per auto-restart or preemption, never more);
what it wrote is in the object store; no GPU stays booked and no device was booked twice; no
container, volume or sync helper is left without a record.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.docker]

REPO = Path(__file__).resolve().parents[2]
TERMINAL = {"DONE", "FAILED", "ERROR", "INTERRUPTED", "SYNC_FAILED"}


class Service:
    """One standalone gpulab service process at a time on a fixed database and data dir."""

    def __init__(self, workdir: Path, instance: str, extra: str = ""):
        self.workdir, self.instance = workdir, instance
        self.data = workdir / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.config = workdir / "service_config.py"
        self.config.write_text(
            textwrap.dedent(
                f"""
                load_subconfig({str(REPO / "jupyterhub_config.py")!r})
                c.GpulabSettings.instance = {instance!r}
                c.GpulabSettings.gpu_devices = [{{"id": "0"}}, {{"id": "1"}}]
                c.GpulabSettings.gpu_mode = "env"
                # made-up GPUs on a runc engine: the start-up check would refuse them
                c.GpulabSettings.check_gpu_runtime = False
                c.GpulabSettings.supervisor_interval = 0.2
                c.GpulabSettings.preemption_grace = 2
                c.GpulabSettings.supervisor_lease_ttl = 2
                c.GpulabSettings.engine_retry_max = 2
                c.GpulabSettings.job_container_retention = 3600
                c.GpulabSettings.max_resources = {{"cpus": 2, "memory": "4G", "gpus": 2}}
                """
            )
            + extra
        )
        self.fault_file = workdir / "fault"
        self.procs: list[subprocess.Popen] = []
        self.log = workdir / "service.log"
        self._settings = None

    @property
    def settings(self):
        if self._settings is None:
            from gpulab.settings import GpulabSettings, load_config

            os.environ.setdefault("GPULAB_DATA_DIR", str(self.data))
            os.environ.setdefault("GPULAB_SITE_CONFIG", "")
            self._settings = GpulabSettings(config=load_config(str(self.config)))
        return self._settings

    def start(self, fault: str | None = None) -> subprocess.Popen:
        for stale in (self.fault_file, Path(str(self.fault_file) + ".fired")):
            stale.unlink(missing_ok=True)
        if fault:
            self.fault_file.write_text(fault)
        env = {
            **os.environ,
            "GPULAB_DATA_DIR": str(self.data),
            "GPULAB_SITE_CONFIG": "",
            "GPULAB_FAULT_FILE": str(self.fault_file),
            "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{_free_port()}",
            "JUPYTERHUB_API_URL": "http://127.0.0.1:9/hub/api",
            "JUPYTERHUB_API_TOKEN": "unused",
        }
        with open(self.log, "a") as out:
            out.write(f"\n===== start (fault: {fault}) =====\n")
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpulab.service", "--config", str(self.config)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
            )
        self.procs.append(proc)
        return proc

    def arm(self, fault: str) -> subprocess.Popen:
        """The service that is to cross ``fault``: the one the previous test left running
        (its recovered service, which holds the lease), told the point through its fault file,
        else a new one. (A new one per test waited for the lease of the previous test's, killed
        at its end, on top of its own start: ~3 s a test.)"""
        live = [p for p in self.procs if p.poll() is None]
        if len(live) != 1:
            self.stop_all()
            return self.start(fault)
        Path(str(self.fault_file) + ".fired").unlink(missing_ok=True)
        armed = self.workdir / "fault.new"
        armed.write_text(fault)
        armed.rename(self.fault_file)  # at once: the service reads the file at every point
        with open(self.log, "a") as out:
            out.write(f"\n===== armed (fault: {fault}) =====\n")
        return live[0]

    def fired(self) -> bool:
        return Path(str(self.fault_file) + ".fired").exists()

    def stop_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait(10)

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


def _free_port() -> int:
    from ..support.ports import free_port

    return free_port()


@pytest.fixture(scope="module")
def service(tmp_path_factory, images, docker_client):
    import secrets

    svc = Service(tmp_path_factory.mktemp("faults"), "tf" + secrets.token_hex(3))
    yield svc
    svc.stop_all()
    _remove_instance(docker_client, svc.instance)


def _remove_instance(client, instance: str) -> None:
    for c in client.containers.list(all=True, filters={"label": f"org.gpulab.instance={instance}"}):
        c.remove(force=True)
    for v in client.volumes.list(filters={"name": f"{instance}-"}):
        v.remove(force=True)


def _records(svc: Service):
    from gpulab.db import Database
    from gpulab.gpus.inventory import load_inventory
    from gpulab.gpus.ledger import GpuLedger
    from gpulab.jobs.records import JobRecords

    s = svc.settings
    db = Database(s.database_url)
    ledger = GpuLedger(db, s.instance, load_inventory(s.gpu_devices, False))
    return JobRecords(db, s.instance), ledger


def _submit(svc: Service, command: str, out_prefix: str, **extra) -> str:
    from gpulab.jobs.spec import parse_job_spec

    s = svc.settings
    raw = {
        "image": "gpulab/python:3.11",
        "command": ["sh", "-c", command],
        "resources": {"gpus": 1, "cpus": 0.5, "memory": "256M"},
        "volumes": [f"scratch@local/faults/{out_prefix}:/out:rw"],
        **extra,
    }
    spec = parse_job_spec(
        raw,
        catalog=s.catalog,
        flavors=s.flavor_map,
        limits=s.limits_for("fay", []),
        allowed_images=frozenset(s.allowed_images),
        storage=s.storage,
        user="fay",
        host_gpus=2,
        max_timeout=s.job_max_timeout,
    )
    jobs, _ = _records(svc)
    return jobs.create("fay", spec.to_json(), spec.name)["id"]


def _wait(svc: Service, job_id: str, states=TERMINAL, timeout: float = 60) -> dict:
    jobs, _ = _records(svc)
    deadline = time.monotonic() + timeout
    job = None
    while time.monotonic() < deadline:
        job = jobs.get(job_id)
        if job and job["state"] in states:
            return job
        time.sleep(0.1)
    raise TimeoutError(f"{job_id} not in {states}: {job and job['state']}\n{svc.tail()}")


def _store(svc: Service, prefix: str) -> Path:
    return svc.data / "objects" / "scratch" / "faults" / prefix


# one run, one line in runs.txt; then the result, written only at the end
RUN_ONCE = "echo run >> /out/runs.txt; sleep 1.5; echo done > /out/result.txt"
# fails on its first run, succeeds on the retry
FAIL_ONCE = (
    "echo run >> /out/runs.txt; sleep 1; "
    "if [ -e /out/failed ]; then echo done > /out/result.txt; else touch /out/failed; exit 3; fi"
)
# long enough for a preemption to land while it runs on a slow machine (it then runs again)
PREEMPTED = "echo run >> /out/runs.txt; sleep 5; echo done > /out/result.txt"
LONG = "echo run >> /out/runs.txt; trap 'echo term > /out/result.txt; exit 143' TERM; "
LONG += "sleep 30 & wait"


def _check_invariants(svc: Service, docker_client, expect: dict[str, tuple[str, int, str]]):
    """``expect``: job id -> (final state, runs of its command, content of result.txt)."""
    jobs, ledger = _records(svc)
    for job_id, (state, runs, result) in expect.items():
        job = _wait(svc, job_id, timeout=90)
        assert job["state"] == state, (job_id, job["state"], job["message"], svc.tail())
        prefix = job["spec"]["volumes"][0].split(":")[0].split("/")[-1]
        store = _store(svc, prefix)
        ran = (store / "runs.txt").read_text().count("run")
        assert ran == runs, (job_id, "ran", ran, "times; expected", runs)
        assert (store / "result.txt").read_text().strip() == result, job_id
        history = [e["state"] for e in job["history"] if e["kind"] == "transition"]
        assert history[-1] == state and history.count(state) == 1, history
    # nothing booked once everything ended
    assert ledger.allocations() == [], ledger.allocations()
    # every container of the instance has a record; no sync helper is left running
    known = jobs.ids()
    for c in docker_client.containers.list(
        all=True, filters={"label": f"org.gpulab.instance={svc.instance}"}
    ):
        assert c.labels.get("org.gpulab.kind") != "sync-helper", c.name
        assert c.labels.get("org.gpulab.job") in known, c.name


FAULTS = [
    # point, command, what to do once it runs, expected (state, runs, result)
    ("transition:INITIALIZING", RUN_ONCE, None, ("DONE", 1, "done")),
    ("helper:started", RUN_ONCE, None, ("DONE", 1, "done")),  # a pull's helper left running
    ("engine:pull", RUN_ONCE, None, ("DONE", 1, "done")),
    ("transition:PENDING", RUN_ONCE, None, ("DONE", 1, "done")),
    ("engine:create", RUN_ONCE, None, ("DONE", 1, "done")),
    ("engine:start", RUN_ONCE, None, ("DONE", 1, "done")),
    ("transition:RUNNING", RUN_ONCE, None, ("DONE", 1, "done")),
    ("transition:FINALIZING", RUN_ONCE, None, ("DONE", 1, "done")),
    ("engine:push", RUN_ONCE, None, ("DONE", 1, "done")),
    ("transition:DONE", RUN_ONCE, None, ("DONE", 1, "done")),
    ("transition:RESTARTING", FAIL_ONCE, None, ("DONE", 2, "done")),
    ("transition:INTERRUPTING", LONG, "interrupt", ("INTERRUPTED", 1, "term")),
    ("engine:stop", LONG, "interrupt", ("INTERRUPTED", 1, "term")),
    # a preemption: the job goes back to the queue and runs again (twice, by design)
    ("transition:INTERRUPTING", PREEMPTED, "preempt", ("DONE", 2, "done")),
    ("engine:remove", PREEMPTED, "preempt", ("DONE", 2, "done")),
    ("transition:QUEUED", PREEMPTED, "preempt", ("DONE", 2, "done")),
]


@pytest.mark.parametrize(
    ("point", "command", "action", "expected"),
    FAULTS,
    ids=[f"{p}-{a or 'run'}" for p, _, a, _ in FAULTS],
)
def test_sigkill_at_each_step_loses_nothing_and_runs_nothing_twice(
    service, docker_client, point, command, action, expected
):
    from gpulab.jobs.records import ACTIVE
    from gpulab.lifecycle import JobState

    jobs, _ = _records(service)
    tag = point.replace(":", "-").lower() + "-" + (action or "run")
    # something to pull, so that the pull really runs a sync helper
    _store(service, tag).mkdir(parents=True, exist_ok=True)
    (_store(service, tag) / "input.txt").write_text("input\n")
    proc = service.arm(point)
    extra = {"retries": 1} if command is FAIL_ONCE else {}
    job_id = _submit(service, command, tag, **extra)
    if action:
        _wait(service, job_id, {"RUNNING"})
        time.sleep(0.3)
        jobs.ask(job_id, action, states=ACTIVE - {JobState.FINALIZING})
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL and service.fired(), service.tail()
    service.start()  # a new service: it takes the lease once the dead one's has expired
    _check_invariants(service, docker_client, {job_id: expected})
    # (it runs on: the next test arms it)


def test_a_second_service_waits_in_standby_then_takes_over(service, docker_client):
    """Exactly one supervisor acts on a database: the second service started on it waits
    (standby) while the first renews its lease, and takes over once the first is gone."""
    from gpulab.db import Database
    from gpulab.jobs.supervisor.lease import SupervisorLease

    s = service.settings
    lease = SupervisorLease(Database(s.database_url), f"{s.instance}/supervisor", 2, "observer")

    def holder_pid(timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = lease.current()
            if now is not None and now.expires_in > 0:
                return int(now.holder.split(":")[1])
            time.sleep(0.1)
        raise TimeoutError(service.tail())

    service.stop_all()  # (the previous test's service, left running)
    deadline = time.monotonic() + 30  # the previous test's service's lease expires
    while (now := lease.current()) is not None and now.expires_in > 0:
        assert time.monotonic() < deadline, service.tail()
        time.sleep(0.1)
    first = service.start()
    assert holder_pid() == first.pid
    second = service.start()
    job = _submit(service, RUN_ONCE, "standby-1")
    _check_invariants(service, docker_client, {job: ("DONE", 1, "done")})
    assert holder_pid() == first.pid, "the second service took the lease of a live one"
    term = lease.current().term
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    job = _submit(service, RUN_ONCE, "standby-2")
    _check_invariants(service, docker_client, {job: ("DONE", 1, "done")})
    assert holder_pid() == second.pid and lease.current().term == term + 1
    log = service.log.read_text()
    assert "standby: the supervisor lease is held by" in log
    service.stop_all()
