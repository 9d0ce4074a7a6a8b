"""One job's life, as the supervisor runs it: pull, start, watch, restart (its ending:
``ending.py``). Functions handed a :class:`~.context.JobContext`.

Every state change is a compare-and-set on the state the code saw (``JobRecords.transition``
with ``expect``), so a change nobody expected fails loudly instead of overwriting another.
GPUs are released only after the engine has confirmed that the job's container is not
running (:func:`.engine.ensure_stopped`). Any fault (the engine unreachable, an API error, a
bug) ends the task's current attempt, never the job: the supervisor's guard waits, asks the
database and the engine again, and carries on from what they say (``recovery.decide``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import datetime

from ...data.sync import SyncOutcome
from ...faults import fault_point
from ...lifecycle import LOST_AFTER, JobState, utcnow
from ...metrics import JOB_START
from ...runtime.base import NetworkUnavailable, WorkloadRefused
from ...secrets import SecretMissing, SecretsUnavailable
from ..gang import Rank, nodes_of
from ..hang import Signs, Verdict, failure_message, judge, restart_note
from ..recovery import Container, Decision, Step, classify, combine, decide
from ..spec import JobSpec
from .context import JobContext
from .ending import RECOVERABLE, finalize, finish_lost, finish_preempt, lost, stop_by_request
from .engine import (
    create_and_start,
    gang_stopped,
    release_network,
    remove_gang,
    restart_in_place,
    reveal_secrets,
    start_again,
)
from .git_sources import clone_sources
from .housekeeping import discard_volumes
from .images import ImageNotReady, ready_image
from .progress import TransferNotes

log = logging.getLogger("gpulab.jobs")
J = JobState


def ts(iso: str | None) -> float:
    if not iso:
        return 0.0
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


# --- a fresh start -------------------------------------------------------------------


async def run_fresh(ctx: JobContext, job_id: str) -> None:
    """INITIALIZING (pull) → PENDING (container) → RUNNING, then the watch."""
    try:
        started = await _start_fresh(ctx, job_id)
    finally:  # its containers hold its dataset copies now, or it will not start
        if ctx.datasets is not None:
            await ctx.datasets.release(ctx.workload(job_id))
    if started is not None:  # (every ending above returns finalize's None)
        await watch(ctx, job_id, *started)


async def _start_fresh(ctx: JobContext, job_id: str) -> tuple[JobSpec, list[Rank]] | None:
    """The start of :func:`run_fresh`: the job's (spec, gang) once it runs, else None (it
    ended, or another task carries it on)."""
    job = await ctx.db(ctx.records.get, job_id, False)
    if job is None or job["state"] != J.INITIALIZING.value:
        return
    spec = JobSpec.from_json(job["spec"])
    gang = ctx.gang(job_id, job)
    name = gang[0].name
    try:  # before any work: a secret deleted since the submission fails the job at once
        await reveal_secrets(ctx, job["owner"], spec)
    except (SecretMissing, SecretsUnavailable) as e:
        return await finalize(ctx, job_id, J.FAILED, "SECRET_MISSING", str(e), push=False)
    # each node that runs a worker pulls its own copy (one host: one pull for all); a
    # read-only dataset another job or a notebook pulled to that node is mounted from the
    # cache (gpulab/data/datasets.py)
    cached: dict[tuple[str, str], str] = {}
    for vol in [v for node in nodes_of(gang) for v in ctx.volumes(job_id, spec, node)]:
        if await ctx.requested(job_id) == "interrupt":
            return await finalize(ctx, job_id, *_BEFORE_START, push=False)
        notes = TransferNotes(ctx, job_id, J.INITIALIZING, "pulling", vol)
        shared, outcome = None, None
        if vol.spec.mode == "ro" and ctx.settings.dataset_cache_max_size and ctx.datasets:
            # the owner's quota counts the dataset as if the job had a copy of its own
            booked = await ctx.data(job_id).book_pull(vol)
            if isinstance(booked, SyncOutcome):
                outcome = booked  # refused by the quota (or not listed): as without the cache
            else:

                async def interrupted() -> bool:
                    return await ctx.requested(job_id) == "interrupt"

                shared, outcome = await ctx.datasets.volume_for(
                    job["owner"], ctx.workload(job_id), vol, notes.on_progress, interrupted
                )
                if shared is None and await interrupted():  # while it waited for a copy
                    return await finalize(ctx, job_id, *_BEFORE_START, push=False)
        if shared is not None:
            cached[(str(vol.spec), vol.node)] = shared.docker_volume
            text = (
                f"{vol.label}: the node's copy in the dataset cache ({shared.docker_volume})"
                if outcome is None
                else f"pulled {outcome.summary()} into the node's dataset cache "
                f"({shared.docker_volume})"
            )
            await ctx.db(ctx.records.note, job_id, "progress", "SYNC", text)
            continue
        if outcome is None:
            if await ctx.data(job_id).nothing_to_pull(vol):
                continue  # nothing stored there yet: nothing to pull
            await notes.begin()
            outcome = await ctx.data(job_id).run("pull", vol, notes.on_progress)
            fault_point("engine:pull")
            await notes.end(outcome)
        if not outcome.ok:
            msg = outcome.reason  # refused by the disk quota: a sentence naming the volume
            if not outcome.refused:
                msg = f"pull of volume {vol.label} failed: {outcome.reason}"
            # a job that never ran keeps nothing: no half-pulled volume holds the disk
            await discard_volumes(ctx, job_id, spec, ",".join(nodes_of(gang)))
            return await finalize(ctx, job_id, J.FAILED, "PULL_FAILED", msg, push=False)
    for node in nodes_of(gang) if spec.git else ():  # by a helper, never the job's image
        ok, msg = await clone(ctx, job_id, job, spec, name, node)
        if not ok:
            await discard_volumes(ctx, job_id, spec, ",".join(nodes_of(gang)))
            return await finalize(ctx, job_id, J.FAILED, "GIT_FAILED", msg, push=False)
    try:
        image = await ready_image(ctx, job_id, job["owner"], spec, gang)
    except ImageNotReady as e:
        return await finalize(ctx, job_id, J.FAILED, e.reason, e.message, push=False)
    except (SecretMissing, SecretsUnavailable) as e:  # the pull secret, deleted since
        return await finalize(ctx, job_id, J.FAILED, "SECRET_MISSING", str(e), push=False)
    if await ctx.requested(job_id) == "interrupt":
        return await finalize(ctx, job_id, *_BEFORE_START, push=False)
    await ctx.move(job_id, J.PENDING, expect=J.INITIALIZING, reason="CREATING", message="starting")
    try:
        await create_and_start(ctx, job_id, spec, gang, job["owner"], image, cached)
    except NetworkUnavailable as e:
        await gang_stopped(ctx, gang, 0)
        return await finalize(ctx, job_id, J.ERROR, "NETWORK_UNAVAILABLE", str(e), push=False)
    except (SecretMissing, SecretsUnavailable) as e:  # deleted during the pull
        return await finalize(ctx, job_id, J.FAILED, "SECRET_MISSING", str(e), push=False)
    except WorkloadRefused as e:
        # the engine answered and refused (a bad device, a missing runtime): definite
        await gang_stopped(ctx, gang, 0)
        msg = f"the engine could not start the job: {e}"
        return await finalize(ctx, job_id, J.ERROR, "ENGINE_ERROR", msg, push=False)
    await ctx.move(
        job_id,
        J.RUNNING,
        expect=J.PENDING,
        reason="STARTED",
        message="the command runs" + (f" in {len(gang)} workers" if len(gang) > 1 else ""),
        container=name,
    )
    ctx.fault_streak.pop(job_id, None)
    JOB_START.observe(max(0.0, time.time() - ts(job["updated"])))  # since placement
    return spec, gang


async def clone(
    ctx: JobContext, job_id: str, job: dict, spec: JobSpec, name: str, node: str
) -> tuple[bool, str]:
    def noted(message: str) -> None:
        asyncio.get_running_loop().create_task(
            ctx.db(ctx.records.note, job_id, "progress", "GIT", message)
        )

    async def reveal(secret: str) -> str:
        return await ctx.db(ctx.secrets.reveal, job["owner"], secret)

    # the helper reaches what the job itself will (its owner's network), never the
    # default bridge, where the Swarm's notebook gateway leads to every user's ports
    network = "bridge"
    if spec.git and ctx.settings.network_isolation == "user":
        network = await ctx.runtime.ensure_user_network(ctx.settings.instance, job["owner"])
    ok, msg = await clone_sources(
        ctx.data(job_id), name, node, spec.git, reveal, noted, network_mode=network
    )
    fault_point("engine:clone")
    return ok, msg


# --- carrying on after a restart or a fault ------------------------------------------


async def carry_on(ctx: JobContext, job_id: str, why: str) -> None:
    """Decide from the database and the engine what comes next, and do it."""
    job = await ctx.db(ctx.records.get, job_id, False)
    if job is None:
        return
    state = JobState(job["state"])
    if state not in RECOVERABLE:
        return
    gang = ctx.gang(job_id, job)
    began = ts(job["updated"])
    states = await asyncio.gather(*(ctx.runtime.state(r.name) for r in gang))
    found = combine([classify(st, began) for st in states])
    d = decide(state, job["request"], job.get("outcome") or "", found, job["reason"])
    log.info("job %s: %s in %s, container %s: %s", job_id, why, state, found, d.step)
    await apply(ctx, job_id, job, state, found, d, why)


async def apply(ctx: JobContext, job_id, job, state: JobState, found: Container, d: Decision, why):
    gang = ctx.gang(job_id, job)
    spec = JobSpec.from_json(job["spec"])
    if d.step is Step.FINALIZE:
        message = d.message if state is not J.FINALIZING else job["message"]
        return await finalize(
            ctx, job_id, d.outcome, d.reason, message, job["exit_code"], push=d.push
        )
    if d.step is Step.REQUEUE:
        await remove_gang(ctx, gang)  # a gang's start cut short leaves some ranks
        await gang_stopped(ctx, gang, 0)
        await release_network(ctx, job_id, len(gang))
        await ctx.db(ctx.ledger.release, ctx.workload(job_id))
        await ctx.move(
            job_id,
            J.QUEUED,
            expect=state,
            reason="SERVICE_RESTART",
            message=f"queued again: {why} before its command ran",
            devices="",
            over_quota=0,
        )
        return
    if d.step is Step.FINISH_PREEMPT:
        return await finish_preempt(ctx, job_id, spec, gang)
    if d.step is Step.FINISH_LOST:
        return await finish_lost(ctx, job_id, job, spec, gang, job["message"])
    if d.step is Step.START:
        if len(gang) > 1:  # a gang restarts whole: no rank may stay in the earlier run
            await gang_stopped(ctx, gang, ctx.settings.preemption_grace)
        await start_again(ctx, gang)
        await ctx.move(
            job_id, J.RUNNING, expect=state, reason="RESTARTED", message=f"restarted ({why})"
        )
    elif state in (J.PENDING, J.RESTARTING):
        await ctx.move(
            job_id,
            J.RUNNING,
            expect=state,
            reason="RECOVERED",
            message=f"found started ({why})",
            container=gang[0].name,
        )
    await watch(ctx, job_id, spec, gang)


# --- requests ---------------------------------------------------------------------------

# --- watching ------------------------------------------------------------------------

#: seconds between two looks at a running job's containers when the engine announces exits
#: (runtime/exits.py): the look that finds what an announcement missed (a stream that broke)
ENGINE_LOOK = 2.0


async def watch(ctx: JobContext, job_id: str, spec: JobSpec, gang: list[Rank]) -> None:
    """Follow the job's workers until the job ends, restarts or is asked to stop. A
    distributed job lives as one: it is DONE when every rank exited 0; one rank failing
    stops the others and the whole gang restarts (or the job fails, naming the rank)."""
    hang = spec.hang_restart
    lost_since: float | None = None
    consecutive = 0
    last_progress = time.monotonic()
    last_cpu: int | None = None
    gpus_read = False  # the job's GPU activity was read during the current quiet spell
    last_log = time.time()
    names = [r.name for r in gang]
    looked = -1.0  # time.monotonic() when the engine was last asked for the workers' states
    while True:
        # woken at once when the engine announces that a worker ended (runtime/exits.py)
        woke = await ctx.runtime.wait_exit(names, ctx.settings.supervisor_interval, looked)
        job = await ctx.db(ctx.records.get, job_id, False)
        if job is None or job["state"] not in (J.RUNNING.value, J.INTERRUPTING.value):
            return  # someone else (a fault's recovery) carries it on
        state = JobState(job["state"])
        if job["request"] in ("interrupt", "preempt") or state is J.INTERRUPTING:
            return await stop_by_request(ctx, job_id, job, spec, gang)
        if state is J.RUNNING:  # a live push of its volumes, when one is due (its own task)
            ctx.live.consider(ctx, job, spec, gang)
        # the workers' states: at an announced exit, else every ENGINE_LOOK seconds (an engine
        # that announces exits is not asked about every running container at every pass)
        at = time.monotonic()
        if woke or not ctx.runtime.announces_exits or at - looked >= ENGINE_LOOK:
            looked = at
            states = await asyncio.gather(*(ctx.runtime.state(r.name) for r in gang))
            ended = ended_run(gang, states)
            if ended is not None and ended.lost_container:
                return await finalize(ctx, job_id, J.ERROR, "CONTAINER_LOST", ended.message)
            if ended is not None and ended.lost:  # its node is down or drained: once it lasts
                lost_since = lost_since or time.monotonic()
                if time.monotonic() - lost_since < LOST_AFTER:
                    continue
                return await lost(ctx, job_id, job, spec, gang, ended.message)
            lost_since = None
            if ended is not None and ended.engine_error:
                return await finalize(ctx, job_id, J.ERROR, "ENGINE_ERROR", ended.message)
            if ended is not None:
                code = ended.exit_code
                if code == 0:
                    return await finalize(ctx, job_id, J.DONE, "EXITED", "exit code 0", code)
                if job["restarts"] < spec.retries:
                    await auto_restart(
                        ctx, job_id, gang, job["restarts"] + 1, spec, ended.message, code
                    )
                    consecutive, last_progress = 0, time.monotonic()
                    continue
                msg = ended.message + (f" after {spec.retries} restarts" if spec.retries else "")
                return await finalize(ctx, job_id, J.FAILED, "EXITED", msg, code)
        started = ts(job["running_since"])
        if started and time.time() - started > spec.timeout:
            await ctx.move(
                job_id,
                J.TIMEOUT,
                expect=J.RUNNING,
                reason="TIMEOUT",
                message=f"time-out of {spec.timeout:g} s reached",
            )
            if job["restarts"] < spec.retries:
                await auto_restart(
                    ctx,
                    job_id,
                    gang,
                    job["restarts"] + 1,
                    spec,
                    "time-out",
                    stop_first=True,
                    was=J.TIMEOUT,
                )
                continue
            await ctx.move(
                job_id,
                J.INTERRUPTING,
                expect=J.TIMEOUT,
                reason="TIMEOUT",
                message="SIGTERM sent after the time-out",
            )
            return await finalize(
                ctx, job_id, J.INTERRUPTED, "TIMEOUT", f"time-out of {spec.timeout:g} s reached"
            )
        if not hang.enabled:
            continue
        # hang: no output, no CPU progress and no busy GPU for the period, in any worker
        # (the rule: jobs/hang.py)
        now = time.time()
        out = []
        cpu = 0
        for r in gang:
            got = await ctx.runtime.logs(r.name, since=last_log, until=now)
            # the runner's own notes ("[gpulab] ...") are not the command's progress
            out += [ln for ln in got.splitlines() if not ln.startswith(b"[gpulab]")]
            # an engine that cannot read CPU time (Swarm) judges by output alone
            cpu += await ctx.runtime.cpu_time(r.name) or 0
        gpu = await ctx.gpu_activity(gang)
        gpus_read = gpus_read or gpu is not None
        last_log = now
        if last_cpu is None:
            last_cpu = cpu  # CPU time at the last sign of progress (or restart)
        signs = Signs(output=bool(out), cpu_ns=cpu - last_cpu, gpu_percent=gpu)
        verdict = judge(signs, hang.period, time.monotonic() - last_progress, consecutive)
        if verdict is Verdict.PROGRESS:
            last_progress, consecutive, last_cpu, gpus_read = time.monotonic(), 0, cpu, False
        elif verdict is Verdict.FAIL:
            await gang_stopped(ctx, gang, 0)
            return await finalize(ctx, job_id, J.FAILED, "HANG", failure_message(hang.period))
        elif verdict is Verdict.RESTART:
            consecutive += 1
            await ctx.db(
                ctx.records.note,
                job_id,
                "fault-recovery",
                "HANG_RESTART",
                restart_note(hang.period, gpus_read, consecutive, len(gang)),
                hang_restarts=job["hang_restarts"] + 1,
            )
            await restart_in_place(ctx, gang)
            last_progress, last_cpu, gpus_read = time.monotonic(), None, False


def ended_run(gang: list[Rank], states: list) -> _Ended | None:
    """What ended the job's current run, judged over its workers, or None while it runs
    (a distributed job runs until every rank exited 0, or one rank failed)."""
    one = len(gang) == 1
    for r, found in zip(gang, states, strict=True):
        if found is None:
            who = "the job's container" if one else f"rank {r.rank}'s container"
            return _Ended(0, f"{who} disappeared", lost_container=True)
    for r, found in zip(gang, states, strict=True):
        if not found.running and found.lost:
            why = found.error if one else f"rank {r.rank}'s node: {found.error or 'down'}"
            return _Ended(None, why, lost=True)
    for r, found in zip(gang, states, strict=True):
        if found.running:
            continue
        who = "" if one else f"rank {r.rank}: "
        if found.exit_code is None:  # the engine refused to run it (a rejected task)
            why = found.error or "no exit code"
            return _Ended(None, f"{who}the engine could not run the job: {why}", True)
        if found.exit_code != 0:
            why = "out of memory" if found.oom else f"exit code {found.exit_code}"
            return _Ended(found.exit_code, who + why)
    if all(not f.running for f in states):
        return _Ended(0, "exit code 0")
    return None


async def auto_restart(
    ctx: JobContext,
    job_id: str,
    gang: list[Rank],
    n: int,
    spec: JobSpec,
    why: str,
    exit_code: int | None = None,
    stop_first: bool = False,
    was: JobState = J.RUNNING,
) -> None:
    """RESTARTING -> RUNNING: the same containers run their command again (restart n);
    every worker of a distributed job, the ones still running stopped first."""
    # a time-out restart gets a new time-out window (written now: a restart cut short and
    # carried on after a crash must not time out again at once); a failure restart keeps
    # its own (RESTARTING -> RUNNING keeps running_since)
    fresh = {"running_since": utcnow()} if stop_first else {}
    await ctx.move(
        job_id,
        J.RESTARTING,
        expect=was,
        reason="AUTO_RESTART",
        message=f"{why}; restart {n} of {spec.retries}"
        + (f" (all {len(gang)} workers)" if len(gang) > 1 else ""),
        exit_code=exit_code,
        restarts=n,
        **fresh,
    )
    if stop_first or len(gang) > 1:
        await gang_stopped(ctx, gang, ctx.settings.preemption_grace)
    await start_again(ctx, gang)
    await ctx.move(
        job_id,
        J.RUNNING,
        expect=J.RESTARTING,
        reason="RESTARTED",
        message=f"restart {n} of {spec.retries}",
    )


@dataclass(frozen=True)
class _Ended:
    """How a job's run ended, over all its workers (see :func:`ended_run`)."""

    exit_code: int | None
    message: str
    engine_error: bool = False
    lost: bool = False
    lost_container: bool = False


_BEFORE_START = (J.INTERRUPTED, "USER_INTERRUPT", "interrupted before it started")
