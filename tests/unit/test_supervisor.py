"""The job supervisor's transitions and failure paths, on the fake Runtime: no engine, no hub.

Each test drives one job through the supervisor's own code (its schedule pass, the job's
task, its ending) on a real SQLite database, with ``tests/support/fake_runtime.py`` playing
the engine: exits, refusals, lost and vanished workloads, a workload that will not die, a
push that fails. Paths the integration tests reach only through a real engine are here, and
some they cannot reach at all (a workload that outlives SIGKILL, a node lost for good).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest

from gpulab.db import Database
from gpulab.gpus.usage import DeviceUsage
from gpulab.jobs import actions, hang
from gpulab.jobs.refusals import Conflict, NotFound
from gpulab.jobs.spec import JobSpec
from gpulab.jobs.supervisor import ending, engine, housekeeping, life
from gpulab.jobs.supervisor.supervisor import JobSupervisor
from gpulab.lifecycle import JobState, utcnow
from gpulab.runtime.base import HelperSpec, NetworkUnavailable, StillRunning, WorkloadRefused
from gpulab.service.base import read
from gpulab.settings import GpulabSettings
from tests.conftest import run_async
from tests.support.fake_runtime import EngineError, FakeRuntime

J = JobState
INSTANCE = "t"
IMAGE = "gpulab/python:3.11"
#: the GPUs of the lab's host: its settings name them, and its fake engine reports them
GPUS = ("0", "1")


def job_spec(**kw) -> dict:
    """A stored job spec (what the records keep): one GPU, no retries, unless told."""
    gpus = kw.pop("gpus", 1)
    return {
        "name": None,
        "image": IMAGE,
        "command": ["python", "train.py"],
        "resources": {"cpus": 1.0, "memory": "1G", "gpus": gpus},
        "workers": 1,
        "priority": 50,
        "preemptible": False,
        "retries": 0,
        "timeout": 3600.0,
        **kw,
    }


class Engine(FakeRuntime):
    """The fake engine, which also removes a workload by the ID its listing gave."""

    async def remove(self, name: str) -> bool:
        return await super().remove(name.removeprefix("id-"))


class Lab:
    """One supervisor on the fake engine, with two GPUs and a fast pass."""

    def __init__(self, tmp_path, runtime: FakeRuntime | None = None, gpu_usage=None, **settings):
        self.rt = runtime or Engine(images={IMAGE}, gpus=GPUS)
        self.tmp = tmp_path
        store = tmp_path / "store"
        store.mkdir(exist_ok=True)
        settings.setdefault("supervisor_interval", 0.01)
        self.settings = GpulabSettings(
            instance=INSTANCE,
            gpu_devices=[{"id": g} for g in GPUS],
            discover_gpus=False,
            preemption_grace=0.0,
            engine_retry_max=0.05,
            job_container_retention=0.0,
            object_stores={"local": {"kind": "filesystem", "root": str(store)}},
            # out/, rw/: the user's to write; the rest read-only (what the dataset cache
            # shares)
            volume_grants=[
                {"store": "local", "bucket": "data", "prefix": "out"},
                {"store": "local", "bucket": "data", "prefix": "rw"},
                {"store": "local", "bucket": "data", "modes": ["ro"]},
            ],
            **settings,
        )
        self.db = Database(f"sqlite:///{tmp_path / 'gpulab.sqlite'}")
        if gpu_usage is not None:  # this host's readings, as the runtime gives them
            self.rt.gpu_readings = lambda: {"": gpu_usage()}
        self.sv = JobSupervisor(self.settings, self.db, self.rt, tmp_path / "logs", holder="me")
        self.ctx = self.sv.ctx

    def submit(self, **kw) -> str:
        return self.ctx.records.create("ann", job_spec(**kw), None, ())["id"]

    def job(self, job_id: str) -> dict:
        return self.ctx.records.get(job_id)

    def held(self) -> list[str]:
        """The devices the ledger has booked (for any workload)."""
        return sorted(a["device"] for a in self.ctx.ledger.allocations())

    def name(self, job_id: str) -> str:
        return self.ctx.container_name(job_id)

    async def place(self, job_id: str) -> None:
        """One schedule pass as the lease holder: the job is placed and its task started
        (on a cluster, on the nodes and GPUs the engine reports now)."""
        self.sv.leading.set()
        await self.sv.refresh_inventory()
        await self.sv.schedule()
        assert self.job(job_id)["state"] != J.QUEUED.value, self.job(job_id)["message"]

    async def until(self, job_id: str, *states: JobState, timeout: float = 5.0) -> dict:
        deadline = time.monotonic() + timeout
        wanted = {s.value for s in states}
        while True:
            job = self.job(job_id)
            if job["state"] in wanted:
                return job
            if time.monotonic() > deadline:
                raise AssertionError(f"{job_id}: {job['state']} ({job['message']}), not {wanted}")
            await asyncio.sleep(0.01)

    async def settle(self, job_id: str) -> None:
        """Wait for the job's task to end (it ended the job, or handed it on)."""
        task = self.sv.tasks.get(job_id)
        if task is not None:
            await asyncio.wait_for(asyncio.shield(task), 5)

    async def close(self) -> None:
        for task in list(self.sv.tasks.values()):
            task.cancel()
        await asyncio.gather(*self.sv.tasks.values(), return_exceptions=True)
        await self.ctx.datasets.close()


def reasons(job: dict) -> list[tuple[str, str]]:
    return [(e["state"], e["reason"]) for e in job["history"]]


def lab_run(tmp_path, test, **kw):
    """Run ``test(lab)`` on a loop of its own, cancelling the lab's tasks at the end."""

    async def main():
        lab = Lab(tmp_path, **kw)
        try:
            return await test(lab)
        finally:
            await lab.close()

    return run_async(main())


# --- a start and its ends ---------------------------------------------------------------------


def test_a_job_starts_runs_and_exit_0_is_done_with_its_gpu_released(tmp_path):
    async def test(lab: Lab):
        job_id = lab.submit()
        await lab.place(job_id)
        job = await lab.until(job_id, J.RUNNING)
        name = lab.name(job_id)
        assert job["container"] == name and lab.held() == ["0"]
        spec = lab.rt.workloads[name].spec
        assert spec.gpu_ids == ["0"] and spec.image == IMAGE
        assert spec.command == ["python", "train.py"]
        assert spec.env["GPULAB_JOB_ID"] == job_id
        assert spec.labels["org.gpulab.job"] == job_id
        lab.rt.workloads[name].logs = b"step 1\nstep 2\n"
        lab.rt.exits(name, 0)
        job = await lab.until(job_id, J.DONE)
        assert job["reason"] == "EXITED" and job["exit_code"] == 0
        assert lab.held() == []  # released once the engine said it ended
        assert lab.ctx.log_file(job_id).read_bytes() == b"step 1\nstep 2\n"
        assert [s for s, _ in reasons(job)] == [
            "QUEUED",
            "INITIALIZING",
            "PENDING",
            "RUNNING",
            "FINALIZING",
            "DONE",
        ]

    lab_run(tmp_path, test)


def test_a_refusal_at_create_is_an_engine_error_and_frees_the_gpu(tmp_path):
    async def test(lab: Lab):
        job_id = lab.submit()
        lab.rt.fail("create_and_start", WorkloadRefused("could not select device driver"))
        await lab.place(job_id)
        job = await lab.until(job_id, J.ERROR)
        assert job["reason"] == "ENGINE_ERROR"
        assert job["message"] == (
            "the engine could not start the job: could not select device driver"
        )
        assert lab.held() == []
        assert lab.rt.names("create_and_start") == [lab.name(job_id)]  # tried once, not retried

    lab_run(tmp_path, test)


def test_a_network_that_cannot_be_had_is_its_own_error(tmp_path):
    async def test(lab: Lab):
        job_id = lab.submit()
        lab.rt.fail("create_and_start", NetworkUnavailable("the address pools are full"))
        await lab.place(job_id)
        job = await lab.until(job_id, J.ERROR)
        assert (job["reason"], job["message"]) == (
            "NETWORK_UNAVAILABLE",
            "the address pools are full",
        )
        assert lab.held() == []

    lab_run(tmp_path, test)


def test_an_engine_fault_at_create_requeues_the_job_never_ends_it(tmp_path):
    async def test(lab: Lab):
        job_id = lab.submit()
        lab.rt.fail("create_and_start", EngineError("connection reset"))
        await lab.place(job_id)
        # the guard carries it on from what the engine says: its command never ran
        job = await lab.until(job_id, J.QUEUED)
        assert (job["reason"], job["message"]) == (
            "SERVICE_RESTART",
            "queued again: a fault before its command ran",
        )
        retry = [e for e in job["history"] if e["reason"] == "SUPERVISOR_RETRY"]
        assert retry and "EngineError: connection reset" in retry[0]["message"]
        assert lab.held() == [] and not job["devices"]
        await lab.settle(job_id)
        await lab.place(job_id)
        await lab.until(job_id, J.RUNNING)
        assert lab.rt.names("create_and_start") == [lab.name(job_id)] * 2

    lab_run(tmp_path, test)


PRIVATE = "registry.example.org:5000/team/private:1"
DIGEST = "sha256:" + "ab" * 32
PINNED = "registry.example.org:5000/team/private@" + DIGEST


def registry_lab(tmp_path, test, **kw):
    """A lab whose site allows registry.example.org:5000/team/*, with ann's secret regcred
    and a registry that holds PRIVATE for bob:pw."""
    from cryptography.fernet import Fernet

    rt = Engine(images={IMAGE}, gpus=GPUS)
    rt.registry_images[PRIVATE] = (DIGEST, ("bob", "pw"))
    secret = kw.pop("secret", "bob:pw")

    async def with_secret(lab: Lab):
        lab.ctx.secrets.put("ann", "regcred", secret)
        await test(lab)

    lab_run(
        tmp_path,
        with_secret,
        runtime=rt,
        image_registries=["registry.example.org:5000/team/*"],
        secrets_keys=[Fernet.generate_key().decode()],
        **kw,
    )


def test_a_private_image_is_pulled_with_the_owner_s_secret_and_run_by_its_digest(tmp_path):
    async def test(lab: Lab):
        job_id = lab.submit(
            image=PRIVATE, image_pull_policy="if-not-present", image_pull_secret="regcred"
        )
        await lab.place(job_id)
        job = await lab.until(job_id, J.RUNNING)
        (call,) = lab.rt.called("create_and_start")
        assert call.args[0].image == PINNED  # the digest the registry gave, not the moving tag
        assert [c.args[0] for c in lab.rt.calls if c.method == "pull_image"] == [PINNED]
        events = [e["message"] for e in job["history"] if e["reason"] == "IMAGE"]
        assert events == [
            f"preparing image {PRIVATE}",
            f"image {PINNED} ready (pulled 1.0 MB in 1 layer)",
        ]
        # a second job of the same image: the registry is asked again, nothing is pulled
        again = lab.submit(
            image=PRIVATE, image_pull_policy="if-not-present", image_pull_secret="regcred"
        )
        await lab.place(again)
        await lab.until(again, J.RUNNING)
        assert lab.rt.names("registry_digest") == [PRIVATE, PRIVATE]
        assert len(lab.rt.names("pull_image")) == 1

    registry_lab(tmp_path, test)


@pytest.mark.parametrize(
    ("secret", "policy", "why"),
    [
        ("bob:wrong", "if-not-present", "unauthorized: authentication required"),
        (None, "if-not-present", "unauthorized: authentication required"),
        ("no colon", "always", "a registry secret holds USERNAME:PASSWORD"),
        ("bob:pw", "never", "is not on this host and image_pull_policy is never"),
    ],
)
def test_an_image_the_registry_refuses_fails_the_job_with_its_words(tmp_path, secret, policy, why):
    async def test(lab: Lab):
        body = {"image": PRIVATE, "image_pull_policy": policy}
        if secret is not None:
            body["image_pull_secret"] = "regcred"
        job_id = lab.submit(**body)
        await lab.place(job_id)
        job = await lab.until(job_id, J.FAILED)
        assert job["reason"] == "IMAGE_PULL_FAILED" and why in job["message"], job["message"]
        assert "wrong" not in json.dumps(job) and "pw" not in job["message"]
        assert lab.rt.called("create_and_start") == [] and lab.held() == []

    registry_lab(tmp_path, test, secret=secret or "bob:pw")


