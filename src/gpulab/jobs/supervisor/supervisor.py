"""The job supervisor: places queued jobs on GPUs and runs each one to its end.

One asyncio task per active job walks it through INITIALIZING (pull) → PENDING (container) →
RUNNING, then watches it (``life.py``; its ending: ``ending.py``). Every decision is written
to the database (a compare-and-set on the state it expects) before it is acted on, so a
supervisor killed at any moment finds its jobs again at start-up from the database and the
engine's labelled containers (``recovery.decide``): running containers are re-attached, never
started twice.

Only the holder of the database's supervisor lease acts (``lease.py``): a second service on
the same database waits in standby until the lease expires.

The parts are handed one :class:`~.context.JobContext` (the records, ledgers, ``Runtime``,
settings, secrets): this module holds the lease, the schedule pass and each job's task guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from ...data.datasets import DatasetCache, DatasetCopies
from ...disk_ledger import DiskLedger
from ...durations import format_duration
from ...gpus.inventory import node_of
from ...gpus.ledger import GpuLedger, GpuQuotaExceeded, NoGpuAvailable
from ...gpus.placement import choose_gang
from ...gpus.recent_usage import RecentUsage
from ...gpus.waits import GpuWaits
from ...lifecycle import InvalidTransition, JobState
from ...metrics import JOB_QUEUE_WAIT
from ...notifier import Notifier
from ...runtime.base import EngineUnreachable, Runtime
from ...secrets import store_for
from ..gang import decode_devices, encode_devices
from ..queue import NOTEBOOK, fair_share_now, waiting_notebooks, want_of
from ..records import JobRecords
from ..scheduler import ActiveJob, QueuedJob, plan, queue_order
from . import housekeeping
from .context import JobContext
from .lease import SupervisorLease
from .life import carry_on, run_fresh, ts

log = logging.getLogger("gpulab.jobs.supervisor")
J = JobState
#: seconds between two adoptions of the same task-less active job
ADOPT_EVERY = 5.0
#: seconds between two removals of queue entries whose spawn is gone (past their wait limit)
EXPIRE_EVERY = 30.0
#: states in which the scheduler may ask a job to give its GPUs back
PREEMPTIBLE = frozenset({J.INITIALIZING, J.PENDING, J.RUNNING, J.RESTARTING})


class JobSupervisor:
    def __init__(self, settings, db, runtime: Runtime, logs_dir: Path, holder=None):
        self.s = settings
        logs_dir.mkdir(parents=True, exist_ok=True)
        self.ctx = JobContext(
            settings=settings,
            records=JobRecords(db, settings.instance),
            ledger=GpuLedger.for_runtime(db, settings, runtime),
            disk=DiskLedger(db, settings.instance),
            runtime=runtime,
            secrets=store_for(settings, db),  # revealed into a job's container only
            logs_dir=logs_dir,
            spawn=self.spawn_task,
            notifier=Notifier.from_settings(settings),
            datasets=DatasetCache(DatasetCopies(db, settings.instance), settings, runtime),
        )
        self.records, self.ledger, self.disk = self.ctx.records, self.ctx.ledger, self.ctx.disk
        self.runtime, self.secrets, self.logs_dir = runtime, self.ctx.secrets, logs_dir
        self.lease = SupervisorLease(
            db, f"{settings.instance}/supervisor", settings.supervisor_lease_ttl, holder
        )
        self.tasks: dict[str, asyncio.Task] = {}
        self.wake = asyncio.Event()
        self.leading = asyncio.Event()  # set while this process holds the lease
        self._loop_task: asyncio.Task | None = None
        self._lease_task: asyncio.Task | None = None
        self._recovered = False
        self._last_sweep = 0.0
        self._adopted: dict[str, float] = {}  # job id -> when a task-less job was last adopted
        self._waiting: dict[str, str] = {}  # job id -> the waiting message last written
        self.recent = RecentUsage(db, settings.instance)
        self.waits = GpuWaits(db, settings.instance)
        self._told: dict[str, tuple[int, str]] = {}  # waiting notebook -> (place, message)
        self._expired_at = 0.0  # when the queue's expired rows were last removed
        self._accrued_at: float | None = None  # the fair share's last look (None: not yet)

    # --- what the service asks -----------------------------------------------------------

    async def db(self, fn, *args, **kw):
        return await self.ctx.db(fn, *args, **kw)

    def container_name(self, job_id: str) -> str:
        return self.ctx.container_name(job_id)

    def workload(self, job_id: str) -> str:
        return self.ctx.workload(job_id)

    def log_file(self, job_id: str, rank: int | None = None) -> Path:
        return self.ctx.log_file(job_id, rank)

    def saved_logs(self, job_id: str) -> list[Path]:
        return self.ctx.saved_logs(job_id)

    async def remove_from_engine(self, job_id: str, spec: dict, node: str) -> None:
        """Remove an ended job's containers and volumes (a DELETE); the record stays."""
        await housekeeping.remove_from_engine(self.ctx, job_id, spec, node)

    async def retry_push(self, job_id: str) -> dict:
        """SYNC_FAILED → FINALIZING (a compare-and-set), then the push runs in the job's own
        supervised task, like any finalization: a fault or a restart carries it on. The
        leader waits for it and answers with the outcome (or SYNC_FAILED again); a service
        in standby answers FINALIZING, and the leader adopts the job within seconds."""
        job = await self.db(self.records.get, job_id, False)
        if job is None:
            raise KeyError(job_id)
        outcome = JobState(job.get("outcome") or J.DONE.value)
        await self.ctx.move(
            job_id,
            J.FINALIZING,
            expect=J.SYNC_FAILED,
            reason="PUSH_RETRY",
            message="push retried",
            outcome=outcome.value,
        )
        self.spawn_task(job_id, attach=True)
        task = self.tasks.get(job_id)
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(task)
        else:
            self.wake.set()
        return await self.db(self.records.get, job_id)

    async def request_push(self, job_id: str) -> tuple[dict, bool]:
        """The owner's "push now" of a RUNNING job, written to its record (the leader's
        watch of the job starts it within a look, on any service); (the record, whether it
        was asked now: False while one is asked or runs)."""
        job, asked = await self.db(self.records.request_push, job_id)
        return job, asked

    # --- the loop ----------------------------------------------------------------------

    async def refresh_inventory(self) -> None:
        """A cluster's nodes and GPUs, as the engine reports them now (one host: fixed)."""
        try:
            changed = await self.ledger.refresh(self.runtime)
        except Exception as e:
            log.warning("cluster inventory not read: %s", e)
            return
        if changed:
            nodes, devices = self.ledger.nodes or [], self.ledger.devices
            log.info("cluster: nodes %s, %d GPUs", ", ".join(nodes) or "(none)", len(devices))

    async def start(self) -> None:
        """Start acting once the lease is ours (at once, unless another service holds it)."""
        await self.refresh_inventory()
        self._lease_task = asyncio.create_task(self._keep_lease())
        self._loop_task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        """Stop acting and give the lease up (a clean shutdown; tests)."""
        for task in (self._lease_task, self._loop_task):
            if task:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._abdicate()
        with contextlib.suppress(Exception):
            await self.db(self.lease.release)
        if self.ctx.notifier is not None:
            await self.ctx.notifier.close()
        if self.ctx.datasets is not None:  # what it still pins lapses within a lease
            await self.ctx.datasets.close()

    async def _abdicate(self) -> None:
        """Lost the lease (or stopping): stop every job task; the containers run on, and
        the next holder carries them on from the database and the engine."""
        self.leading.clear()
        self.ctx.live.cancel_all()
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.tasks.clear()
        if self.ctx.datasets is not None:  # its pulls end, their claims given up
            await self.ctx.datasets.close()

    async def _keep_lease(self) -> None:
        """Renew the lease on a task of its own (never behind a long pass), and stop acting
        as soon as holding it is not certain: when another holds it, when the term changed
        behind our back, or 0.8 ttl after the last renewal the database confirmed (the
        standby waits a whole ttl, so the two never act at once)."""
        ttl = self.s.supervisor_lease_ttl
        loop = asyncio.get_running_loop()
        last_ok, term = None, None
        while True:
            try:
                # a renewal stuck behind a locked database must not outlive what it proves
                state = await asyncio.wait_for(self.db(self.lease.acquire), timeout=ttl / 2)
            except Exception as e:
                log.warning("supervisor lease not renewed: %s", e or type(e).__name__)
                state = None
            now = loop.time()
            if state is not None and state.held:
                if self.leading.is_set() and term is not None and state.term != term:
                    log.error("supervisor lease changed hands meanwhile: starting over")
                    await self._abdicate()
                last_ok, term = now, state.term
                if not self.leading.is_set():
                    log.info("supervisor lease taken (term %d): acting on jobs", state.term)
                    self._recovered = False
                    self.leading.set()
                    self.wake.set()
            elif self.leading.is_set() and (
                state is not None or last_ok is None or now - last_ok > 0.8 * ttl
            ):
                log.error("supervisor lease lost: stopping every job task (standby)")
                await self._abdicate()
            elif state is not None:
                log.info(
                    "standby: the supervisor lease is held by %s for %.0f s more",
                    state.holder,
                    state.expires_in,
                )
            await asyncio.sleep(max(0.1, ttl / 4))

    async def _loop(self) -> None:
        while True:
            await self.refresh_inventory()
            if self.leading.is_set():
                try:
                    if not self._recovered:
                        await housekeeping.recover(self.ctx)
                        self._recovered = True
                    await self.schedule()
                    self._last_sweep = await housekeeping.cleanup(self.ctx, self._last_sweep)
                except EngineUnreachable as e:  # said in a line, not a traceback: not a fault
                    log.warning("supervisor pass failed: %s", e)
                except Exception:
                    # recovery is tried again on the next pass: nothing is scheduled before
                    log.exception("supervisor pass failed")
            wait = self.s.supervisor_interval if self.leading.is_set() else 1.0
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation
            # that arrives as the wake event is set (CPython gh-86296), and stop() then waited
            # for this loop for ever (seen in a full test run: test_supervisor's whole loop)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self.wake.wait()
            self.wake.clear()

    async def accrue_usage(self, jobs: list[dict]) -> None:
        """Add what the GPU ledger's holders held since the last look to their recent usage
        (the fair share), at most every ``fair_share_interval`` seconds; the first look
        after a start only sets the clock (time the service was down is not counted)."""
        now = time.time()
        last = self._accrued_at
        if last is not None and now - last < self.s.fair_share_interval:
            return
        self._accrued_at = now
        if last is None:
            return
        held: dict[str, float] = {}
        for a in await self.db(self.ledger.allocations):
            held[a["owner"]] = held.get(a["owner"], 0.0) + a["gpus"]
        groups = {j["owner"]: j["groups"] for j in jobs}  # what jobs say of their owners
        await self.db(
            self.recent.accrue,
            held,
            now - last,
            datetime.fromtimestamp(now, UTC),
            self.s.fair_share_half_life,
            groups,
        )

    async def schedule(self) -> None:
        jobs = await self.db(self.records.active_and_queued)
        await self.accrue_usage(jobs)
        self._adopt([j for j in jobs if j["state"] != J.QUEUED.value])
        queued, active = [], []
        cap = self.s.max_job_workers
        running: dict[str, int] = {}  # workers of each owner's active jobs
        for j in jobs:
            if j["state"] not in (J.QUEUED.value, J.FINALIZING.value):
                n = int(j["spec"].get("workers") or 1)
                running[j["owner"]] = running.get(j["owner"], 0) + n
        for j in jobs:
            spec = j["spec"]
            gpus = int(spec["resources"]["gpus"]) * int(spec.get("workers") or 1)
            groups = frozenset(j["groups"])
            if j["state"] == J.QUEUED.value:
                n = int(spec.get("workers") or 1)
                if running.get(j["owner"], 0) + n > cap:  # waits for its own to end
                    await self._say(
                        j["id"],
                        f"waiting: your jobs have {running.get(j['owner'], 0)} workers running "
                        f"and this one needs {n}; at most {cap} run at once",
                    )
                    continue
                queued.append(
                    QueuedJob(
                        j["id"],
                        j["owner"],
                        groups,
                        gpus,
                        int(spec["priority"]),
                        ts(j["submitted"]),
                        bool(spec["preemptible"]),
                        workers=n,
                        array=j["array"],
                        parallelism=int(spec.get("parallelism") or 0),
                        index=j["task_index"] or 0,
                        want=want_of(spec),
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
                        ts(j["running_since"] or j["updated"]),
                        over_quota=j["over_quota"],
                        releasing=releasing,
                        devices=tuple(
                            d
                            for ds in decode_devices(j["devices"], int(spec.get("workers") or 1))
                            for d in ds
                        ),
                        array=j["array"],
                    )
                )
        # a write, so not at every pass: an expired row is left out of waiting() meanwhile
        if time.time() - self._expired_at >= EXPIRE_EVERY:
            self._expired_at = time.time()
            if await self.db(self.waits.expire):
                log.info("removed the queue entries of notebook spawns that are gone")
        waits = {w["workload"]: w for w in await self.db(self.waits.waiting)}
        queued += waiting_notebooks(waits.values())
        if not queued:
            return
        fs = await self.db(
            fair_share_now, self.s, self.recent, [(j.owner, j.groups) for j in queued]
        )
        queued = [replace(j, standing=fs.of(j.owner, j.groups)) for j in queued]
        active = [replace(a, standing=fs.of(a.owner, a.groups)) for a in active]
        allocations = await self.db(self.ledger.allocations)
        held = {a["device"] for a in allocations}
        # jobs take whole GPUs: the devices no one holds any share of, unshareable ones first
        free = [
            d.key
            for d in sorted(self.ledger.devices, key=lambda d: self.ledger.slots(d) > 0)
            if d.key not in held
        ]
        notebook_gpus: dict[str, float] = {}  # count against the same per-user GPU quota
        for a in allocations:
            if a["kind"] == "notebook":
                weight = self.ledger.weight(a["device"], a["share"])
                notebook_gpus[a["owner"]] = notebook_gpus.get(a["owner"], 0) + weight
        quotas = self.s.quotas()
        p = plan(
            queued,
            active,
            free,
            default_quota=quotas.default,
            user_quotas=quotas.per_user,
            group_quotas=quotas.per_group,
            held_outside=notebook_gpus,
            node_of=node_of if self.ledger.clustered else None,
            spread=self.ledger.policy == "spread",
            devices={d.key: d for d in self.ledger.devices},
        )
        for victim in p.preempt:
            log.info("preempting %s for in-quota work", victim)
            # compare-and-set: only a job still running is asked, an interrupt is never replaced
            with contextlib.suppress(InvalidTransition, KeyError):
                await self.db(self.records.ask, victim, "preempt", states=PREEMPTIBLE)
        workers = {j["id"]: int(j["spec"].get("workers") or 1) for j in jobs}
        await self._say_turns(jobs, queued, p)
        await self._say_why_waiting_for_model([j for j in queued if j.kind == "job"], p, free)
        await self._say_why_waiting(
            [j for j in queued if j.kind == "job" and not j.want], p, free, workers
        )
        for placement in p.start:
            if placement.job_id.startswith(NOTEBOOK):
                await self._grant(waits[placement.job_id.removeprefix(NOTEBOOK)], p.held)
        await self._tell_waiting_notebooks(queued, p, free, jobs)
        owners = {j["id"]: (j["owner"], j["groups"]) for j in jobs}
        specs = {j["id"]: j["spec"] for j in jobs}
        queued_since = {j["id"]: ts(j["updated"]) for j in jobs}
        for placement in p.start:
            job_id = placement.job_id
            if job_id.startswith(NOTEBOOK):
                continue
            owner, groups = owners[job_id]
            spec = specs[job_id]
            workers = int(spec.get("workers") or 1)
            if running.get(owner, 0) + workers > cap:  # two of one owner's in one plan
                continue
            running[owner] = running.get(owner, 0) + workers
            # in quota: checked again atomically, as a notebook may take GPUs meanwhile
            quota = None if placement.over_quota else self.s.gpu_quota_for(owner, groups)
            try:
                per_rank = await self.db(
                    self.ledger.reserve_gang,
                    self.workload(job_id),
                    owner,
                    "job",
                    len(placement.devices) // workers,
                    workers,
                    quota=quota,
                    want=want_of(spec),
                    # never what the plan set aside for a job waiting before this one
                    avoid=p.held,
                )
                devices = [d for ds in per_rank for d in ds]
                # each worker's node, by rank (a CPU job's workers: all on one node), kept
                # after the GPUs go: the end of the job finds each node's volumes by it
                nodes = [node_of(ds[0]) for ds in per_rank if ds]
                node = (
                    ",".join(nodes)
                    if devices
                    else await self.db(self.ledger.node_for_cpu, want_of(spec))
                )
            except NoGpuAvailable:
                # a notebook took a GPU meanwhile, or no single node has enough free: plan
                # again next pass (the scheduler counts GPUs; the ledger finds the nodes)
                await self.db(self.ledger.release, self.workload(job_id))
                continue
            where = f"GPUs {', '.join(devices)}" if devices else "no GPU"
            if workers > 1:
                where = f"{workers} workers, " + where
            try:
                await self.ctx.move(
                    job_id,
                    J.INITIALIZING,
                    reason="SCHEDULED",
                    message=f"placed: {where}"
                    + (f" of node {node}" if node and not devices else "")
                    + (" beyond quota (preemptible)" if placement.over_quota else ""),
                    expect=frozenset({J.QUEUED}),
                    devices=encode_devices(per_rank),
                    node=node,
                    over_quota=int(placement.over_quota),
                    exit_code=None,
                    # named from the start: a job that ends before its container exists still
                    # has its pulled volumes removed by cleanup() after the retention delay
                    container=self.container_name(job_id),
                )
            except Exception as e:  # refused (a race), or the database failed after reserving
                if not isinstance(e, InvalidTransition | KeyError):
                    log.exception("job %s: not placed", job_id)
                await self.db(self.ledger.release, self.workload(job_id))
                continue
            JOB_QUEUE_WAIT.observe(max(0.0, time.time() - queued_since[job_id]))
            self.spawn_task(job_id, attach=False)

    async def _say_why_waiting(
        self, queued: list[QueuedJob], p, free: list[str], workers: dict[str, int]
    ) -> None:
        """A queued job that waits for GPUs says so in its message: how many it asked for,
        and how many are free (on one node, on a cluster). Written only when it changes."""
        starting = {pl.job_id for pl in p.start}
        per_node: dict[str, list[str]] = {}
        for key in free:
            per_node.setdefault(node_of(key), []).append(key)
        most = max((len(ds) for ds in per_node.values()), default=0)
        total = len(self.ledger.devices)
        for job in queued:
            n = workers.get(job.id, 1)
            each = job.gpus // n
            if job.id in starting or job.gpus == 0:
                continue
            if n == 1 and job.gpus <= most:
                continue  # not waiting for GPUs (a quota, a preemption under way)
            if n > 1 and choose_gang(per_node, each, n):
                continue
            if n > 1:
                msg = (
                    f"waiting for {n} workers of {each} GPU(s), all placed at once: "
                    f"{len(free)} of {total} GPUs free"
                    + (f", at most {most} on one node" if self.ledger.clustered else "")
                )
            elif self.ledger.clustered:
                msg = (
                    f"waiting for {job.gpus} GPU(s) free on one node: {len(free)} of {total} "
                    f"free across the cluster, at most {most} on one node"
                )
            else:
                msg = f"waiting for {job.gpus} GPU(s): {len(free)} of {total} free"
            await self._say(job.id, msg)

    async def _say_why_waiting_for_model(self, queued: list[QueuedJob], p, free: list[str]):
        """A queued job that asks for a GPU model or a node pool and waits for such GPUs
        says so: how many it asked for, and how many of those are free of how many."""
        starting = {pl.job_id for pl in p.start}
        for job in queued:
            if not job.want or job.id in starting or job.gpus == 0:
                continue
            mine = self.ledger.wanted(job.want)
            keys = {d.key for d in mine}
            per_node: dict[str, list[str]] = {}
            for key in free:
                if key in keys:
                    per_node.setdefault(node_of(key), []).append(key)
            idle = sum(len(ds) for ds in per_node.values())
            n = max(1, job.workers)
            if choose_gang(per_node, job.gpus // n, n):
                continue  # not waiting for GPUs (a quota, a preemption under way)
            await self._say(
                job.id,
                f"waiting for {job.gpus} GPU(s){job.want.text()}: {idle} of {len(mine)} "
                "such GPUs free" + (" (all placed at once)" if job.workers > 1 else ""),
            )

    async def _grant(self, wait: dict, held: Sequence[str] = ()) -> None:
        """A waiting notebook's turn: its GPUs booked in the ledger (the ledger chooses them,
        never one the plan ``held`` for a job before it, with the owner's GPU quota checked
        again in the same transaction), then its row marked granted; a row gone meanwhile (the
        spawn gave up) gets nothing: released again."""
        workload, owner = wait["workload"], wait["owner"]
        try:
            await self.db(
                self.ledger.reserve,
                workload,
                owner,
                "notebook",
                wait["gpus"],
                quota=self.s.gpu_quota_for(owner, wait["groups"]),
                want=want_of(wait),
                avoid=held,
            )
        except (NoGpuAvailable, GpuQuotaExceeded):  # taken meanwhile: the next pass plans again
            return
        if await self.db(self.waits.grant, workload, wait):
            log.info("notebook %s: %s GPU(s) booked after its wait", workload, wait["gpus"])
        else:
            await self.db(self.ledger.release, workload)

    async def _tell_waiting_notebooks(
        self, queued: list[QueuedJob], p, free: list[str], jobs: list[dict]
    ) -> None:
        """Each waiting notebook's place in line (the order the plan considered the queue
        in) and what it waits for, written to its row when it changes; its spawn shows it."""
        starting = {pl.job_id for pl in p.start}
        line = [q for q in sorted(queued, key=queue_order) if q.id not in starting]
        total = len(self.ledger.devices)
        soonest = None  # seconds until the first GPU job reaches its time-out
        now = time.time()
        for j in jobs:
            if j["state"] == J.RUNNING.value and int(j["spec"]["resources"]["gpus"]) > 0:
                left = ts(j["running_since"]) + float(j["spec"].get("timeout") or 0) - now
                if left > 0 and (soonest is None or left < soonest):
                    soonest = left
        said: dict[str, tuple[int, str]] = {}
        for place, q in enumerate(line, start=1):
            if q.kind != "notebook":
                continue
            workload = q.id.removeprefix(NOTEBOOK)
            msg = (
                f"waiting for {q.gpus} GPU(s): {ordinal(place)} in line of {len(line)} "
                f"(jobs and notebooks); {len(free)} of {total} GPUs free now"
            )
            if q.want:
                keys = {d.key for d in self.ledger.wanted(q.want)}
                msg = (
                    f"waiting for {q.gpus} GPU(s){q.want.text()}: {ordinal(place)} in line of "
                    f"{len(line)} (jobs and notebooks); {sum(k in keys for k in free)} of "
                    f"{len(keys)} such GPUs free now"
                )
            if soonest is not None:
                msg += f"; a running job reaches its time-out in {format_duration(round(soonest))}"
            if self._told.get(workload) != (place, msg):
                said[workload] = (place, msg)
        if said:
            await self.db(self.waits.note, said)
            self._told.update(said)
        if len(self._told) > 10_000:
            self._told.clear()

    async def _say_turns(self, jobs: list[dict], queued: list[QueuedJob], p) -> None:
        """A queued task whose array runs as many tasks as its parallelism says so."""
        busy: dict[str, int] = {}
        for j in jobs:
            if j["array"] and j["state"] not in (J.QUEUED.value, J.FINALIZING.value):
                busy[j["array"]] = busy.get(j["array"], 0) + 1
        starting = {pl.job_id for pl in p.start}
        for job in queued:
            n = busy.get(job.array, 0)
            if job.array and job.id not in starting and n >= job.parallelism:
                await self._say(
                    job.id,
                    f"waiting for its turn: {n} tasks of its array run (parallelism "
                    f"{job.parallelism})",
                )

    async def _say(self, job_id: str, msg: str) -> None:
        """A queued job's waiting message, written only when it changes."""
        if self._waiting.get(job_id) != msg:
            self._waiting[job_id] = msg
            await self.db(self.records.set_waiting, job_id, msg)
        if len(self._waiting) > 10_000:
            self._waiting.clear()

    def _adopt(self, active: list[dict]) -> None:
        """An active job without a task (a push retried through the API, a placement whose
        task was lost to a fault) is carried on from what the database and the engine say;
        each at most once per ADOPT_EVERY seconds."""
        now = asyncio.get_running_loop().time()
        if len(self._adopted) > 10_000:
            self._adopted.clear()
        for j in active:
            job_id = j["id"]
            if job_id in self.tasks or now - self._adopted.get(job_id, -ADOPT_EVERY) < ADOPT_EVERY:
                continue
            self._adopted[job_id] = now
            log.info("job %s: %s without a task: carrying it on", job_id, j["state"])
            self.spawn_task(job_id, attach=True)

    def spawn_task(self, job_id: str, attach: bool) -> None:
        if job_id in self.tasks or not self.leading.is_set():
            return
        self.tasks[job_id] = asyncio.create_task(self._guard(job_id, attach))

    async def _guard(self, job_id: str, attach: bool) -> None:
        """Run one job's task; after any fault, wait (backoff) and carry on from what the
        database and the engine say. A fault never ends a job by itself: only a decision
        made on what the engine confirmed does (a job is never called ended, nor its GPUs
        free, while its container may still run)."""
        faults = 0
        try:
            while True:
                try:
                    if faults == 0 and not attach:
                        await run_fresh(self.ctx, job_id)
                    else:
                        why = "a fault" if faults else "the service restarted"
                        await carry_on(self.ctx, job_id, why)
                    return
                except Exception as e:
                    faults += 1
                    # the streak outlives this task (a fault before the command ran re-queues
                    # the job, and the next placement must not retry at once): reset at RUNNING
                    streaks = self.ctx.fault_streak
                    streak = streaks[job_id] = streaks.get(job_id, 0) + 1
                    delay = min(2.0 ** (streak - 1), self.s.engine_retry_max)
                    log.exception(
                        "job %s: supervisor fault %d; retrying in %g s", job_id, streak, delay
                    )
                    if streak == 1 or streak % 10 == 0:
                        with contextlib.suppress(Exception):
                            await self.db(
                                self.records.note,
                                job_id,
                                "fault-recovery",
                                "SUPERVISOR_RETRY",
                                f"platform fault ({type(e).__name__}: {str(e)[:300]}); "
                                f"retrying in {delay:g} s (attempt {streak})",
                            )
                    await asyncio.sleep(delay)
        finally:
            self.tasks.pop(job_id, None)
            self.wake.set()


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
