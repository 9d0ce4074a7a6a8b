"""The job supervisor: places queued jobs on GPUs and runs each one to its end.

One asyncio task per active job walks it through INITIALIZING (pull) → PENDING (container) →
RUNNING, then watches it: exit code (retries), time-out, hang (restart in place), interruption
and preemption requests, and finally FINALIZING (GPUs released, output pushed) → DONE, FAILED,
INTERRUPTED or SYNC_FAILED. Every decision is written to the database before it is acted on,
so a supervisor killed at any moment finds its jobs again at start-up (:meth:`recover`) from
the database and the engine's labelled containers: running containers are re-attached, never
started twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import UTC, datetime
from pathlib import Path

from ..gpus.inventory import load_inventory
from ..gpus.ledger import GpuLedger, NoGpuAvailable
from ..lifecycle import InvalidTransition, JobState, utcnow
from ..resources import container_limits
from ..runtime.docker import APIError, DockerRuntime, EngineError, NotFound
from ..runtime.network import (
    NetworkUnavailable,
    ensure_user_network,
    is_missing_network,
    network_for,
    prune_user_networks,
)
from ..runtime.objects import (
    gpu_request,
    job_container_config,
    job_container_name,
    job_workload_id,
    log_options,
    workload_labels,
)
from ..workload_data import VolumeSync, WorkloadData, push_all, push_verdict, volume_name
from .records import ACTIVE, JobRecords
from .scheduler import ActiveJob, QueuedJob, Quota, plan
from .spec import JobSpec

log = logging.getLogger(__name__)
J = JobState
RUNNER = str(Path(__file__).resolve().parent.parent / "runtime" / "job_runner.sh")
MAX_HANG_RESTARTS = 3
LOG_KEEP_BYTES = 10 * 1024 * 1024
LOG_KEEP_LINES = 200_000  # asked of the engine: the tail, not the whole log
# less CPU than this share of one core over a hang period counts as "no CPU progress"
HANG_CPU_SHARE = 0.01


def _quota(d) -> Quota:
    return Quota(gpus=d.get("gpus"), jobs=d.get("jobs"))


def _ts(iso: str | None) -> float:
    if not iso:
        return 0.0
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


class JobSupervisor:
    def __init__(self, settings, db, runtime: DockerRuntime, logs_dir: Path):
        self.s = settings
        self.records = JobRecords(db, settings.instance)
        devices = load_inventory(settings.gpu_devices, settings.discover_gpus)
        self.ledger = GpuLedger(db, settings.instance, devices)
        self.runtime = runtime
        self.logs_dir = logs_dir
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.tasks: dict[str, asyncio.Task] = {}
        self.wake = asyncio.Event()
        self._loop_task: asyncio.Task | None = None

    # --- helpers -----------------------------------------------------------------------

    async def db(self, fn, *args, **kw):
        return await asyncio.to_thread(fn, *args, **kw)

    def container_name(self, job_id: str) -> str:
        return job_container_name(self.s.instance, job_id)

    def workload(self, job_id: str) -> str:
        return job_workload_id(self.s.instance, job_id)

    def volumes(self, job_id: str, spec: JobSpec) -> list[VolumeSync]:
        name = self.container_name(job_id)
        return [VolumeSync(v, volume_name(name, v), str(v)) for v in spec.volumes]

    def data(self, job_id: str) -> WorkloadData:
        s = self.s
        return WorkloadData(
            self.runtime, s.storage.stores, s.sync_image, s.instance, self.workload(job_id)
        )

    def log_file(self, job_id: str) -> Path:
        return self.logs_dir / f"{job_id}.log"

    async def move(self, job_id: str, state: JobState, **kw) -> dict:
        return await self.db(self.records.transition, job_id, state, **kw)

    # --- the loop ----------------------------------------------------------------------

    async def start(self) -> None:
        await self.recover()
        self._loop_task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            try:
                await self.schedule()
                await self.cleanup()
            except Exception:
                log.exception("supervisor pass failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=self.s.supervisor_interval)
            self.wake.clear()

    async def schedule(self) -> None:
        jobs = await self.db(self.records.active_and_queued)
        queued, active = [], []
        for j in jobs:
            spec = j["spec"]
            gpus = int(spec["resources"]["gpus"])
            groups = frozenset(j["groups"])
            if j["state"] == J.QUEUED.value:
                queued.append(
                    QueuedJob(
                        j["id"],
                        j["owner"],
                        groups,
                        gpus,
                        int(spec["priority"]),
                        _ts(j["submitted"]),
                        bool(spec["preemptible"]),
                    )
                )
            elif j["state"] != J.FINALIZING.value:
                releasing = j["request"] in ("preempt", "interrupt") or j["state"] in (
                    J.INTERRUPTING.value,
                )
                active.append(
                    ActiveJob(
                        j["id"],
                        j["owner"],
                        groups,
                        gpus,
                        bool(spec["preemptible"]),
                        int(spec["priority"]),
                        _ts(j["running_since"] or j["updated"]),
                        over_quota=j["over_quota"],
                        releasing=releasing,
                    )
                )
        if not queued:
            return
        allocations = await self.db(self.ledger.allocations)
        held = {a["device"] for a in allocations}
        free = [d.id for d in self.ledger.devices if d.id not in held]
        notebook_gpus: dict[str, int] = {}  # count against the same per-user GPU quota
        for a in allocations:
            if a["kind"] == "notebook":
                notebook_gpus[a["owner"]] = notebook_gpus.get(a["owner"], 0) + 1
        p = plan(
            queued,
            active,
            free,
            default_quota=_quota(self.s.job_quota),
            user_quotas={u: _quota(q) for u, q in self.s.user_job_quotas.items()},
            group_quotas={g: _quota(q) for g, q in self.s.group_job_quotas.items()},
            held_outside=notebook_gpus,
        )
        for victim in p.preempt:
            log.info("preempting %s for in-quota work", victim)
            await self.db(self.records.update, victim, request="preempt")
        owners = {j["id"]: (j["owner"], j["groups"]) for j in jobs}
        for placement in p.start:
            job_id = placement.job_id
            owner, groups = owners[job_id]
            # in quota: checked again atomically, as a notebook may take GPUs meanwhile
            quota = None if placement.over_quota else self.s.gpu_quota_for(owner, groups)
            try:
                devices = await self.db(
                    self.ledger.reserve,
                    self.workload(job_id),
                    owner,
                    "job",
                    len(placement.devices),
                    quota=quota,
                )
            except NoGpuAvailable:
                continue  # a notebook took a GPU meanwhile: plan again next pass
            try:
                await self.move(
                    job_id,
                    J.INITIALIZING,
                    reason="SCHEDULED",
                    message=f"placed on GPUs {', '.join(devices) or '(none)'}"
                    + (" beyond quota (preemptible)" if placement.over_quota else ""),
                    expect=frozenset({J.QUEUED}),
                    devices=",".join(devices),
                    over_quota=int(placement.over_quota),
                    exit_code=None,
                )
            except (InvalidTransition, KeyError):
                await self.db(self.ledger.release, self.workload(job_id))
                continue
            self.spawn_task(job_id, attach=False)

    def spawn_task(self, job_id: str, attach: bool) -> None:
        if job_id in self.tasks:
            return
        self.tasks[job_id] = asyncio.create_task(self._guard(job_id, attach))

    async def _guard(self, job_id: str, attach: bool) -> None:
        try:
            await self._run(job_id, attach)
        except Exception as e:
            log.exception("job %s: supervisor fault", job_id)
            with contextlib.suppress(Exception):
                await self.finalize(job_id, J.ERROR, "SUPERVISOR_ERROR", f"platform fault: {e}")
        finally:
            self.tasks.pop(job_id, None)
            self.wake.set()

    # --- one job -------------------------------------------------------------------------

    async def _requested(self, job_id: str) -> str:
        job = await self.db(self.records.get, job_id, False)
        return job["request"] if job else ""

    async def _run(self, job_id: str, attach: bool) -> None:
        job = await self.db(self.records.get, job_id, False)
        spec = JobSpec.from_json(job["spec"])
        name = self.container_name(job_id)
        if not attach:
            # INITIALIZING: the job's data
            for vol in self.volumes(job_id, spec):
                if await self._requested(job_id) == "interrupt":
                    return await self._interrupt_before_start(job_id)
                if await self.data(job_id).nothing_to_pull(vol):
                    continue  # nothing stored there yet: nothing to pull
                outcome = await self.data(job_id).run("pull", vol)
                if not outcome.ok:
                    msg = f"pull of volume {vol.label} failed: {outcome.reason}"
                    return await self.finalize(job_id, J.FAILED, "PULL_FAILED", msg, push=False)
            if not await self.runtime.image_exists(spec.image):
                msg = f"image {spec.image} is missing on this host"
                return await self.finalize(job_id, J.FAILED, "IMAGE_MISSING", msg, push=False)
            if await self._requested(job_id) == "interrupt":
                return await self._interrupt_before_start(job_id)
            await self.move(job_id, J.PENDING, reason="CREATING", message="starting the container")
            try:
                await self._create_and_start(job_id, spec, name, job["devices"], job["owner"])
            except NetworkUnavailable as e:
                return await self.finalize(job_id, J.ERROR, "NETWORK_UNAVAILABLE", str(e))
            except Exception as e:
                msg = f"the engine could not start the job: {e}"
                return await self.finalize(job_id, J.ERROR, "ENGINE_ERROR", msg)
            await self.move(
                job_id, J.RUNNING, reason="STARTED", message="the command runs", container=name
            )
        await self._watch(job_id, spec, name)

    async def _interrupt_before_start(self, job_id: str) -> None:
        await self.move(
            job_id, J.INTERRUPTING, reason="USER_INTERRUPT", message="interrupted before it started"
        )
        await self.finalize(
            job_id, J.INTERRUPTED, "USER_INTERRUPT", "interrupted before it started", push=False
        )

    async def _create_and_start(self, job_id, spec: JobSpec, name, devices, owner) -> None:
        s = self.s
        gpu_host, gpu_env = gpu_request(devices, s.gpu_mode)
        limits = {
            **container_limits(spec.resources, s.pids_limit, s.shm_fraction).host_config(),
            **log_options(s.container_log_max_size, s.container_log_max_files),
        }
        config = job_container_config(
            image=spec.image,
            name=name,
            command=[*spec.command, *spec.args],
            env={**spec.env, **gpu_env, "GPULAB_JOB_ID": job_id, "GPULAB_JOB_NAME": spec.name},
            labels={
                **spec.labels,
                **workload_labels(s.instance, "job", owner, self.workload(job_id), devices),
                "org.gpulab.job": job_id,
            },
            user="1000:100",
            limits=limits,
            gpu_host=gpu_host,
            volumes={
                v.docker_volume: {
                    "bind": v.spec.mount,
                    "mode": "ro" if v.spec.mode == "ro" else "rw",
                }
                for v in self.volumes(job_id, spec)
            },
            runner=RUNNER,
            # only the owner's network (runtime/network.py): other users' containers are apart
            network=(network := network_for(s.network_isolation, s.instance, owner)),
        )
        client = self.runtime.client

        host = config.pop("host_config")

        def create():
            for attempt in (1, 2):
                with contextlib.suppress(NotFound):
                    client.remove_container(name, force=True)
                if network:  # joined by ID: unambiguous while a racing duplicate exists
                    host["network_mode"] = ensure_user_network(client, s.instance, owner)
                try:
                    client.create_container(host_config=client.create_host_config(**host), **config)
                    client.start(name)
                    return
                except APIError as e:
                    # pruned between our look-up and our start: make it again, once
                    if attempt == 2 or not (network and is_missing_network(e)):
                        raise

        await self.runtime.run(create)

    async def _stop_container(self, name: str, grace: float) -> None:
        with contextlib.suppress(NotFound):
            await self.runtime.run(self.runtime.client.stop, name, timeout=int(grace))

    async def _watch(self, job_id: str, spec: JobSpec, name: str) -> None:
        client = self.runtime.client
        hang = spec.hang_restart
        consecutive = 0
        last_progress = time.monotonic()
        last_cpu: int | None = None
        last_log = time.time()
        while True:
            await asyncio.sleep(self.s.supervisor_interval)
            job = await self.db(self.records.get, job_id, False)
            if job is None:
                return
            if job["request"] in ("interrupt", "preempt"):
                return await self._stop_by_request(job_id, job["request"], name)
            info = await self.runtime.inspect_container(name)
            if info is None:
                return await self.finalize(
                    job_id, J.ERROR, "CONTAINER_LOST", "the job's container disappeared"
                )
            st = info["State"]
            if not st.get("Running"):
                code = int(st.get("ExitCode", -1))
                if code == 0:
                    return await self.finalize(job_id, J.DONE, "EXITED", "exit code 0", code)
                why = "out of memory" if st.get("OOMKilled") else f"exit code {code}"
                if job["restarts"] < spec.retries:
                    await self._auto_restart(job_id, name, job["restarts"] + 1, spec, why, code)
                    consecutive, last_progress = 0, time.monotonic()
                    continue
                msg = why + (f" after {spec.retries} restarts" if spec.retries else "")
                return await self.finalize(job_id, J.FAILED, "EXITED", msg, code)
            # time-out
            started = _ts(job["running_since"])
            if started and time.time() - started > spec.timeout:
                await self.move(
                    job_id,
                    J.TIMEOUT,
                    reason="TIMEOUT",
                    message=f"time-out of {spec.timeout:g} s reached",
                )
                if job["restarts"] < spec.retries:
                    await self._auto_restart(
                        job_id, name, job["restarts"] + 1, spec, "time-out", stop_first=True
                    )
                    continue
                await self.move(
                    job_id,
                    J.INTERRUPTING,
                    reason="TIMEOUT",
                    message="SIGTERM sent after the time-out",
                )
                await self._stop_container(name, self.s.preemption_grace)
                return await self.finalize(
                    job_id, J.INTERRUPTED, "TIMEOUT", f"time-out of {spec.timeout:g} s reached"
                )
            # hang: no output and no CPU progress for the period
            if hang.enabled:
                now = time.time()
                out = await self.runtime.run(
                    client.logs, name, stdout=True, stderr=True, since=last_log, until=now
                )
                last_log = now
                stats = await self.runtime.run(client.stats, name, stream=False, one_shot=True)
                cpu = int(stats.get("cpu_stats", {}).get("cpu_usage", {}).get("total_usage", 0))
                if last_cpu is None:
                    last_cpu = cpu  # CPU time at the last sign of progress (or restart)
                # progress is real work since the mark: a restart's own few ms do not count
                busy = (cpu - last_cpu) > HANG_CPU_SHARE * hang.period * 1e9
                # the runner's own notes ("[gpulab] ...") are not the command's progress
                out = [ln for ln in out.splitlines() if not ln.startswith(b"[gpulab]")]
                if out or busy:
                    last_progress, consecutive, last_cpu = time.monotonic(), 0, cpu
                elif time.monotonic() - last_progress > hang.period:
                    consecutive += 1
                    if consecutive > MAX_HANG_RESTARTS:
                        await self._stop_container(name, 0)
                        msg = (
                            f"no progress for {hang.period:g} s after "
                            f"{MAX_HANG_RESTARTS} restarts in place"
                        )
                        return await self.finalize(job_id, J.FAILED, "HANG", msg)
                    await self.db(
                        self.records.note,
                        job_id,
                        "fault-recovery",
                        "HANG_RESTART",
                        f"no output and no CPU progress for {hang.period:g} s: command "
                        f"restarted in place ({consecutive} of {MAX_HANG_RESTARTS})",
                        hang_restarts=job["hang_restarts"] + 1,
                    )
                    await self._restart_in_place(name)
                    last_progress, last_cpu = time.monotonic(), None

    async def _auto_restart(
        self,
        job_id: str,
        name: str,
        n: int,
        spec: JobSpec,
        why: str,
        exit_code: int | None = None,
        stop_first: bool = False,
    ) -> None:
        """RESTARTING -> RUNNING: the same container runs its command again (restart n)."""
        await self.move(
            job_id,
            J.RESTARTING,
            reason="AUTO_RESTART",
            message=f"{why}; restart {n} of {spec.retries}",
            exit_code=exit_code,
            restarts=n,
        )
        if stop_first:
            await self._stop_container(name, self.s.preemption_grace)
        await self.runtime.run(self.runtime.client.start, name)
        # a time-out restart gets a new time-out window; a failure restart keeps its own
        fresh = {"running_since": utcnow()} if stop_first else {}
        await self.move(
            job_id,
            J.RUNNING,
            reason="RESTARTED",
            message=f"restart {n} of {spec.retries}",
            **fresh,
        )

    async def _restart_in_place(self, name: str) -> None:
        client = self.runtime.client

        def restart():
            ex = client.exec_create(
                name,
                ["sh", "-c", "touch /tmp/.gpulab-restart && kill -KILL $(cat /tmp/.gpulab-child)"],
                user="1000:100",
            )
            client.exec_start(ex["Id"])

        await self.runtime.run(restart)

    async def _stop_by_request(self, job_id: str, request: str, name: str) -> None:
        grace = self.s.preemption_grace
        if request == "preempt":
            await self.move(
                job_id,
                J.INTERRUPTING,
                reason="PREEMPTED",
                message=f"its GPUs are needed by in-quota work: SIGTERM, {grace:g} s to checkpoint",
            )
            await self._stop_container(name, grace)
            await self.save_logs(job_id, name)
            job = await self.db(self.records.get, job_id, False)
            spec = JobSpec.from_json(job["spec"])
            ok, message = push_verdict(
                await push_all(self.data(job_id), self.volumes(job_id, spec))
            )
            with contextlib.suppress(NotFound):
                await self.runtime.run(self.runtime.client.remove_container, name, force=True)
            await self.db(self.ledger.release, self.workload(job_id))
            await self.move(
                job_id,
                J.QUEUED,
                reason="PREEMPTED",
                message="re-queued after preemption; " + message,
                request="",
                devices="",
                over_quota=0,
                container="",
            )
            return
        await self.move(
            job_id,
            J.INTERRUPTING,
            reason="USER_INTERRUPT",
            message=f"SIGTERM sent, {grace:g} s grace",
        )
        await self._stop_container(name, grace)
        await self.finalize(job_id, J.INTERRUPTED, "USER_INTERRUPT", "interrupted by its owner")

    async def save_logs(self, job_id: str, name: str) -> None:
        """Keep the last LOG_KEEP_BYTES of the container's output in the logs directory.

        The engine is asked for the tail only (LOG_KEEP_LINES lines), read as a stream into a
        buffer that never holds more than LOG_KEEP_BYTES plus one chunk: however much a job
        printed, saving its log costs bounded memory."""

        def save():
            kept = bytearray()
            try:
                stream = self.runtime.client.logs(
                    name, stdout=True, stderr=True, stream=True, tail=LOG_KEEP_LINES
                )
                try:
                    for chunk in stream:
                        kept += chunk
                        if len(kept) > 2 * LOG_KEEP_BYTES:
                            del kept[:-LOG_KEEP_BYTES]
                finally:
                    with contextlib.suppress(Exception):
                        stream.close()
            except NotFound:
                return
            self.log_file(job_id).write_bytes(bytes(kept[-LOG_KEEP_BYTES:]))

        await asyncio.to_thread(save)

    async def finalize(
        self,
        job_id: str,
        outcome: JobState,
        reason: str,
        message: str,
        exit_code: int | None = None,
        push: bool = True,
    ) -> None:
        """FINALIZING: release the GPUs, keep the logs, push the output, then the outcome."""
        job = await self.db(self.records.get, job_id, False)
        state = JobState(job["state"])
        if state in (J.QUEUED, J.INITIALIZING, J.PENDING, J.RESTARTING):
            # its command is not running: nothing new to push, straight to the outcome
            await self.db(self.ledger.release, self.workload(job_id))
            await self.save_logs(job_id, self.container_name(job_id))
            await self.move(
                job_id,
                outcome,
                reason=reason,
                message=message,
                exit_code=exit_code,
                request="",
                devices="",
            )
            return
        if state is not J.FINALIZING:
            await self.move(
                job_id,
                J.FINALIZING,
                reason=reason,
                message=message,
                exit_code=exit_code,
                request=outcome.value,
            )
        await self.db(self.ledger.release, self.workload(job_id))
        name = self.container_name(job_id)
        await self.save_logs(job_id, name)
        ok, pushed = True, ""
        if push:
            spec = JobSpec.from_json(job["spec"])
            ok, pushed = push_verdict(await push_all(self.data(job_id), self.volumes(job_id, spec)))
        if not ok:
            await self.move(
                job_id, J.SYNC_FAILED, reason="PUSH_FAILED", message=pushed, request=outcome.value
            )
            return
        extra = f"; {pushed}" if pushed and pushed != "compute released" else ""
        await self.move(
            job_id,
            outcome,
            reason=reason,
            message=message + extra,
            exit_code=exit_code,
            request="",
            devices="",
        )

    async def retry_push(self, job_id: str) -> dict:
        job = await self.db(self.records.get, job_id, False)
        outcome = JobState(job["request"] or J.DONE.value)
        await self.move(
            job_id, J.FINALIZING, reason="PUSH_RETRY", message="push retried", request=outcome.value
        )
        await self.finalize(
            job_id, outcome, job["reason"], "output pushed after a retry", job["exit_code"]
        )
        return await self.db(self.records.get, job_id)

    async def cleanup(self) -> None:
        """Remove finished jobs' containers and data volumes after the retention delay (the
        records and saved logs stay). A SYNC_FAILED job keeps both: its volumes hold the
        output that is not pushed yet (a retried push, then the delay, removes them)."""
        now = utcnow().timestamp()
        removed_any = False
        for job_id, container, updated, state, spec in await self.db(
            self.records.ended_with_container
        ):
            if state == J.SYNC_FAILED.value:
                continue
            if now - updated.timestamp() > self.s.job_container_retention:
                with contextlib.suppress(NotFound):
                    await self.runtime.run(
                        self.runtime.client.remove_container, container, force=True
                    )
                try:
                    for vol in self.volumes(job_id, JobSpec.from_json(spec)):
                        await self.runtime.remove_volume(vol.docker_volume)
                except EngineError as e:  # in use (a push retry?): try again next pass
                    log.warning("job %s: volumes not removed yet: %s", job_id, e)
                    continue
                await self.db(self.records.update, job_id, container="")
                removed_any = True
        if removed_any:
            await self.prune_networks()

    # --- restart safety ------------------------------------------------------------------

    async def recover(self) -> None:
        """Rebuild the world after a (possibly violent) restart: no job lost, none run twice."""
        jobs = await self.db(self.records.list, None, {s.value for s in ACTIVE})
        for j in jobs:
            job_id, state = j["id"], JobState(j["state"])
            name = self.container_name(job_id)
            info = await self.runtime.inspect_container(name)
            running = bool(info and info["State"].get("Running"))
            if state is J.FINALIZING:
                outcome = JobState(j["request"] or J.ERROR.value)
                self._background(
                    self.finalize(job_id, outcome, j["reason"], j["message"], j["exit_code"])
                )
            elif state in (J.INITIALIZING, J.PENDING) and not running:
                # nothing of the command ran: queue it again (its pull is incremental)
                with contextlib.suppress(NotFound):
                    if info:
                        await self.runtime.run(
                            self.runtime.client.remove_container, name, force=True
                        )
                await self.db(self.ledger.release, self.workload(job_id))
                await self.move(
                    job_id,
                    J.QUEUED,
                    reason="SERVICE_RESTART",
                    message="re-queued: the service restarted before it ran",
                    devices="",
                    over_quota=0,
                )
            elif info is None:
                self._background(
                    self.finalize(
                        job_id,
                        J.ERROR,
                        "CONTAINER_LOST",
                        "the job's container disappeared while the service was down",
                    )
                )
            else:
                if state in (J.PENDING, J.RESTARTING) and running:
                    await self.move(
                        job_id,
                        J.RUNNING,
                        reason="RECOVERED",
                        message="found running after a service restart",
                        container=name,
                    )
                elif state is J.RESTARTING:
                    await self.runtime.run(self.runtime.client.start, name)
                    await self.move(
                        job_id,
                        J.RUNNING,
                        reason="RESTARTED",
                        message="restart completed after a service restart",
                    )
                elif state is J.TIMEOUT or state is J.INTERRUPTING and not j["request"]:
                    await self.db(self.records.update, job_id, request="interrupt")
                self.spawn_task(job_id, attach=True)
        live = [
            self.workload(j["id"])
            for j in await self.db(self.records.list, None, {s.value for s in ACTIVE})
        ]
        await self.db(self.ledger.reconcile, live, "job", 0)
        await self.prune_networks()

    async def prune_networks(self) -> None:
        """Best effort: remove users' networks that no container uses any more (notebooks'
        included), so that they do not hold the engine's address pools."""
        try:
            gone = await self.runtime.run(prune_user_networks, self.runtime.client, self.s.instance)
        except EngineError as e:
            log.warning("networks not pruned: %s", e)
            return
        if gone:
            log.info("removed the networks of %s (no container left)", ", ".join(gone))

    def _background(self, coro) -> None:
        task = asyncio.create_task(coro)
        self.tasks[f"bg-{id(task)}"] = task
        task.add_done_callback(lambda t: self.tasks.pop(f"bg-{id(t)}", None))

    def interrupt_queued(self) -> None:
        self.wake.set()


def iso_now() -> str:
    return datetime.now(UTC).isoformat()