def test_an_image_another_user_pulled_is_not_run_without_the_registry_s_consent(tmp_path):
    """ann's job pulled the private image; cat's job, without credentials, fails though the
    image is on the host and its policy would not pull it."""

    async def test(lab: Lab):
        ann = lab.submit(
            image=PRIVATE, image_pull_policy="if-not-present", image_pull_secret="regcred"
        )
        await lab.place(ann)
        await lab.until(ann, J.RUNNING)
        cat = lab.ctx.records.create(
            "cat", job_spec(image=PRIVATE, image_pull_policy="never"), None, ()
        )["id"]
        await lab.place(cat)
        job = await lab.until(cat, J.FAILED)
        assert job["reason"] == "IMAGE_PULL_FAILED"
        assert "authentication required" in job["message"]
        assert len(lab.rt.called("create_and_start")) == 1

    registry_lab(tmp_path, test)


def test_on_a_cluster_each_node_is_asked_for_the_image_and_pulls_its_own_copy():
    """A Swarm (the fake's nodes answer for themselves, as their own engines do): the
    registry is asked for the digest at every fetch; whether the digest is there is asked of
    the node that will run it, and a copy on another node does not count; "never" on a node
    without it names the node; a node that is down is unknown (the engine's error), not
    missing."""
    from gpulab.runtime.base import EngineUnreachable, ImagePullFailed

    rt = FakeRuntime.cluster({"a": ("0",), "b": ("0",)}, images=set())
    rt.registry_images[PRIVATE] = (DIGEST, ("bob", "pw"))
    auth = {"username": "bob", "password": "pw"}

    def fetch(node: str, policy: str = "if-not-present") -> str:
        return run_async(rt.fetch_image(PRIVATE, policy, auth, lambda p: None, node))

    assert fetch("a") == PINNED
    assert rt.node_images == {"a": {PINNED}} and rt.images == set()  # the node's, not the site's
    assert fetch("a") == PINNED and fetch("a", "never") == PINNED  # there: nothing pulled
    with pytest.raises(ImagePullFailed, match="is not on node b and image_pull_policy is never"):
        fetch("b", "never")
    assert fetch("b") == PINNED  # a's copy does not count for b
    assert [(c.args[0], c.kwargs["node"]) for c in rt.calls if c.method == "pull_image"] == [
        (PINNED, "a"),
        (PINNED, "b"),
    ]
    assert [c.kwargs["node"] for c in rt.calls if c.method == "image_exists"] == [
        "a",
        "a",
        "a",
        "b",
        "b",
    ]
    assert len(rt.names("registry_digest")) == 5  # the registry's consent, every time
    for policy in ("always", "if-not-present", "never"):  # the engine's error: not the user's
        with pytest.raises(EngineError, match="not in the cluster") as lost:
            fetch("gone", policy)
        assert not isinstance(lost.value, ImagePullFailed)
    rt.node_down("b")
    with pytest.raises(EngineUnreachable, match="node b is down"):
        fetch("b", "always")
    # what the user's credentials cannot get is the registry's refusal, on every node
    with pytest.raises(ImagePullFailed, match="authentication required"):
        run_async(rt.fetch_image(PRIVATE, "never", None, lambda p: None, "a"))


def test_on_a_cluster_a_gang_s_private_image_is_pulled_onto_each_rank_s_node(tmp_path):
    """Two ranks on two nodes: each node pulls the digest the registry gave the owner, and
    both ranks run it pinned; a later job on one of them finds it there."""
    from cryptography.fernet import Fernet

    rt = two_nodes()
    rt.registry_images[PRIVATE] = (DIGEST, ("bob", "pw"))

    async def test(lab: Lab):
        lab.ctx.secrets.put("ann", "regcred", "bob:pw")
        body = {"image": PRIVATE, "image_pull_policy": "if-not-present"}
        job_id = lab.submit(workers=2, image_pull_secret="regcred", **body)
        await lab.place(job_id)
        await lab.until(job_id, J.RUNNING)
        name = lab.name(job_id)
        assert {lab.rt.workloads[n].spec.image for n in (name, f"{name}-r1")} == {PINNED}
        pulled = sorted(c.kwargs["node"] for c in lab.rt.calls if c.method == "pull_image")
        assert pulled == ["a", "b"] and lab.rt.node_images == {"a": {PINNED}, "b": {PINNED}}
        lab.rt.exits(name, 0)
        lab.rt.exits(f"{name}-r1", 0)
        await lab.until(job_id, J.DONE)
        again = lab.submit(image_pull_secret="regcred", **body)
        await lab.place(again)
        await lab.until(again, J.RUNNING)
        assert len(lab.rt.names("pull_image")) == 2  # on its node already

    lab_run(
        tmp_path,
        test,
        runtime=rt,
        image_registries=["registry.example.org:5000/team/*"],
        secrets_keys=[Fernet.generate_key().decode()],
    )


def test_image_pull_timeout_is_one_deadline_for_a_gang_s_nodes(tmp_path):
    """Two ranks on two nodes whose pulls take 0.3 s each: within an image_pull_timeout of
    0.5 s each, not together: the job fails with IMAGE_PULL_FAILED naming the time-out."""
    from cryptography.fernet import Fernet

    rt = two_nodes()
    rt.registry_images[PRIVATE] = (DIGEST, ("bob", "pw"))
    pull = rt.pull_image

    async def slow_pull(*args, **kw):
        await asyncio.sleep(0.3)
        return await pull(*args, **kw)

    rt.pull_image = slow_pull

    async def test(lab: Lab):
        lab.ctx.secrets.put("ann", "regcred", "bob:pw")
        body = {"image": PRIVATE, "image_pull_policy": "always"}
        job_id = lab.submit(workers=2, image_pull_secret="regcred", **body)
        await lab.place(job_id)
        job = await lab.until(job_id, J.FAILED)
        assert job["reason"] == "IMAGE_PULL_FAILED", job["message"]
        assert job["message"] == f"image {PRIVATE} was not pulled within 0.5 s"

    lab_run(
        tmp_path,
        test,
        runtime=rt,
        image_registries=["registry.example.org:5000/team/*"],
        secrets_keys=[Fernet.generate_key().decode()],
        image_pull_timeout=0.5,
    )


def test_a_registry_the_admin_no_longer_allows_fails_the_job(tmp_path):
    async def test(lab: Lab):
        lab.settings.image_registries = ["ghcr.io/acme/*"]
        job_id = lab.submit(image=PRIVATE, image_pull_policy="always")
        await lab.place(job_id)
        job = await lab.until(job_id, J.FAILED)
        assert job["reason"] == "IMAGE_NOT_ALLOWED"
        assert lab.rt.names("registry_digest") == []

    registry_lab(tmp_path, test)


def test_a_missing_image_fails_the_job_before_any_container(tmp_path):
    async def test(lab: Lab):
        job_id = lab.submit(image="gpulab/absent:1")
        await lab.place(job_id)
        job = await lab.until(job_id, J.FAILED)
        assert job["reason"] == "IMAGE_MISSING"
        assert job["message"] == "image gpulab/absent:1 is missing on this host"
        assert lab.rt.called("create_and_start") == [] and lab.held() == []

    lab_run(tmp_path, test)


def test_non_zero_exit_fails_and_oom_says_so(tmp_path):
    async def test(lab: Lab):
        a, b = lab.submit(), lab.submit()
        await lab.place(a)
        await lab.until(a, J.RUNNING)
        await lab.until(b, J.RUNNING)
        lab.rt.exits(lab.name(a), 3)
        lab.rt.exits(lab.name(b), 137, oom=True)
        job = await lab.until(a, J.FAILED)
        assert (job["reason"], job["message"], job["exit_code"]) == ("EXITED", "exit code 3", 3)
        job = await lab.until(b, J.FAILED)
        assert job["message"] == "out of memory" and job["exit_code"] == 137
        assert lab.held() == []

    lab_run(tmp_path, test)


def test_a_failure_with_retries_left_restarts_the_same_container(tmp_path):
    async def test(lab: Lab):
        job_id = lab.submit(retries=1)
        await lab.place(job_id)
        await lab.until(job_id, J.RUNNING)
        name = lab.name(job_id)
        lab.rt.exits(name, 2)
        await lab.until(job_id, J.RESTARTING, J.RUNNING)
        deadline = time.monotonic() + 5
        while lab.rt.workloads[name].starts < 2:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        job = await lab.until(job_id, J.RUNNING)
        assert job["restarts"] == 1 and lab.rt.names("start_again") == [name]
        assert ("RESTARTING", "AUTO_RESTART") in reasons(job)
        assert lab.rt.names("create_and_start") == [name]  # restarted, not made again
        lab.rt.exits(name, 2)  # no restart left
        job = await lab.until(job_id, J.FAILED)
        assert job["message"] == "exit code 2 after 1 restarts"

    lab_run(tmp_path, test)


def test_a_time_out_interrupts_the_job(tmp_path):
    async def test(lab: Lab):
        job_id = lab.submit(timeout=0.05)
        await lab.place(job_id)
        job = await lab.until(job_id, J.INTERRUPTED)
        assert job["reason"] == "TIMEOUT" and "time-out of 0.05 s reached" in job["message"]
        assert not lab.rt.workloads[lab.name(job_id)].running and lab.held() == []
        assert [s for s, _ in reasons(job)][-4:] == [
            "TIMEOUT",
            "INTERRUPTING",
            "FINALIZING",
            "INTERRUPTED",
        ]

    lab_run(tmp_path, test)


def test_a_hang_restarts_in_place_then_fails(tmp_path):
    async def test(lab: Lab):
        job_id = lab.submit(hang_restart={"enabled": True, "period": 0.03})
        await lab.place(job_id)
        job = await lab.until(job_id, J.FAILED, timeout=10)
        name = lab.name(job_id)
        assert job["reason"] == "HANG"
        assert job["message"] == (
            f"no progress for 0.03 s after {hang.MAX_HANG_RESTARTS} restarts in place"
        )
        assert lab.rt.workloads[name].restarts == hang.MAX_HANG_RESTARTS
        notes = [e["message"] for e in job["history"] if e["reason"] == "HANG_RESTART"]
        assert len(notes) == hang.MAX_HANG_RESTARTS
        assert notes[0] == (
            "no output and no CPU progress for 0.03 s: command restarted in place (1 of 3)"
        )
        assert job["hang_restarts"] == hang.MAX_HANG_RESTARTS and lab.held() == []

    lab_run(tmp_path, test)


def test_output_is_progress_a_hang_is_not_called(tmp_path):
    async def test(lab: Lab):
        hang = {"enabled": True, "period": 0.2}
        chatty, silent = lab.submit(hang_restart=hang), lab.submit(hang_restart=hang)
        await lab.place(chatty)
        await lab.until(chatty, J.RUNNING)
        await lab.until(silent, J.RUNNING)
        w = lab.rt.workloads[lab.name(chatty)]
        # the runner's own notes are not the command's progress
        lab.rt.workloads[lab.name(silent)].logs = b"[gpulab] command restarted\n"
        for i in range(80):  # a line every 10 ms for four periods
            w.logs += f"step {i}\n".encode()
            await asyncio.sleep(0.01)
        assert w.restarts == 0 and lab.job(chatty)["state"] == J.RUNNING.value
        assert lab.rt.workloads[lab.name(silent)].restarts >= 1

    lab_run(tmp_path, test)


class GpuMeter:
    """A GPU activity source the test sets: each device's utilization (percent; None: NVML
    has none, as for a MIG device), as the service's NVML reader reports it."""

    def __init__(self):
        self.percent = {g: 0 for g in GPUS}
        self.reads = 0

    def __call__(self) -> list[DeviceUsage]:
        self.reads += 1
        return [DeviceUsage(g, p, 2**30, 80 * 2**30) for g, p in self.percent.items()]


def test_a_busy_gpu_is_progress_an_idle_one_is_not(tmp_path):
    """A silent job with no CPU whose GPU is busy is never restarted as hung; once its GPU is
    idle too for the period, it is, and the note says the GPU was idle."""
    meter = GpuMeter()
    meter.percent["0"] = 87

    async def test(lab: Lab):
        job_id = lab.submit(hang_restart={"enabled": True, "period": 0.1})
        await lab.place(job_id)
        await lab.until(job_id, J.RUNNING)
        w = lab.rt.workloads[lab.name(job_id)]
        assert w.spec.gpu_ids == ["0"]
        await asyncio.sleep(0.6)  # six periods: no output, no CPU, a busy GPU
        assert meter.reads > 10 and w.restarts == 0
        assert lab.job(job_id)["state"] == J.RUNNING.value
        meter.percent["0"] = 0  # now idle as well
        job = await lab.until(job_id, J.FAILED, timeout=10)
        assert (job["reason"], job["message"]) == ("HANG", hang.failure_message(0.1))
        assert w.restarts == hang.MAX_HANG_RESTARTS
        notes = [e["message"] for e in job["history"] if e["reason"] == "HANG_RESTART"]
        assert notes[0] == (
            "no output, no CPU progress and no GPU activity for 0.1 s: "
            "command restarted in place (1 of 3)"
        )

    lab_run(tmp_path, test, gpu_usage=meter)


def test_another_jobs_busy_gpu_is_not_this_jobs_progress(tmp_path):
    meter = GpuMeter()
    meter.percent["1"] = 100  # a GPU the job does not hold

    async def test(lab: Lab):
        job_id = lab.submit(hang_restart={"enabled": True, "period": 0.05})
        await lab.place(job_id)
        job = await lab.until(job_id, J.FAILED, timeout=10)
        assert lab.rt.workloads[lab.name(job_id)].spec.gpu_ids == ["0"]
        assert job["reason"] == "HANG" and meter.reads > 0

    lab_run(tmp_path, test, gpu_usage=meter)


@pytest.mark.parametrize("reader", ["fails", "no utilization"])
def test_a_gpu_that_cannot_be_read_leaves_output_and_cpu_to_judge(tmp_path, reader):
    """A reader that fails, or a device without a utilization (MIG), is no sign either way."""
    meter = GpuMeter()
    meter.percent["0"] = None

    def broken() -> list[DeviceUsage]:
        raise RuntimeError("NVML went away")

    async def test(lab: Lab):
        job_id = lab.submit(hang_restart={"enabled": True, "period": 0.05})
        await lab.place(job_id)
        job = await lab.until(job_id, J.FAILED, timeout=10)
        notes = [e["message"] for e in job["history"] if e["reason"] == "HANG_RESTART"]
        assert notes[0] == (
            "no output and no CPU progress for 0.05 s: command restarted in place (1 of 3)"
        )

    lab_run(tmp_path, test, gpu_usage=broken if reader == "fails" else meter)


def test_a_job_without_gpus_is_judged_without_asking_the_gpus(tmp_path):
    meter = GpuMeter()
    meter.percent["0"] = meter.percent["1"] = 100

    async def test(lab: Lab):
        job_id = lab.submit(gpus=0, hang_restart={"enabled": True, "period": 0.05})
        await lab.place(job_id)
        job = await lab.until(job_id, J.FAILED, timeout=10)
        assert job["reason"] == "HANG" and meter.reads == 0

    lab_run(tmp_path, test, gpu_usage=meter)


class NodeMeter:
    """A cluster's GPU readings as its runtime gives them (its nodes' agents): node -> each
    GPU's utilization; a node left out has no fresh reading (its agent stopped, or is late)."""

    def __init__(self, nodes: dict[str, tuple[str, ...]], percent: int = 0):
        self.percent = {n: dict.fromkeys(gpus, percent) for n, gpus in nodes.items()}
        self.reads = 0

    def __call__(self) -> dict[str, list[DeviceUsage]]:
        self.reads += 1
        return {
            node: [DeviceUsage(g, p, 2**30, 80 * 2**30) for g, p in gpus.items()]
            for node, gpus in self.percent.items()
        }


def cluster_with(meter: NodeMeter) -> FakeRuntime:
    rt = Engine.cluster({"a": ("0",), "b": ("0",)}, images={IMAGE})
    rt.gpu_readings = meter
    return rt


def test_on_a_cluster_a_busy_gpu_on_the_jobs_node_is_progress_an_idle_one_is_not(tmp_path):
    """A Swarm job's GPU is read on its node (the agent's readings): busy, the silent job is
    never restarted as hung (a Swarm reads no CPU time: output alone would have restarted it);
    once it is idle, even while the other node's GPU "0" is busy, it is hung."""
    meter = NodeMeter({"a": ("0",), "b": ("0",)}, percent=87)

    async def test(lab: Lab):
        job_id = lab.submit(hang_restart={"enabled": True, "period": 0.1})
        await lab.place(job_id)
        job = await lab.until(job_id, J.RUNNING)
        node = job["workers"][0]["node"]
        other = ({"a", "b"} - {node}).pop()
        assert job["devices"] == [f"{node}/0"]
        w = lab.rt.workloads[lab.name(job_id)]
        await asyncio.sleep(0.6)  # six periods: no output, a busy GPU on its node
        assert meter.reads > 10 and w.restarts == 0
        assert lab.job(job_id)["state"] == J.RUNNING.value
        meter.percent[node]["0"], meter.percent[other]["0"] = 0, 100
        job = await lab.until(job_id, J.FAILED, timeout=10)
        assert (job["reason"], job["message"]) == ("HANG", hang.failure_message(0.1))
        notes = [e["message"] for e in job["history"] if e["reason"] == "HANG_RESTART"]
        assert notes[0] == (
            "no output, no CPU progress and no GPU activity for 0.1 s: "
            "command restarted in place (1 of 3)"
        )

    lab_run(tmp_path, test, runtime=cluster_with(meter))


def test_on_a_cluster_a_node_without_a_fresh_reading_is_no_sign_either_way(tmp_path):
    """A node whose agent has no fresh reading is unknown, never idle: the job is judged by
    what can be read (its output), and the note does not claim an idle GPU."""
    meter = NodeMeter({"a": ("0",), "b": ("0",)}, percent=0)
    meter.percent = {}  # no agent has read anything lately

    async def test(lab: Lab):
        job_id = lab.submit(hang_restart={"enabled": True, "period": 0.05})
        await lab.place(job_id)
        job = await lab.until(job_id, J.FAILED, timeout=10)
        assert meter.reads > 0
        notes = [e["message"] for e in job["history"] if e["reason"] == "HANG_RESTART"]
        assert notes[0] == (
            "no output and no CPU progress for 0.05 s: command restarted in place (1 of 3)"
        )

    lab_run(tmp_path, test, runtime=cluster_with(meter))


def test_a_container_that_disappears_is_an_error(tmp_path):
    async def test(lab: Lab):
        job_id = lab.submit()
        await lab.place(job_id)
        await lab.until(job_id, J.RUNNING)
        lab.rt.vanish(lab.name(job_id))
        job = await lab.until(job_id, J.ERROR)
        assert (job["reason"], job["message"]) == (
            "CONTAINER_LOST",
            "the job's container disappeared",
        )
        assert lab.held() == []

    lab_run(tmp_path, test)


def test_a_lost_node_requeues_the_job_then_fails_it(tmp_path, monkeypatch):
    monkeypatch.setattr(life, "LOST_AFTER", 0.0)

    async def test(lab: Lab):
        job_id = lab.submit(retries=1)
        await lab.place(job_id)
        await lab.until(job_id, J.RUNNING)
        name = lab.name(job_id)
        lab.rt.lose(name, "node worker-2 is down")
        job = await lab.until(job_id, J.QUEUED)
        assert job["reason"] == "NODE_LOST" and job["restarts"] == 1
        assert job["message"] == (
            "queued again to run on another node: its node was lost (node worker-2 is down); "
            "restart 1 of 1"
        )
        assert name not in lab.rt.workloads and lab.held() == []  # removed, then released
        await lab.settle(job_id)
        await lab.place(job_id)  # placed again, made anew
        await lab.until(job_id, J.RUNNING)
        assert lab.rt.names("create_and_start") == [name, name]
        lab.rt.lose(name, "")
        job = await lab.until(job_id, J.FAILED)
        assert (job["reason"], job["message"]) == ("NODE_LOST", "its node was lost")

    lab_run(tmp_path, test)


# --- what is asked of a running job -------------------------------------------------------------


def test_an_interrupt_stops_the_job_and_frees_its_gpu(tmp_path):
    async def test(lab: Lab):
        job_id = lab.submit()
        await lab.place(job_id)
        await lab.until(job_id, J.RUNNING)
        lab.ctx.records.ask(job_id, "interrupt", states=frozenset({J.RUNNING}))
        job = await lab.until(job_id, J.INTERRUPTED)
        assert (job["reason"], job["message"]) == ("USER_INTERRUPT", "interrupted by its owner")
        assert ("INTERRUPTING", "USER_INTERRUPT") in reasons(job)
        assert lab.rt.names("stop") == [lab.name(job_id)] and lab.held() == []

    lab_run(tmp_path, test)


def test_an_interrupt_before_the_start_makes_no_container(tmp_path):
    async def test(lab: Lab):
        job_id = lab.submit()
        lab.sv.leading.set()
        gate = asyncio.Event()
        real = lab.rt.image_exists

        async def slow_image_exists(image):  # the interrupt comes while the image is checked
            await gate.wait()
            return await real(image)

        lab.rt.image_exists = slow_image_exists
        await lab.sv.schedule()
        await lab.until(job_id, J.INITIALIZING)
        lab.ctx.records.ask(job_id, "interrupt", states=frozenset({J.INITIALIZING}))
        gate.set()
        job = await lab.until(job_id, J.INTERRUPTED)
        assert job["message"] == "interrupted before it started"
        assert lab.rt.called("create_and_start") == [] and lab.held() == []

    lab_run(tmp_path, test)


def test_a_preempted_job_is_requeued_with_its_gpu_released(tmp_path):
    async def test(lab: Lab):
        job_id = lab.submit(preemptible=True)
        await lab.place(job_id)
        await lab.until(job_id, J.RUNNING)
        name = lab.name(job_id)
        lab.ctx.records.ask(job_id, "preempt", states=frozenset({J.RUNNING}))
        job = await lab.until(job_id, J.QUEUED)
        assert job["reason"] == "PREEMPTED"
        assert job["message"] == "re-queued after preemption; compute released"
        assert ("INTERRUPTING", "PREEMPTED") in reasons(job)
        assert name not in lab.rt.workloads and lab.held() == [] and not job["devices"]

    lab_run(tmp_path, test)


def test_a_preempted_job_that_asked_to_terminate_ends_interrupted_never_requeued(tmp_path):
    async def test(lab: Lab):
        job_id = lab.submit(preemptible=True, terminate_after_preemption=True)
        await lab.place(job_id)
        await lab.until(job_id, J.RUNNING)
        name = lab.name(job_id)
        lab.ctx.records.ask(job_id, "preempt", states=frozenset({J.RUNNING}))
        job = await lab.until(job_id, J.INTERRUPTED)
        assert job["reason"] == "PREEMPTED" and "terminate_after_preemption" in job["message"]
        assert [s for s, _ in reasons(job)][-3:] == ["INTERRUPTING", "FINALIZING", "INTERRUPTED"]
        assert "QUEUED" not in [s for s, _ in reasons(job)[1:]]
        assert lab.rt.names("stop") == [name] and lab.held() == [] and not job["devices"]
        await lab.settle(job_id)
        await lab.sv.schedule()  # nothing brings it back
        assert lab.job(job_id)["state"] == J.INTERRUPTED.value
        assert lab.rt.names("create_and_start") == [name]

    lab_run(tmp_path, test)


def test_a_terminating_preemption_keeps_the_gpu_until_the_engine_confirms(tmp_path):
    """The rule on the recovery path too (a new supervisor finds it INTERRUPTING for a
    preemption): its container outlives SIGKILL, so the GPU stays booked and the job stays
    INTERRUPTING; once the engine says it is gone, it ends INTERRUPTED (PREEMPTED)."""

    async def test(lab: Lab):
        job_id = lab.submit(preemptible=True, terminate_after_preemption=True)
        await lab.place(job_id)
        await lab.until(job_id, J.RUNNING)
        await lab.close()  # this test drives the ending itself
        lab.ctx.records.ask(job_id, "preempt", states=frozenset({J.RUNNING}))
        job = lab.job(job_id)
        spec = JobSpec.from_json(job["spec"])
        with pytest.raises(StillRunning):
            await ending.stop_by_request(lab.ctx, job_id, job, spec, lab.ctx.gang(job_id, job))
        assert lab.held() == ["0"] and lab.job(job_id)["state"] == J.INTERRUPTING.value
        lab.rt.workloads[lab.name(job_id)].end(143)
        await life.carry_on(lab.ctx, job_id, "a test")
        job = lab.job(job_id)
        assert (job["state"], job["reason"]) == ("INTERRUPTED", "PREEMPTED")
        assert lab.held() == []

    lab_run(tmp_path, test, runtime=StubbornRuntime(images={IMAGE}, gpus=GPUS))


def test_the_scheduler_preempts_over_quota_work_for_in_quota_work(tmp_path):
    async def test(lab: Lab):
        lab.settings.job_quota = {"gpus": 1}
        a, b = lab.submit(preemptible=True), lab.submit(preemptible=True)
        await lab.place(a)  # ann's second GPU: beyond her quota, preemptible
        await lab.until(a, J.RUNNING)
        await lab.until(b, J.RUNNING)
        over = [j for j in (a, b) if lab.job(j)["over_quota"]]
        assert len(over) == 1
        bob = lab.ctx.records.create("bob", job_spec(gpus=1), None, ())["id"]
        await lab.sv.schedule()  # bob's in-quota job asks the over-quota one to give way
        job = await lab.until(over[0], J.QUEUED)
        assert job["reason"] == "PREEMPTED"
        await lab.settle(over[0])
        await lab.sv.schedule()
        await lab.until(bob, J.RUNNING)

    lab_run(tmp_path, test)


# --- GPUs and data are kept while the engine has not confirmed ------------------------------------


class StubbornRuntime(FakeRuntime):
    """An engine whose workloads outlive SIGTERM and SIGKILL (a hung driver, a D-state)."""

    async def stop(self, name, grace):
        self._enter("stop", name, grace)

    async def kill(self, name):
        self._enter("kill", name)


def test_gpus_stay_booked_while_the_engine_says_the_container_runs(tmp_path):
    async def test(lab: Lab):
        job_id = lab.submit()
        await lab.place(job_id)
        await lab.until(job_id, J.RUNNING)
        await lab.close()  # this test drives the ending itself
        with pytest.raises(StillRunning):
            await ending.finalize(lab.ctx, job_id, J.INTERRUPTED, "USER_INTERRUPT", "stop")
        assert lab.held() == ["0"] and lab.job(job_id)["state"] == J.RUNNING.value
        name = lab.name(job_id)
        assert lab.rt.names("stop") == [name] and lab.rt.names("kill") == [name]
        lab.rt.workloads[name].end(137)  # it died at last: the same ending now completes
        await ending.finalize(lab.ctx, job_id, J.INTERRUPTED, "USER_INTERRUPT", "stop")
        assert lab.job(job_id)["state"] == J.INTERRUPTED.value and lab.held() == []

    lab_run(tmp_path, test, runtime=StubbornRuntime(images={IMAGE}, gpus=GPUS))


def test_a_failed_push_keeps_the_volume_and_a_retry_finishes_the_job(tmp_path):
    async def test(lab: Lab):
        job_id = lab.submit(volumes=["data@local/out:/mnt/out:rw"])
        (vol,) = lab.ctx.volumes(job_id, JobSpec.from_json(lab.job(job_id)["spec"]))
        volume = vol.docker_volume
        lab.rt.add_volume(volume)  # there, and nothing stored yet: no pull
        await lab.place(job_id)
        await lab.until(job_id, J.RUNNING)
        name = lab.name(job_id)
        assert lab.rt.workloads[name].spec.mounts[0].volume == volume
        lab.rt.script_helper(1, ["boom: the store is read-only"])  # the push fails
        lab.rt.exits(name, 0)
        job = await lab.until(job_id, J.SYNC_FAILED)
        assert job["reason"] == "PUSH_FAILED" and job["outcome"] == J.DONE.value
        assert job["message"].startswith("push of data@local/out:/mnt/out:rw failed")
        assert "Nothing local was deleted" in job["message"]
        assert lab.held() == []  # the GPU goes; the data stays
        await lab.settle(job_id)
        await housekeeping.cleanup(lab.ctx, time.time())  # past the retention delay
        assert (volume, "") in lab.rt.volumes and lab.rt.called("remove_volume") == []
        push = lab.rt.helper_configs[-1]
        assert isinstance(push, HelperSpec) and push.command[0] == "push"
        assert [m.volume for m in push.mounts] == [volume]
        assert push.host_dirs and not any(ro for _, ro in push.host_dirs.values())  # it writes
        report = {"event": "report", "ok": True, "completed": 1, "skipped": 0, "deleted": 0}
        lab.rt.script_helper(0, [json.dumps(report)])
        job = await lab.sv.retry_push(job_id)
        assert job["state"] == J.DONE.value, job["message"]
        assert ("FINALIZING", "PUSH_RETRY") in reasons(job)
        await housekeeping.cleanup(lab.ctx, time.time())
        assert (volume, "") not in lab.rt.volumes  # then the delay removes it

    lab_run(tmp_path, test)


def test_cleanup_backs_off_a_job_its_engine_refuses_and_removes_jobs_at_once(tmp_path, caplog):
    """An ended job whose removal fails (its node down) is tried again at the next pass, then
    after a growing delay, with one WARNING, not one per pass; the other ended jobs go
    meanwhile. Removals run at once: four jobs whose removal takes 0.3 s each take one
    pass of about 0.3 s, not 1.2 s (a node that does not answer holds the pass for one of
    its time-outs, not one per job)."""
    import logging

    assert housekeeping.cleanup_delay(1) == 0.0 and housekeeping.cleanup_delay(2) == 2.0
    assert housekeeping.cleanup_delay(30) == housekeeping.CLEANUP_BACKOFF_MAX

    async def ended(lab: Lab, n: int) -> list[str]:
        ids = [lab.submit(gpus=0) for _ in range(n)]
        for job_id in ids:
            await lab.place(job_id)
            await lab.until(job_id, J.RUNNING)
            lab.rt.exits(lab.name(job_id), 0)
            await lab.until(job_id, J.DONE)
            await lab.settle(job_id)
        return ids

    async def test(lab: Lab):
        stuck, other = await ended(lab, 2)
        lab.rt.fail("remove", EngineError("node b is down"), name=lab.name(stuck), times=0)
        with caplog.at_level(logging.DEBUG, logger="gpulab.jobs.supervisor"):
            for _ in range(4):
                await housekeeping.cleanup(lab.ctx, time.time())
        assert lab.rt.names("remove").count(lab.name(stuck)) == 2  # then backed off
        assert lab.name(other) not in lab.rt.workloads
        said = [r for r in caplog.records if "volumes not removed yet" in r.getMessage()]
        assert [r.levelname for r in said] == ["WARNING", "DEBUG"]
        lab.rt.unfail("remove")
        await housekeeping.cleanup(lab.ctx, time.time())  # not due yet
        assert lab.name(stuck) in lab.rt.workloads
        lab.ctx.cleanup_backoff[stuck] = (2, 0.0)  # its delay is over
        await housekeeping.cleanup(lab.ctx, time.time())
        assert lab.name(stuck) not in lab.rt.workloads and lab.ctx.cleanup_backoff == {}
        slow = await ended(lab, 4)
        removal = lab.rt.remove

        async def remove_slowly(name: str) -> bool:
            await asyncio.sleep(0.3)
            return await removal(name)

        lab.rt.remove = remove_slowly
        began = time.monotonic()
        await housekeeping.cleanup(lab.ctx, time.time())
        assert time.monotonic() - began < 0.9
        assert not [j for j in slow if lab.name(j) in lab.rt.workloads]

    lab_run(tmp_path, test)


# --- live pushes while a job runs (gpulab.live_push) -------------------------------------------


class HeldHelpers(Engine):
    """The fake engine, whose live push helpers run until the test lets them end."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.release = asyncio.Event()
        self.ran: list[tuple[str, float, float]] = []  # (live or final, began, ended)

    async def run_helper(self, spec, on_line, node=""):
        began = time.monotonic()
        if "--live" in spec.command:
            await self.release.wait()
        try:
            return await super().run_helper(spec, on_line, node)
        finally:
            kind = "live" if "--live" in spec.command else spec.command[0]
            self.ran.append((kind, began, time.monotonic()))


LIVE_REPORT = {"event": "report", "ok": True, "live": True, "completed": 2, "skipped": 3}
LIVE_REPORT |= {"in_flux": 1, "bytes_transferred": 2048}


def test_a_running_jobs_volumes_are_pushed_live_every_interval(tmp_path):
    async def test(lab: Lab):
        job_id = lab.submit(volumes=["data@local/out:/mnt/out:rw"])
        (vol,) = lab.ctx.volumes(job_id, JobSpec.from_json(lab.job(job_id)["spec"]))
        lab.rt.add_volume(vol.docker_volume)
        lab.rt.script_helper(0, [json.dumps(LIVE_REPORT)])
        lab.rt.script_helper(1, ["gpulab-sync: error: the store said no"])
        await lab.place(job_id)
        await lab.until(job_id, J.RUNNING)
        job = await until_job(lab, job_id, lambda j: (j["live_push"] or {}).get("ok") is False)
        assert job["state"] == J.RUNNING.value  # a failed live push stops nothing
        live = [h for h in lab.rt.helper_configs if "--live" in h.command]
        assert len(live) >= 2 and live[0].command[0] == "push"
        assert [m.volume for m in live[0].mounts] == [vol.docker_volume]
        events = [(e["kind"], e["reason"], e["message"]) for e in job["history"]]
        ok = next(m for k, r, m in events if (k, r) == ("sync", "LIVE_PUSH"))
        assert ok == (
            "live push (every interval): data@local/out:/mnt/out:rw: 2 transferred, "
            "2 unchanged, 1 in flux, 2.0 KB"
        )
        failed = next(m for k, r, m in events if (k, r) == ("sync", "LIVE_PUSH_FAILED"))
        assert "the store said no" in failed
        assert job["live_push"]["trigger"] == "interval" and job["live_push"]["at"]
        lab.rt.exits(lab.name(job_id), 0)
        done = await lab.until(job_id, J.DONE, J.SYNC_FAILED)
        final = lab.rt.helper_configs[-1]
        assert "--live" not in final.command and "--wait-lock" in final.command
        assert done["state"] == J.SYNC_FAILED.value  # the fake's unscripted helper: no report

    lab_run(tmp_path, test, sync_interval=0.05, sync_interval_floor=0.01)


async def until_job(lab: Lab, job_id: str, check, timeout: float = 5.0) -> dict:
    deadline = time.monotonic() + timeout
    while not check(job := lab.job(job_id)):
        assert time.monotonic() < deadline, (job["state"], job["live_push"])
        await asyncio.sleep(0.01)
    return job


def test_push_now_is_one_at_a_time_and_the_stop_push_runs_after_it(tmp_path):
    async def test(lab: Lab):
        s, sv, rt = lab.settings, lab.sv, lab.rt
        job_id = lab.submit(volumes=["data@local/out:/mnt/out:rw"], sync_interval=0)
        (vol,) = lab.ctx.volumes(job_id, JobSpec.from_json(lab.job(job_id)["spec"]))
        rt.add_volume(vol.docker_volume)
        queued = lab.job(job_id)
        with pytest.raises(Conflict, match="push runs now only while it is RUNNING"):
            await actions.act(sv, s, queued, "push", admin=False)
        await lab.place(job_id)
        running = await lab.until(job_id, J.RUNNING)
        await asyncio.sleep(0.1)
        assert rt.helper_configs == []  # its own interval is 0: no periodic push
        acted = await actions.act(sv, s, running, "push", admin=False)
        assert acted.pending and acted.job["push_requested"]
        with pytest.raises(Conflict, match="already under way"):
            await actions.act(sv, s, running, "push", admin=False)
        job = await until_job(lab, job_id, lambda j: (j["live_push"] or {}).get("running"))
        assert job["push_requested"] is None and job["live_push"]["trigger"] == "request"
        with pytest.raises(Conflict, match="already under way"):
            await actions.act(sv, s, running, "push", admin=False)
        rt.script_helper(0, [json.dumps(LIVE_REPORT)])
        report = {"event": "report", "ok": True, "completed": 3, "skipped": 0, "deleted": 1}
        rt.script_helper(0, [json.dumps(report)])
        rt.exits(lab.name(job_id), 0)  # it ends while its live push runs
        await asyncio.sleep(0.2)
        assert [kind for kind, *_ in rt.ran] == []  # the stop's push waits for the live one
        rt.release.set()
        job = await lab.until(job_id, J.DONE)
        (live, live_began, live_ended), (final, final_began, _) = rt.ran
        assert (live, final) == ("live", "push") and final_began >= live_ended
        assert job["live_push"]["ok"] and "asked by its owner" in job["live_push"]["message"]
        assert "3 transferred" in job["message"]
        bare = lab.submit()  # nothing that pushes
        with pytest.raises(Conflict, match="has no rw or rwd volume"):
            await actions.act(sv, s, {**lab.job(bare), "state": "RUNNING"}, "push", admin=False)

    lab_run(tmp_path, test, runtime=HeldHelpers(images={IMAGE}, gpus=GPUS))


# --- a restart of the service ------------------------------------------------------------------


def test_a_new_supervisor_reattaches_a_running_job_and_never_starts_it_twice(tmp_path):
    async def test(lab: Lab):
        job_id = lab.submit()
        await lab.place(job_id)
        await lab.until(job_id, J.RUNNING)
        await lab.close()  # the service dies; the container runs on
        again = JobSupervisor(lab.settings, lab.db, lab.rt, tmp_path / "logs", holder="next")
        again.leading.set()
        await housekeeping.recover(again.ctx)
        assert job_id in again.tasks
        name = lab.name(job_id)
        lab.rt.exits(name, 0)
        job = await lab.until(job_id, J.DONE)
        assert lab.rt.names("create_and_start") == [name] and lab.held() == []
        assert job["reason"] == "EXITED"
        await asyncio.gather(*again.tasks.values())

    lab_run(tmp_path, test)


def test_a_restarted_supervisor_answers_before_it_has_reconciled_its_running_jobs(tmp_path, caplog):
    """Restart at scale (issue #32 item 4, measured by bench/bench_restart.py): with many
    running jobs recorded, a new supervisor's start returns and the API's reads answer while
    the engine has not yet said a word about any job (reconciliation runs in the background,
    never before the service listens); once the engine answers, every job is confirmed
    exactly once and none is started again."""
    jobs = 40

    async def test(lab: Lab):
        ids = [lab.submit(gpus=0) for _ in range(jobs)]
        lab.sv.leading.set()
        await lab.sv.refresh_inventory()
        for _ in range(100):
            await lab.sv.schedule()
            if all(lab.job(i)["state"] == J.RUNNING.value for i in ids):
                break
            await asyncio.sleep(0.02)
        states = {(lab.job(i)["state"], lab.job(i)["message"]) for i in ids}
        assert states == {(J.RUNNING.value, "the command runs")}, states
        await lab.close()  # the service dies; the containers run on
        created = list(lab.rt.names("create_and_start"))
        gate = asyncio.Event()  # the engine answers nothing until the test opens it
        looked = lab.rt.state

        async def slow_state(name: str):
            await gate.wait()
            return await looked(name)

        lab.rt.state = slow_state
        again = JobSupervisor(lab.settings, lab.db, lab.rt, tmp_path / "logs", holder="next")
        try:
            with caplog.at_level(logging.INFO, logger="gpulab.jobs"):
                await asyncio.wait_for(again.start(), 2)
                for _ in range(500):  # the lease taken, every job handed its task
                    if len(again.tasks) == jobs:
                        break
                    await asyncio.sleep(0.01)
                assert len(again.tasks) == jobs
                # the API answers from its own pool meanwhile (a user's page of jobs)
                rows, total = await asyncio.wait_for(
                    read(lab.ctx.records.page, "ann", None, None, 20, 0), 2
                )
                assert total == jobs and len(rows) == 20
                assert not [r for r in caplog.records if "restarted in" in r.getMessage()]
                gate.set()
                for _ in range(500):
                    said = [r.getMessage() for r in caplog.records]
                    if sum("the service restarted in" in m for m in said) >= jobs:
                        break
                    await asyncio.sleep(0.01)
            confirmed = [m for m in said if "the service restarted in" in m]
            assert sorted(m.split(":")[0].split()[1] for m in confirmed) == sorted(ids)
            assert all(m.endswith("in RUNNING, container running: attach") for m in confirmed)
            assert lab.rt.names("create_and_start") == created
            assert lab.rt.names("start_again") == []
            assert all(lab.job(i)["state"] == J.RUNNING.value for i in ids)
        finally:
            await again.stop()

    lab_run(
        tmp_path,
        test,
        max_job_workers=jobs,
        job_quota={"gpus": None, "jobs": None},
        supervisor_interval=0.2,
    )


def test_recovery_removes_what_has_no_record(tmp_path):
    async def test(lab: Lab):
        rt = lab.rt
        orphan = lab.name("jgone")
        await rt.create_and_start(
            engine.workload_spec(
                lab.ctx, "jgone", JobSpec.from_json(job_spec()), orphan, ("0",), "ann", ""
            )
        )
        rt.add_volume(f"{orphan}-v-data")
        rt.add_volume(f"{orphan}-git-0")
        await housekeeping.recover(lab.ctx)
        assert orphan not in rt.workloads
        assert not [v for v in rt.volumes if v[0].startswith(orphan)]

    lab_run(tmp_path, test)


def test_recovery_and_the_orphan_sweeps_remove_what_dead_helpers_left(tmp_path):
    """A new leadership removes this instance's orphaned job helpers and then what dead
    helpers left apart from themselves (a Swarm's secrets: Runtime.remove_helper_leftovers);
    each later sweep for orphans does it again (what was too young to go at the first)."""

    async def test(lab: Lab):
        rt = lab.rt
        rt.helper_leftovers = {INSTANCE: ["h1-store-credentials"], "other": ["o1"]}
        await housekeeping.recover(lab.ctx)
        assert rt.names("remove_helper_leftovers") == [INSTANCE]
        assert rt.helper_leftovers == {"other": ["o1"]}
        await housekeeping.cleanup(lab.ctx, time.time())  # no sweep due yet
        assert rt.names("remove_helper_leftovers") == [INSTANCE]
        rt.fail("remove_helper_leftovers", EngineError("the manager did not answer"))
        assert await housekeeping.cleanup(lab.ctx, 0.0) > 0.0  # a warning, not a failure
        await housekeeping.cleanup(lab.ctx, 0.0)
        assert rt.names("remove_helper_leftovers") == [INSTANCE] * 3

    lab_run(tmp_path, test)


def test_the_whole_loop_places_runs_and_ends_a_job(tmp_path):
    async def test(lab: Lab):
        await lab.sv.start()
        try:
            job_id = lab.submit(gpus=2)
            lab.sv.wake.set()
            await lab.until(job_id, J.RUNNING)
            assert lab.held() == ["0", "1"]
            lab.rt.exits(lab.name(job_id), 0)
            await lab.until(job_id, J.DONE)
            assert lab.held() == []
        finally:
            await lab.sv.stop()

    lab_run(tmp_path, test)


def test_a_clone_helper_is_a_helper_spec_on_the_owners_network(tmp_path):
    async def test(lab: Lab):
        job_id = lab.submit(
            git=[{"url": "https://git.example/r.git", "path": "/workspace/r", "branch": "main"}]
        )
        done = {"event": "git", "ok": True, "commit": "c0ffee" * 7, "disk_bytes": 10}
        lab.rt.script_helper(0, [json.dumps(done)])
        await lab.place(job_id)
        job = await lab.until(job_id, J.RUNNING)
        (helper,) = lab.rt.helper_configs
        assert isinstance(helper, HelperSpec)
        assert helper.network == f"net-{INSTANCE}-ann"  # the owner's own, never the bridge
        assert helper.command[0] == "git-clone" and "--branch=main" in helper.command
        assert helper.mounts[0].volume == f"{lab.name(job_id)}-git-0"
        deadline = time.monotonic() + 5  # the note is written beside the job's task
        while not any(e["reason"] == "GIT" for e in job["history"]):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
            job = lab.job(job_id)
        (note,) = [e for e in job["history"] if e["reason"] == "GIT"]
        assert note["message"] == (
            f"cloned https://git.example/r.git (branch main) at {'c0ffee' * 2} into /workspace/r"
        )

    lab_run(tmp_path, test)


def test_the_actions_a_user_takes_and_what_came_of_each(tmp_path):
    async def test(lab: Lab):
        s, sv = lab.settings, lab.sv
        queued = lab.job(lab.submit())
        acted = await actions.act(sv, s, queued, "interrupt", admin=False)
        assert acted.job["state"] == "INTERRUPTED" and not (acted.pending or acted.created)
        acted = await actions.act(sv, s, acted.job, "resume", admin=False)
        assert acted.job["state"] == "QUEUED" and not acted.failed
        await lab.place(queued["id"])
        started = await lab.until(queued["id"], J.RUNNING)
        acted = await actions.act(sv, s, started, "interrupt", admin=False)
        assert acted.pending  # asked: the supervisor stops it
        copy = await actions.act(sv, s, started, "rerun", admin=False)
        assert copy.created and copy.job["id"] != started["id"]
        assert copy.job["owner"] == "ann" and copy.job["state"] == "QUEUED"
        with pytest.raises(Conflict, match="only a SYNC_FAILED job's push can be retried"):
            await actions.act(sv, s, copy.job, "push", admin=False)
        with pytest.raises(NotFound, match="no action restart"):
            await actions.act(sv, s, copy.job, "restart", admin=False)

    lab_run(tmp_path, test)


# --- distributed jobs: a gang of workloads ------------------------------------------------------


async def until_true(check, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not reached"
        await asyncio.sleep(0.01)


def test_a_gang_runs_every_rank_and_is_done_only_when_all_exited_0(tmp_path):
    async def test(lab: Lab):
        job_id = lab.submit(workers=2)
        await lab.place(job_id)
        job = await lab.until(job_id, J.RUNNING)
        name = lab.name(job_id)
        ranks = [name, f"{name}-r1"]
        assert lab.rt.names("create_and_start") == ranks  # rank 0 first
        specs = [lab.rt.workloads[n].spec for n in ranks]
        assert sorted(g for s in specs for g in s.gpu_ids) == ["0", "1"] and lab.held() == [
            "0",
            "1",
        ]
        assert [s.env["RANK"] for s in specs] == ["0", "1"]
        assert [s.aliases for s in specs] == [("worker-0",), ("worker-1",)]
        assert {s.network_job for s in specs} == {job_id}
        assert f"jobnet-{INSTANCE}-{job_id}" in lab.rt.networks
        assert job["message"] == "the command runs in 2 workers"
        lab.rt.workloads[ranks[0]].logs = b"rank 0 done\n"
        lab.rt.exits(ranks[1], 0)
        await asyncio.sleep(0.1)  # ten passes: one rank done, the other still runs
        assert lab.job(job_id)["state"] == J.RUNNING.value and lab.held() == ["0", "1"]
        lab.rt.exits(ranks[0], 0)
        job = await lab.until(job_id, J.DONE)
        assert (job["reason"], job["message"], job["exit_code"]) == ("EXITED", "exit code 0", 0)
        assert lab.held() == [] and lab.rt.names("remove_job_network") == [INSTANCE]
        assert b"rank 0 done" in lab.ctx.log_file(job_id, 0).read_bytes()

    lab_run(tmp_path, test)


def test_a_failed_rank_stops_the_others_and_fails_the_job_naming_it(tmp_path):
    async def test(lab: Lab):
        job_id = lab.submit(workers=2)
        await lab.place(job_id)
        await lab.until(job_id, J.RUNNING)
        name = lab.name(job_id)
        lab.rt.exits(f"{name}-r1", 3)
        job = await lab.until(job_id, J.FAILED)
        assert (job["reason"], job["message"], job["exit_code"]) == (
            "EXITED",
            "rank 1: exit code 3",
            3,
        )
        # the rank still running was stopped (SIGTERM), confirmed, before the GPUs went
        assert lab.rt.names("terminate") == [name, f"{name}-r1"]
        assert lab.rt.workloads[name].exit_code == 143 and lab.held() == []

    lab_run(tmp_path, test)


def test_a_failed_rank_with_retries_left_restarts_the_whole_gang(tmp_path):
    async def test(lab: Lab):
        job_id = lab.submit(workers=2, retries=1)
        await lab.place(job_id)
        await lab.until(job_id, J.RUNNING)
        name = lab.name(job_id)
        ranks = [name, f"{name}-r1"]
        lab.rt.exits(ranks[0], 1)
        await until_true(lambda: all(lab.rt.workloads[n].starts == 2 for n in ranks))
        job = await lab.until(job_id, J.RUNNING)
        assert job["restarts"] == 1 and lab.rt.names("start_again") == ranks
        (note,) = [e for e in job["history"] if e["reason"] == "AUTO_RESTART"]
        assert note["message"] == "rank 0: exit code 1; restart 1 of 1 (all 2 workers)"
        assert all(lab.rt.workloads[n].running for n in ranks) and lab.held() == ["0", "1"]
        lab.rt.exits(ranks[1], 2)  # no restart left
        job = await lab.until(job_id, J.FAILED)
        assert job["message"] == "rank 1: exit code 2 after 1 restarts" and lab.held() == []

    lab_run(tmp_path, test)


def test_a_new_supervisor_judges_a_gang_as_one_with_recovery_combine(tmp_path):
    """After a restart of the service the gang is one container for recovery.decide: a rank
    missing is ABSENT (the job's container lost: ERROR, the rest stopped, GPUs released)."""

    async def test(lab: Lab):
        job_id = lab.submit(workers=2)
        await lab.place(job_id)
        await lab.until(job_id, J.RUNNING)
        await lab.close()  # the service dies; the ranks run on
        name = lab.name(job_id)
        lab.rt.vanish(f"{name}-r1")
        again = JobSupervisor(lab.settings, lab.db, lab.rt, tmp_path / "logs", holder="next")
        again.leading.set()
        await housekeeping.recover(again.ctx)
        job = await lab.until(job_id, J.ERROR)
        assert (job["reason"], job["message"]) == (
            "CONTAINER_LOST",
            "the job's container disappeared",
        )
        assert not lab.rt.workloads[name].running and lab.held() == []
        await asyncio.gather(*again.tasks.values())

    lab_run(tmp_path, test)


def test_a_gang_restart_cut_short_is_finished_for_every_rank(tmp_path):
    """Found RESTARTING with one rank running and one left from the earlier run (STALE):
    the restart is finished for the whole gang, never only for the rank that ended."""

    async def test(lab: Lab):
        job_id = lab.submit(workers=2, retries=1)
        await lab.place(job_id)
        await lab.until(job_id, J.RUNNING)
        await lab.close()  # the service dies as it restarts the gang
        name = lab.name(job_id)
        await lab.ctx.move(job_id, J.RESTARTING, expect=J.RUNNING, reason="AUTO_RESTART")
        stale = lab.rt.workloads[f"{name}-r1"]
        stale.end(1)
        stale.started_at = 0.0  # it ran before the restart was recorded
        again = JobSupervisor(lab.settings, lab.db, lab.rt, tmp_path / "logs", holder="next")
        again.leading.set()
        await housekeeping.recover(again.ctx)
        job = await lab.until(job_id, J.RUNNING)
        assert (job["reason"], job["message"]) == ("RESTARTED", "restarted (the service restarted)")
        assert lab.rt.names("start_again") == [name, f"{name}-r1"]
        assert [lab.rt.workloads[n].starts for n in (name, f"{name}-r1")] == [2, 2]
        assert lab.held() == ["0", "1"]
        for task in again.tasks.values():
            task.cancel()
        await asyncio.gather(*again.tasks.values(), return_exceptions=True)

    lab_run(tmp_path, test)


def two_nodes() -> FakeRuntime:
    """A cluster of two nodes of one GPU each: a gang of two 1-GPU ranks needs both."""
    return Engine.cluster({"a": ("0",), "b": ("0",)}, images={IMAGE})


def test_a_gang_on_a_cluster_places_one_rank_per_node(tmp_path):
    async def test(lab: Lab):
        job_id = lab.submit(workers=2)
        await lab.place(job_id)
        job = await lab.until(job_id, J.RUNNING)
        name = lab.name(job_id)
        assert lab.held() == ["a/0", "b/0"] and job["node"] == "a,b"
        # each rank runs on the node of its GPU, as its record says
        where = {w["rank"]: w["node"] for w in job["workers"]}
        assert sorted(where.values()) == ["a", "b"]
        assert where == {
            0: lab.rt.workloads[name].spec.node,
            1: lab.rt.workloads[f"{name}-r1"].spec.node,
        }
        assert [lab.rt.workloads[n].spec.gpu_ids for n in (name, f"{name}-r1")] == [["0"], ["0"]]
        lab.rt.exits(name, 0)
        lab.rt.exits(f"{name}-r1", 0)
        await lab.until(job_id, J.DONE)
        assert lab.held() == []

    lab_run(tmp_path, test, runtime=two_nodes())


def test_a_rank_s_node_lost_requeues_the_gang_released_once_every_rank_is_gone(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(life, "LOST_AFTER", 0.0)

    async def test(lab: Lab):
        job_id = lab.submit(workers=2, retries=1)
        await lab.place(job_id)
        job = await lab.until(job_id, J.RUNNING)
        name = lab.name(job_id)
        ranks = [name, f"{name}-r1"]
        on_b = next(w for w in job["workers"] if w["node"] == "b")["rank"]
        healthy = ranks[1 - on_b]  # the rank on node a, which keeps running
        lab.rt.fail("remove", EngineError("the manager did not answer"), name=healthy, times=0)
        lab.rt.node_down("b")
        job = await lab.until(job_id, J.INTERRUPTING)
        assert (job["reason"], job["message"]) == (
            "NODE_LOST",
            f"its node was lost (rank {on_b}'s node: node b is down)",
        )
        # a rank the engine has not confirmed gone keeps every GPU of the gang booked
        await until_true(lambda: len(lab.rt.names("remove")) >= 4)  # tried, and again
        assert lab.held() == ["a/0", "b/0"] and lab.job(job_id)["state"] == J.INTERRUPTING.value
        assert lab.rt.workloads[healthy].running
        lab.rt.unfail("remove")
        job = await lab.until(job_id, J.QUEUED)
        assert (job["reason"], job["restarts"]) == ("NODE_LOST", 1)
        assert job["message"] == (
            "queued again to run on another node: its node was lost "
            f"(rank {on_b}'s node: node b is down); restart 1 of 1"
        )
        assert not set(ranks) & set(lab.rt.workloads) and lab.held() == []
        await lab.settle(job_id)
        # b is still down: the gang cannot be placed whole, it waits and says why
        lab.sv.leading.set()
        await lab.sv.refresh_inventory()
        await lab.sv.schedule()
        job = lab.job(job_id)
        assert job["state"] == J.QUEUED.value and lab.held() == []
        assert job["message"] == (
            "waiting for 2 workers of 1 GPU(s), all placed at once: 1 of 1 GPUs free, "
            "at most 1 on one node"
        )
        lab.rt.node_up("b")
        await lab.place(job_id)  # made anew on both nodes
        await lab.until(job_id, J.RUNNING)
        assert lab.rt.names("create_and_start") == ranks * 2 and lab.held() == ["a/0", "b/0"]

    lab_run(tmp_path, test, runtime=two_nodes())


def test_a_rank_s_node_lost_with_no_restart_left_fails_the_job(tmp_path, monkeypatch):
    monkeypatch.setattr(life, "LOST_AFTER", 0.0)

    async def test(lab: Lab):
        job_id = lab.submit(workers=2)
        await lab.place(job_id)
        job = await lab.until(job_id, J.RUNNING)
        on_a = next(w for w in job["workers"] if w["node"] == "a")["rank"]
        lab.rt.drain("a")
        job = await lab.until(job_id, J.FAILED)
        assert (job["reason"], job["message"]) == (
            "NODE_LOST",
            f"its node was lost (rank {on_a}'s node: node a is drain)",
        )
        name = lab.name(job_id)
        assert not {name, f"{name}-r1"} & set(lab.rt.workloads) and lab.held() == []
        assert ("INTERRUPTING", "NODE_LOST") in reasons(job)

    lab_run(tmp_path, test, runtime=two_nodes())


def test_the_fair_share_adds_what_the_ledger_holds_and_starts_the_lighter_users_job(tmp_path):
    """The supervisor's passes add what the GPU ledger's holders hold (a notebook's GPUs
    here) to their recent usage; with the host full, the lighter user's job goes first even
    though the heavier user's was submitted first (first come, first served would start it)."""
    lab = Lab(tmp_path, fair_share_interval=0.0)

    async def go():
        lab.sv.leading.set()
        await lab.sv.refresh_inventory()
        lab.ctx.ledger.reserve("t/notebook/ann/", "ann", "notebook", 2)
        await lab.sv.schedule()  # the first look sets the clock: nothing is added
        assert lab.sv.recent.read(utcnow(), 3600)[0] == {}
        await asyncio.sleep(0.2)
        await lab.sv.schedule()
        usage, _groups = lab.sv.recent.read(utcnow(), 3600)
        assert set(usage) == {"ann"} and 0.3 < usage["ann"] < 2.0  # 2 GPUs for about 0.2 s
        lab.ctx.ledger.release("t/notebook/ann/")
        first = lab.ctx.records.create("ann", job_spec(gpus=2), None, ())["id"]
        second = lab.ctx.records.create("bob", job_spec(gpus=2), None, ())["id"]
        await lab.sv.schedule()
        assert lab.job(second)["state"] != J.QUEUED.value
        assert lab.job(first)["state"] == J.QUEUED.value
        await lab.until(second, J.RUNNING)
        await lab.sv.stop()

    run_async(go())


# --- job arrays (sweeps) --------------------------------------------------------------------


async def submit_array(lab: Lab, **body) -> dict:
    raw = {"image": IMAGE, "command": ["python", "sweep.py"], "resources": {"gpus": 0}, **body}
    return await actions.submit(lab.sv, lab.settings, raw, owner="ann", groups=[], admin=False)


def test_an_arrays_tasks_run_parallelism_at_once_told_their_index_and_parameters(tmp_path):
    async def test(lab: Lab):
        sets = [{"lr": 0.1}, {"lr": 0.01}, {"lr": 0.001}]
        array = await submit_array(lab, parameters=sets, parallelism=2, retries=1)
        assert array["kind"] == "array" and array["state"] == "QUEUED"
        tasks = lab.job(array["id"])["tasks"]
        assert [(t["index"], t["state"], t["parameters"]) for t in tasks] == [
            (i, "QUEUED", sets[i]) for i in range(3)
        ]
        ids = [t["id"] for t in tasks]
        first = lab.job(ids[0])
        assert first["kind"] == "task" and first["array"] == array["id"]
        assert first["task_index"] == 0 and first["spec"]["task"]["parameters"] == sets[0]
        await lab.place(ids[0])
        await lab.until(ids[1], J.RUNNING)
        await lab.sv.schedule()
        assert lab.job(ids[2])["state"] == "QUEUED"  # its turn comes when one ends
        assert lab.job(ids[2])["message"] == (
            "waiting for its turn: 2 tasks of its array run (parallelism 2)"
        )
        env = lab.rt.workloads[lab.name(ids[1])].spec.env
        assert env["GPULAB_JOB_ID"] == ids[1] and env["GPULAB_ARRAY_ID"] == array["id"]
        assert (env["GPULAB_TASK_INDEX"], env["GPULAB_TASK_COUNT"]) == ("1", "3")
        assert env["GPULAB_PARAM_LR"] == "0.01" and env["GPULAB_TASK_PARAMS"] == '{"lr":0.01}'
        assert lab.job(array["id"])["state"] == "RUNNING"
        # a retry is the task's own: task 1 fails once and runs again, alone
        lab.rt.exits(lab.name(ids[1]), 3)
        await until_true(lambda: lab.job(ids[1])["restarts"] == 1)
        await lab.until(ids[1], J.RUNNING)
        lab.rt.exits(lab.name(ids[0]), 0)
        await lab.until(ids[0], J.DONE)
        await lab.sv.schedule()
        await lab.until(ids[2], J.RUNNING)
        assert lab.rt.workloads[lab.name(ids[2])].spec.env["GPULAB_PARAM_LR"] == "0.001"
        for i in (1, 2):
            lab.rt.exits(lab.name(ids[i]), 0)
        for i in (1, 2):
            await lab.until(ids[i], J.DONE)
        done = lab.job(array["id"])
        assert (done["state"], done["reason"], done["exit_code"]) == ("DONE", "TASKS_DONE", 0)
        assert done["task_counts"] == {"DONE": 3}
        assert [t["restarts"] for t in done["tasks"]] == [0, 1, 0]
        assert [e["state"] for e in done["history"]] == ["QUEUED", "RUNNING", "DONE"]
        # lists show the array as one row, with its counts
        rows, total = lab.ctx.records.page("ann", None, None, 10, 0)
        assert total == 1 and rows[0]["id"] == array["id"]
        assert rows[0]["task_counts"] == {"DONE": 3} and "tasks" not in rows[0]
        # the owner counts one job; what runs (the metrics) counts three
        assert lab.ctx.records.counts("ann") == {"DONE": 1}
        assert lab.ctx.records.counts(runs=True) == {"DONE": 3}
        assert lab.ctx.records.usage("ann")["jobs"] == 3

    lab_run(tmp_path, test)


def test_a_failed_task_fails_its_array_once_all_have_ended(tmp_path):
    async def test(lab: Lab):
        array = await submit_array(lab, completions=2)
        ids = [t["id"] for t in lab.job(array["id"])["tasks"]]
        await lab.place(ids[0])
        await lab.until(ids[1], J.RUNNING)
        lab.rt.exits(lab.name(ids[1]), 7)
        await lab.until(ids[1], J.FAILED)
        assert lab.job(array["id"])["state"] == "RUNNING"  # task 0 still runs
        lab.rt.exits(lab.name(ids[0]), 0)
        await lab.until(ids[0], J.DONE)
        failed = lab.job(array["id"])
        assert (failed["state"], failed["reason"], failed["exit_code"]) == (
            "FAILED",
            "TASK_FAILED",
            7,
        )
        assert failed["message"] == "task 1 FAILED; 1 DONE, 1 FAILED"

    lab_run(tmp_path, test)


def test_stopping_an_array_stops_its_tasks_and_deleting_it_deletes_them(tmp_path):
    async def test(lab: Lab):
        s, sv = lab.settings, lab.sv
        array = await submit_array(lab, completions=3, parallelism=1)
        ids = [t["id"] for t in lab.job(array["id"])["tasks"]]
        await lab.place(ids[0])
        await lab.until(ids[0], J.RUNNING)
        task0 = lab.job(ids[0])
        with pytest.raises(Conflict, match="rerun the array"):
            await actions.act(sv, s, task0, "rerun", admin=False)
        with pytest.raises(Conflict, match="delete the array"):
            await actions.delete(sv, task0)
        acted = await actions.act(sv, s, lab.job(array["id"]), "interrupt", admin=False)
        assert acted.pending and acted.job["state"] == "INTERRUPTING"
        for i in (1, 2):  # the queued ones at once
            assert lab.job(ids[i])["state"] == "INTERRUPTED"
        await lab.until(ids[0], J.INTERRUPTED)  # the started one by the supervisor
        await lab.until(array["id"], J.INTERRUPTED)
        assert lab.job(array["id"])["reason"] == "USER_INTERRUPT"
        assert lab.rt.running() == []
        # resumed: every interrupted task is queued again; stopped again at once
        acted = await actions.act(sv, s, lab.job(array["id"]), "resume", admin=False)
        assert acted.job["state"] == "QUEUED"
        assert {lab.job(i)["state"] for i in ids} == {"QUEUED"}
        acted = await actions.act(sv, s, acted.job, "interrupt", admin=False)
        assert acted.job["state"] == "INTERRUPTED" and not acted.pending
        await actions.delete(sv, lab.job(array["id"]))
        assert all(lab.job(i) is None for i in [array["id"], *ids])
        assert lab.ctx.records.ids() == set()

    lab_run(tmp_path, test)


def test_an_array_counts_as_one_job_against_the_quota_and_its_tasks_fill_the_queue(tmp_path):
    async def test(lab: Lab):
        lab.settings.job_quota = {"gpus": 2, "jobs": 2}
        lab.settings.max_queued_jobs = 6
        await submit_array(lab, completions=4)  # one job in quota, four in the queue
        await submit_array(lab, completions=2)
        with pytest.raises(Conflict, match="your quota allows 2 jobs"):
            await submit_array(lab, completions=1)
        lab.settings.job_quota = {"gpus": 2, "jobs": 5}
        with pytest.raises(Conflict, match="you have 6 jobs queued or running"):
            await submit_array(lab, completions=1)

    lab_run(tmp_path, test)


def test_an_arrays_end_is_told_once_and_its_tasks_tell_nothing(tmp_path):
    class Posts(list):
        def post(self, notice, notify):
            self.append(notice)

    async def test(lab: Lab):
        lab.ctx.notifier = posts = Posts()
        notify = {"on": ["done", "failed"], "webhook": "http://127.0.0.1:9/h", "email": None}
        spec = job_spec(gpus=0, completions=2, parallelism=2, notify=notify)
        tasks = [
            {**job_spec(gpus=0, completions=2, parallelism=2), "task": {"index": i}}
            for i in range(2)
        ]
        array = lab.ctx.records.create("ann", spec, "sweep", (), tasks=tasks)
        ids = [t["id"] for t in lab.job(array["id"])["tasks"]]
        await lab.place(ids[0])
        for i in ids:
            await lab.until(i, J.RUNNING)
            lab.rt.exits(lab.name(i), 0)
        for i in ids:
            await lab.until(i, J.DONE)
        await until_true(lambda: len(posts) == 1)
        assert (posts[0]["id"], posts[0]["event"], posts[0]["state"]) == (
            array["id"],
            "done",
            "DONE",
        )

    lab_run(tmp_path, test)


# --- GPU models (issue 30 item 2) --------------------------------------------------------------


def test_a_job_for_a_model_gets_its_device_and_waits_while_it_is_busy(tmp_path):
    async def test(lab: Lab):
        first = lab.submit(gpu_model="t4")
        await lab.place(first)
        await lab.until(first, J.RUNNING)
        assert lab.held() == ["1"]  # the T4, though the A100 ("0") comes first
        second = lab.submit(gpu_model="T4")
        plain = lab.submit()
        await lab.sv.schedule()
        assert lab.job(second)["state"] == J.QUEUED.value
        assert lab.job(second)["message"] == (
            "waiting for 1 GPU(s) of model 'T4': 0 of 1 such GPUs free"
        )
        await lab.until(plain, J.RUNNING)  # the A100 goes to the job behind it
        assert lab.held() == ["0", "1"]

    lab_run(tmp_path, test, gpu_models={"0": "A100", "1": "T4"})


def test_an_image_over_the_site_s_cap_is_not_pulled_to_its_end(tmp_path):
    async def test(lab: Lab):
        lab.rt.pull_bytes = 2_000_000
        job_id = lab.submit(image=PRIVATE, image_pull_policy="always", image_pull_secret="regcred")
        await lab.place(job_id)
        job = await lab.until(job_id, J.FAILED)
        assert job["reason"] == "IMAGE_PULL_FAILED" and "cap" in job["message"], job["message"]
        assert lab.rt.called("create_and_start") == []

    registry_lab(tmp_path, test, image_max_bytes="1M")


# --- the dataset cache -----------------------------------------------------------------------


def _pulls_of(lab: Lab, prefix: str) -> list[str]:
    """The cache volumes the sync helper pulled into (their names)."""
    return [
        m.volume
        for h in lab.rt.helper_configs
        if h.command and h.command[0] == "pull"
        for m in h.mounts
        if m.volume.startswith(prefix)
    ]


def _dataset(lab: Lab, name: str = "mnist", files: dict[str, str] | None = None) -> None:
    """Files under data/NAME in the lab's store; the next helpers report success."""
    for _ in range(8):
        lab.rt.script_helper(0, [json.dumps({"event": "report", "ok": True, "completed": 1})])
    root = lab.tmp / "store" / "data" / name
    root.mkdir(parents=True, exist_ok=True)
    for rel, text in (files or {"train.csv": "1,2,3\n"}).items():
        (root / rel).write_text(text)


def _mounted(lab: Lab, job_id: str) -> list[tuple[str, bool]]:
    (call,) = [c for c in lab.rt.called("create_and_start") if c.args[0].name == lab.name(job_id)]
    return [(m.volume, m.read_only) for m in call.args[0].mounts]


def test_jobs_reading_one_dataset_pull_it_once_and_mount_it_read_only(tmp_path):
    async def test(lab: Lab):
        _dataset(lab)
        ids = [lab.submit(volumes=["data@local/mnist:/data"], gpus=0) for _ in range(3)]
        for job_id in ids:
            await lab.place(job_id)
        for job_id in ids:
            await lab.until(job_id, J.RUNNING)
        prefix = f"{INSTANCE}-dataset-"
        (volume,) = set(_pulls_of(lab, prefix))
        assert len(_pulls_of(lab, prefix)) == 1 and volume.endswith("-6")  # 6 bytes
        assert [_mounted(lab, j) for j in ids] == [[(volume, True)]] * 3
        notes = [e["message"] for e in lab.job(ids[2])["history"] if e["reason"] == "SYNC"]
        assert notes == [
            f"data@local/mnist:/data:ro: the node's copy in the dataset cache ({volume})"
        ]
        # the dataset changes in the store: the next job gets a copy of its own content, the
        # running ones keep theirs
        _dataset(lab, files={"train.csv": "1,2,3,4\n"})
        later = lab.submit(volumes=["data@local/mnist:/data"], gpus=0)
        await lab.place(later)
        await lab.until(later, J.RUNNING)
        newer = _mounted(lab, later)[0][0]
        assert newer != volume and newer.endswith("-8") and (volume, "") in lab.rt.volumes
        # a writable volume is never the cache's
        rw = lab.submit(volumes=["data@local/rw:/data:rw"], gpus=0)
        await lab.place(rw)
        await lab.until(rw, J.RUNNING)
        assert not _mounted(lab, rw)[0][0].startswith(prefix)

    lab_run(tmp_path, test)


def test_a_job_waiting_for_another_s_pull_of_its_dataset_is_interrupted_at_once(tmp_path):
    from gpulab.data.datasets import cache_volume_name
    from gpulab.data.sync import VolumeSync, WorkloadData
    from gpulab.volumes import parse_volume

    async def test(lab: Lab):
        _dataset(lab)
        stores = lab.settings.storage.stores
        spec = parse_volume("data@local/mnist:/data:ro", stores)
        vol = VolumeSync(spec, "x", str(spec), "")
        data = WorkloadData(lab.rt, stores, lab.settings.sync_image, INSTANCE, "x")
        size, key = data.listed_content(vol)
        name = cache_volume_name(INSTANCE, vol, key, size)
        # the hub's process pulls it (its claim renewed for a minute)
        claim = lab.ctx.datasets.copies.claim("", name, size, 1 << 30, "hub", {})
        assert claim.outcome == "claimed"
        job_id = lab.submit(volumes=["data@local/mnist:/data"], gpus=0)
        await lab.place(job_id)
        await lab.until(job_id, J.INITIALIZING)
        await asyncio.sleep(0.2)  # it waits for the hub's pull
        lab.ctx.records.ask(job_id, "interrupt", states=frozenset({J.INITIALIZING}))
        job = await lab.until(job_id, J.INTERRUPTED)
        assert job["message"] == "interrupted before it started"
        assert lab.rt.called("create_and_start") == [] and _pulls_of(lab, name) == []

    lab_run(tmp_path, test)


def test_a_service_that_loses_its_lease_gives_its_dataset_pulls_up(tmp_path):
    """Its job tasks are cancelled (the pull is the cache's and would go on): the cache's
    pulls end with them, their claims given up, not renewed by a process that stopped acting."""

    async def test(lab: Lab):
        _dataset(lab)
        gate, real = asyncio.Event(), lab.rt.run_helper

        async def slow(spec, on_line, node=""):
            await gate.wait()
            return await real(spec, on_line, node)

        lab.rt.run_helper = slow
        job_id = lab.submit(volumes=["data@local/mnist:/data"], gpus=0)
        await lab.place(job_id)
        cache = lab.ctx.datasets
        deadline = time.monotonic() + 5
        while not cache.pulling:
            assert time.monotonic() < deadline, "no pull"
            await asyncio.sleep(0.01)
        assert [c.state for c in cache.copies.all()] == ["pulling"]
        await lab.sv._abdicate()
        assert cache.copies.all() == [] and cache.claims == set() and cache.pulling == {}

    lab_run(tmp_path, test)


def test_a_job_mounting_one_dataset_twice_gets_the_copy_at_both_paths(tmp_path):
    async def test(lab: Lab):
        _dataset(lab)
        job_id = lab.submit(volumes=["data@local/mnist:/a", "data@local/mnist:/b"], gpus=0)
        await lab.place(job_id)
        await lab.until(job_id, J.RUNNING)
        (call,) = [
            c for c in lab.rt.called("create_and_start") if c.args[0].name == lab.name(job_id)
        ]
        mounts = {m.target: (m.volume, m.read_only, m.no_copy) for m in call.args[0].mounts}
        assert mounts["/a"] == mounts["/b"] and mounts["/a"][1:] == (True, True)
        assert mounts["/a"][0].startswith(f"{INSTANCE}-dataset-")
        assert len(_pulls_of(lab, f"{INSTANCE}-dataset-")) == 1

    lab_run(tmp_path, test)


def test_the_least_recently_used_dataset_no_container_uses_makes_room(tmp_path):
    """A cap of 10 bytes: two 6-byte datasets cannot be kept together. While a running job
    uses the older one the engine refuses its removal: the new one is the job's own volume.
    Once that job and its container are gone, the older one makes room."""

    async def test(lab: Lab):
        _dataset(lab, "a", {"f": "aaaaaa"})
        _dataset(lab, "b", {"f": "bbbbbb"})
        prefix = f"{INSTANCE}-dataset-"
        first = lab.submit(volumes=["data@local/a:/data"], gpus=0)
        await lab.place(first)
        await lab.until(first, J.RUNNING)
        (old,) = _pulls_of(lab, prefix)
        second = lab.submit(volumes=["data@local/b:/data"], gpus=0)
        await lab.place(second)
        await lab.until(second, J.RUNNING)
        assert not _mounted(lab, second)[0][0].startswith(prefix)  # no room: its own volume
        assert (old, "") in lab.rt.volumes
        lab.rt.exits(lab.name(first), 0)
        await lab.until(first, J.DONE)
        await lab.settle(first)
        await housekeeping.cleanup(lab.ctx, 0.0)  # its container goes (retention 0)
        assert lab.name(first) not in lab.rt.workloads
        third = lab.submit(volumes=["data@local/b:/data"], gpus=0)
        await lab.place(third)
        await lab.until(third, J.RUNNING)
        assert (old, "") not in lab.rt.volumes
        assert _mounted(lab, third)[0][0].startswith(prefix)

    lab_run(tmp_path, test, dataset_cache_max_bytes=10)


def test_on_a_cluster_the_dataset_cache_is_per_node(tmp_path):
    """A gang of two ranks on nodes a and b pulls its dataset into each node's cache; a later
    job on a mounts a's copy (no pull). Each copy is found, listed and removed on its own
    node (the node's own engine): the volume on b is b's."""

    async def test(lab: Lab):
        _dataset(lab)
        prefix = f"{INSTANCE}-dataset-"
        gang = lab.submit(volumes=["data@local/mnist:/data"], workers=2)
        await lab.place(gang)
        job = await lab.until(gang, J.RUNNING)
        (volume,) = set(_pulls_of(lab, prefix))
        assert sorted(lab.ctx.datasets.pulls) == [("a", volume), ("b", volume)]
        assert {(volume, "a"), (volume, "b")} <= lab.rt.volumes
        assert job["node"] == "a,b"
        later = lab.submit(volumes=["data@local/mnist:/data"], gpus=0)
        await lab.place(later)
        running = await lab.until(later, J.RUNNING)
        assert len(lab.ctx.datasets.pulls) == 2 and _mounted(lab, later) == [(volume, True)]
        notes = [e["message"] for e in running["history"] if e["reason"] == "SYNC"]
        assert notes == [
            f"data@local/mnist:/data:ro: the node's copy in the dataset cache ({volume})"
        ]
        assert await lab.rt.volumes_named(prefix) == [(volume, "a"), (volume, "b")]
        with pytest.raises(EngineError, match="in use"):  # a's jobs hold a's copy
            await lab.rt.remove_volume(volume, "a")

    lab_run(tmp_path, test, runtime=two_nodes())


def test_eviction_order_as_data():
    from gpulab.data.datasets import cached_size, evictions

    held = {"a": 4, "b": 4, "c": 4}
    used = {"a": 3.0, "b": 1.0, "c": 2.0}
    assert evictions(held, used, 4, 12) == ["b"]
    assert evictions(held, used, 8, 12) == ["b", "c"]
    assert evictions(held, used, 8, 12, frozenset({"b"})) == ["c", "a"]
    assert evictions(held, used, 4, 16) == []
    assert evictions(held, used, 13, 12) is None
    assert evictions(held, used, 9, 12, frozenset({"a", "b"})) is None
    assert cached_size("t", "t-dataset-abc-123") == 123 and cached_size("t", "t-job-x-1") is None


def test_a_cached_dataset_counts_against_each_owner_s_quota_as_their_own_copy(tmp_path):
    async def test(lab: Lab):
        _dataset(lab, files={"f": "x" * 600})
        ids = [lab.submit(volumes=["data@local/mnist:/data"], gpus=0) for _ in range(2)]
        for job_id in ids:
            await lab.place(job_id)
        # whichever booked first runs (their starts race); the other is refused
        ended = [await lab.until(i, J.RUNNING, J.FAILED) for i in ids]
        (first,) = [j for j in ended if j["state"] == J.RUNNING.value]
        (refused,) = [j for j in ended if j["state"] == J.FAILED.value]  # 600 + 600 > 1000
        assert refused["reason"] == "PULL_FAILED" and "disk quota" in refused["message"]
        assert lab.ctx.disk.held(first["owner"]) == 600  # the running job's, booked
        assert len(_pulls_of(lab, f"{INSTANCE}-dataset-")) == 1

    lab_run(tmp_path, test, disk_quota=1000)


def test_a_copy_handed_to_a_starting_job_is_never_evicted_for_its_other_dataset(tmp_path):
    """Two 6-byte datasets under a 10-byte cap, in one job: the first copy is pinned until the
    job's container holds it, so the second is the job's own volume, never a reason to
    remove the first before the container mounts it."""

    async def test(lab: Lab):
        _dataset(lab, "a", {"f": "aaaaaa"})
        _dataset(lab, "b", {"f": "bbbbbb"})
        job_id = lab.submit(volumes=["data@local/a:/a", "data@local/b:/b"], gpus=0)
        await lab.place(job_id)
        await lab.until(job_id, J.RUNNING)
        (a, b) = _mounted(lab, job_id)
        assert a[0].startswith(f"{INSTANCE}-dataset-") and not b[0].startswith(f"{INSTANCE}-d")
        assert lab.rt.names("remove_volume").count(a[0]) == 1  # the stale-copy check, before
        # let go once its containers hold it (run_fresh's end, just after RUNNING is written)
        for _ in range(200):
            if [c.pins for c in lab.ctx.datasets.copies.all()] == [{}]:
                break
            await asyncio.sleep(0.01)
        assert [c.pins for c in lab.ctx.datasets.copies.all()] == [{}]  # in the database too
        assert (a[0], "") in lab.rt.volumes and lab.ctx.datasets.pinned == {}
        (pull,) = [h for h in lab.rt.helper_configs if h.mounts[0].volume == a[0]]
        assert pull.command[pull.command.index("--max-bytes") + 1] == "6"  # the listed size

    lab_run(tmp_path, test, dataset_cache_max_bytes=10)


def test_an_empty_or_changing_dataset_is_never_shared(tmp_path):
    async def test(lab: Lab):
        _dataset(lab, "other")  # (the helpers' reports)
        (lab.tmp / "store" / "data" / "empty").mkdir(parents=True)
        empty = lab.submit(volumes=["data@local/empty:/d"], gpus=0)
        await lab.place(empty)
        await lab.until(empty, J.RUNNING)
        assert not _mounted(lab, empty)[0][0].startswith(f"{INSTANCE}-dataset-")
        # a dataset written to while the cache pulls it: the copy is dropped, the job's own
        _dataset(lab, "moving", {"f": "v1"})
        original = lab.rt.run_helper

        async def writes_meanwhile(spec, on_line, node=""):
            (lab.tmp / "store" / "data" / "moving" / "f").write_text("v2!")
            return await original(spec, on_line, node)

        lab.rt.run_helper = writes_meanwhile
        moving = lab.submit(volumes=["data@local/moving:/d"], gpus=0)
        await lab.place(moving)
        await lab.until(moving, J.RUNNING)
        assert not _mounted(lab, moving)[0][0].startswith(f"{INSTANCE}-dataset-")
        assert [v for v, _ in lab.rt.volumes if v.startswith(f"{INSTANCE}-dataset-")] == []

    lab_run(tmp_path, test)


# --- exits announced by the engine (runtime/exits.py) ------------------------------------------


def test_an_announced_exit_ends_the_job_at_once_and_running_jobs_are_not_asked_every_pass(
    tmp_path,
):
    """An engine that announces exits: the watch asks it for a running job's state at an
    announcement (the job is DONE long before the next pass) and otherwise every ENGINE_LOOK
    seconds, not at every pass; an engine that announces nothing is asked at every pass."""

    async def test(lab: Lab):
        lab.rt.announcing = True
        job_id = lab.submit(gpus=0)
        await lab.place(job_id)
        await lab.until(job_id, J.RUNNING)
        name = lab.name(job_id)
        await asyncio.sleep(0.3)  # six passes of 0.05 s
        assert lab.rt.names("state").count(name) <= 2  # the first look, maybe one more
        began = time.monotonic()
        lab.rt.exits(name, 0)
        await lab.until(job_id, J.DONE, timeout=0.9)  # the pass is 0.05 s, but see below
        assert time.monotonic() - began < 0.9

    lab_run(tmp_path, test, supervisor_interval=0.05)

    async def slow(lab: Lab):
        lab.rt.announcing = True
        job_id = lab.submit(gpus=0)
        await lab.place(job_id)
        await lab.until(job_id, J.RUNNING)
        await asyncio.sleep(0.1)
        began = time.monotonic()
        lab.rt.exits(lab.name(job_id), 3)
        job = await lab.until(job_id, J.FAILED, timeout=2)
        assert time.monotonic() - began < 0.5  # woken, not at the next pass 5 s on
        assert job["exit_code"] == 3

    (tmp_path / "slow").mkdir()
    lab_run(tmp_path / "slow", slow, supervisor_interval=5.0)

    async def silent(lab: Lab):  # announces nothing: looked at every pass, as before
        job_id = lab.submit(gpus=0)
        await lab.place(job_id)
        await lab.until(job_id, J.RUNNING)
        name = lab.name(job_id)
        await asyncio.sleep(0.3)
        assert lab.rt.names("state").count(name) >= 4
        lab.rt.exits(name, 0)
        await lab.until(job_id, J.DONE)

    (tmp_path / "silent").mkdir()
    lab_run(tmp_path / "silent", silent, supervisor_interval=0.05)


def test_exit_events_wake_only_for_exits_after_the_look():
    from gpulab.runtime.exits import ExitEvents

    async def main():
        events = ExitEvents(client=None)
        loop = asyncio.get_running_loop()
        events._loop = loop
        looked = time.monotonic()
        events.announce("a", looked - 1)  # ended before the look: the look saw it
        assert await events.wait(["a", "b"], 0.05, looked) is False
        loop.call_later(0.02, events.announce, "b", time.monotonic())
        began = time.monotonic()
        assert await events.wait(["a", "b"], 5, looked) is True
        assert time.monotonic() - began < 1
        # announced after the look but before the wait began: no wait at all
        assert await events.wait(["b"], 5, looked) is True
        assert events._waiters == {}  # nothing left behind
        for i in range(5000):
            events.announce(f"n{i}", time.monotonic())
        assert len(events.exited) == 4096  # bounded, the oldest forgotten

    run_async(main())
