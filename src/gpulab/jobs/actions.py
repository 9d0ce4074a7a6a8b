"""What a user may ask of gpulab's jobs: submit one (admission), interrupt, resume, rerun,
retry a push, delete; a page of their list, filtered as asked; and the submission's JSON
Schema as that user may send it. The rules (who may ask for what, how many, what fits) live
here, once: the REST API, the pages, the OpenAPI document and "rerun" all call these
functions, so they cannot disagree.

Each function acts on what it is handed (the settings, and the supervisor that holds the
jobs' records, the GPU ledger, the secrets and the scheduler's wake-up) and returns the job's
record, or raises a :class:`JobRefused` whose kind the adapters answer (``status``: 400 an
invalid request, 403 one the caller may not make, 404 a job that is not there, 409 one that
the job's state forbids). Who the caller is, and that someone else's job is a 404, the
adapters decide before they call (``service/base.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import checks
from ..bounds import page_window
from ..cuda import ImageBuild, cuda_refusal
from ..errors import FieldError
from ..gpus.placement import Want
from ..lifecycle import InvalidTransition, JobState
from ..resources import Quota
from ..runtime.base import EngineError
from .gang import workers_of
from .records import (
    ACTIVE,
    ENDED,
    JobRecords,
    QueueFull,
    QuotaFull,
    job_cursor,
    parse_job_cursor,
)
from .refusals import Conflict, Invalid, JobRefused, NotAllowed, NotFound
from .scheduler import can_ever_fit
from .spec import MAX_PRIORITY, WORKSPACE_DIR, JobSpec, job_spec_schema, parse_job_spec
from .states import parse_state_filter
from .supervisor.engine import release_network
from .supervisor.live import pushable

if TYPE_CHECKING:
    from ..settings import GpulabSettings
    from .supervisor import JobSupervisor

J = JobState
#: a started job can be interrupted until it is FINALIZING (its outcome is decided then)
INTERRUPTIBLE = frozenset(ACTIVE - {J.FINALIZING})


def admission_refusal(
    spec: JobSpec,
    *,
    quota: Quota,
    max_workers: int,
    max_priority: int | None,
    host_gpus: int,
    gpu_home: str,
    gang_refusal: Callable[[int, int], str | None],
    want_refusal: Callable[[Want, float, int], tuple[str, str] | None] | None = None,
) -> JobRefused | None:
    """Why a parsed job is not admitted, or None: its priority against ``max_priority`` (None:
    the caller is an admin, who may ask for any), its workers against ``max_workers`` (one
    user's jobs together), its gang's shape against the nodes (``gang_refusal(gpus per
    worker, workers)``, the ledger's), the GPU model and node pool it asks for against the
    devices and nodes (``want_refusal``, the ledger's), its GPUs against the biggest node
    (``host_gpus``, on ``gpu_home``) and against the owner's ``quota`` (a preemptible job may
    go beyond it)."""
    if max_priority is not None and spec.priority > max_priority:
        return NotAllowed(
            f"priority {spec.priority} is above {max_priority}, the highest a user "
            "may ask for (higher ones need the custom:gpulab:admin scope)",
            field="priority",
        )
    if spec.workers > max_workers:
        return Invalid(
            f"{spec.workers} workers requested but one user's jobs may have at most "
            f"{max_workers} together",
            field="workers",
        )
    want = Want(spec.gpu_model, spec.node_pool)
    if want and want_refusal is not None:
        refused = want_refusal(want, spec.resources.gpus, spec.workers)
        if refused:
            return Invalid(refused[1], field=refused[0])
    # a gang's size is checked against every node by the ledger; its sum against the quota
    fits_on = host_gpus if spec.workers == 1 else spec.total_gpus
    why = gang_refusal(spec.resources.gpus, spec.workers)
    why = why or can_ever_fit(spec.total_gpus, fits_on, quota, spec.preemptible, gpu_home)
    if why and spec.workers > 1 and not why.startswith(f"{spec.workers} workers"):
        why = f"{spec.workers} workers of {spec.resources.gpus} GPU(s) each: {why}"
    if why:
        return Invalid(why, field="workers" if spec.workers > 1 else "resources.gpus")
    return None


def highest_priority(settings: GpulabSettings, *, admin: bool) -> int:
    """The highest priority a caller may ask for: any the spec allows (MAX_PRIORITY) with the
    admin scope, else the configured ``max_user_priority``."""
    return MAX_PRIORITY if admin else min(settings.max_user_priority, MAX_PRIORITY)


async def secret_names(sup: JobSupervisor, owner: str) -> list[str] | None:
    """The names of ``owner``'s secrets, as their store lists them (None: no secrets here,
    the admin configured no key)."""
    store = sup.secrets
    if not store.available:
        return None
    return [i.name for i in await asyncio.to_thread(store.names, owner)]


async def submission_schema(
    sup: JobSupervisor,
    settings: GpulabSettings,
    *,
    owner: str,
    groups: list[str],
    admin: bool,
) -> dict:
    """The JSON Schema of a job submission as ``owner`` may send it: :func:`submit`'s rules
    (their limits, quota, secrets and highest priority, the nodes' GPUs) written as a schema.
    ``owner`` "": a user without overrides or secrets."""
    s = settings
    quota = s.quota_for(owner, groups)
    return job_spec_schema(
        catalog=s.catalog,
        flavors=s.flavor_map,
        limits=s.limits_for(owner, groups),
        allowed_images=s.allowed_images,
        host_gpus=sup.ledger.gpu_home()[0],
        quota_gpus=quota.gpus,
        quota_jobs=quota.jobs,
        max_timeout=s.job_max_timeout,
        max_priority=highest_priority(s, admin=admin),
        volumes=bool(s.storage.stores) and s.storage.volume_pattern(owner, WORKSPACE_DIR),
        secret_names=(await secret_names(sup, owner) if owner else None) or [],
        git=s.job_git_sources,
        gang_slots=sup.ledger.gang_slots(),
        max_workers=s.max_job_workers,
        notify_rules=s.notify_rules,
        max_retention=s.job_retention_max,
        max_tasks=s.max_job_tasks,
        gpu_models=sup.ledger.known_models(),
        node_pools=sup.ledger.known_pools(),
        image_registries=s.image_registries,
        sync_floor=s.sync_interval_floor,
    )


async def submit(
    sup: JobSupervisor,
    settings: GpulabSettings,
    raw: dict,
    *,
    owner: str,
    groups: list[str],
    admin: bool,
) -> dict:
    """Parse ``raw`` (a job's JSON body) for ``owner``, admit it, record it QUEUED and wake
    the scheduler; the new job's record. ``admin``: whether the caller (the owner, or an admin
    rerunning someone's job) may ask for any priority."""
    s = settings
    host_gpus, gpu_home = sup.ledger.gpu_home()
    names = await secret_names(sup, owner)
    try:
        spec = parse_job_spec(
            raw,
            catalog=s.catalog,
            flavors=s.flavor_map,
            limits=s.limits_for(owner, groups),
            default_flavor=None,
            allowed_images=frozenset(s.allowed_images),
            image_registries=tuple(s.image_registries),
            default_pull_policy=s.image_pull_policy,
            storage=s.storage,
            user=owner,
            host_gpus=host_gpus,
            max_timeout=s.job_max_timeout,
            gpu_home=gpu_home,
            secret_names=frozenset(names) if names is not None else None,
            git_allowed=s.job_git_sources,
            notify_rules=s.notify_rules,
            max_retention=s.job_retention_max,
            max_tasks=s.max_job_tasks,
            sync_floor=s.sync_interval_floor,
        )
    except FieldError as e:
        raise Invalid(str(e), field=e.field) from None
    refused = admission_refusal(
        spec,
        quota=s.quota_for(owner, groups),
        max_workers=s.max_job_workers,
        max_priority=None if admin else highest_priority(s, admin=False),
        host_gpus=host_gpus,
        gpu_home=gpu_home,
        gang_refusal=sup.ledger.gang_refusal,
        want_refusal=sup.ledger.want_refusal,
    )
    if refused:
        raise refused
    why = await cuda_too_new(sup, spec)
    if why:
        raise Invalid(why, field="framework" if spec.framework else "image")
    # a job array: one record for it and one per task (each a job to the supervisor)
    tasks = (
        [spec.task_spec(i).to_json() for i in range(spec.completions or 0)]
        if spec.is_array
        else None
    )
    try:
        job = await asyncio.to_thread(
            sup.records.create,
            owner,
            spec.to_json(),
            spec.name,
            groups,
            max_unfinished=s.max_queued_jobs,
            # QUEUED counts against the quota (the job concept); a preemptible job may wait
            # for idle GPUs beyond it, so its submission is never refused for it. An array
            # counts as one job
            quota_jobs=None if spec.preemptible else s.quota_for(owner, groups).jobs,
            tasks=tasks,
        )
    except (QueueFull, QuotaFull) as e:
        raise Conflict(str(e)) from None
    sup.wake.set()
    return job


async def cuda_too_new(sup: JobSupervisor, spec: JobSpec) -> str | None:
    """Why a GPU job's image cannot run on this host's driver (it needs a newer CUDA than the
    driver supports: frameworks.cuda_refusal, the rule notebooks share), or None. The image's
    labels are asked of the engine; an engine that cannot tell (a Swarm, a missing image, one
    that does not answer) and a driver whose CUDA version is unknown refuse nothing."""
    driver = sup.runtime.driver_cuda
    if not spec.resources.gpus or not driver:
        return None
    try:
        labels = await sup.runtime.image_labels(sup.runtime.image_ref(spec.image))
    except EngineError:
        return None
    build = ImageBuild.from_labels(labels)
    return cuda_refusal(spec.image, build.cuda, spec.resources.gpus, driver)


async def rerun(sup: JobSupervisor, settings: GpulabSettings, job: dict, *, admin: bool) -> dict:
    """A copy of ``job`` submitted anew: it belongs to the job's owner (also when an admin
    asks for it), and is admitted as any submission is."""
    if job.get("kind") == "task":
        raise Conflict(
            f"job {job['id']} is task {job['task_index']} of array {job['array']}: rerun the "
            "array (its tasks run again, each with its own parameters)"
        )
    groups = list(job.get("groups") or [])
    return await submit(sup, settings, job["spec"], owner=job["owner"], groups=groups, admin=admin)


@contextlib.contextmanager
def _changed_meanwhile(job_id: str) -> Iterator[None]:
    """A compare-and-set that lost (409), or a job deleted meanwhile (404: as if it never
    existed)."""
    try:
        yield
    except InvalidTransition as e:
        raise Conflict(str(e)) from None
    except KeyError:
        raise NotFound(f"no job {job_id}") from None


async def interrupt(sup: JobSupervisor, job: dict) -> tuple[dict, bool]:
    """Stop ``job``: a queued one at once (INTERRUPTED), a started one by asking the
    supervisor (it stops it, then INTERRUPTED). The job's record, and whether it was stopped
    at once (False: asked, the supervisor is on it)."""
    job_id, state, records = job["id"], JobState(job["state"]), sup.records
    if job.get("kind") == "array":
        return await _stop_array(sup, job)
    with _changed_meanwhile(job_id):
        if state is J.QUEUED:
            try:
                # through the supervisor's one door of transitions: its notice too
                result = await sup.ctx.move(
                    job_id,
                    J.INTERRUPTED,
                    reason="USER_INTERRUPT",
                    message="interrupted while queued",
                    expect=frozenset({J.QUEUED}),
                )
                return result, True
            except InvalidTransition:
                # the scheduler placed it meanwhile: interrupt it as a started job
                current = await asyncio.to_thread(records.get, job_id, False)
                state = JobState(current["state"]) if current else state
        try:  # compare-and-set: only while the job can still be stopped
            result = await asyncio.to_thread(records.ask, job_id, "interrupt", states=INTERRUPTIBLE)
        except InvalidTransition as e:
            now = e.old.value if e.old else state.value
            raise Conflict(f"job {job_id} is {now}: nothing to interrupt") from None
    sup.wake.set()
    return result, False


async def _stop_array(sup: JobSupervisor, job: dict) -> tuple[dict, bool]:
    """Stop every unfinished task of an array: the queued ones at once, the started ones
    through the supervisor (``records.stop_array``). Stopped at once: nothing had started."""
    job_id = job["id"]
    try:
        result = await asyncio.to_thread(sup.records.stop_array, job_id)
    except KeyError:
        raise NotFound(f"no job {job_id}") from None
    except InvalidTransition as e:
        now = e.old.value if e.old else job["state"]
        raise Conflict(f"job {job_id} is {now}: nothing to interrupt") from None
    sup.wake.set()
    return result, JobState(result["state"]) is J.INTERRUPTED


async def resume(sup: JobSupervisor, job: dict) -> dict:
    """Queue an INTERRUPTED job again, its restart counts and exit code cleared; it counts as
    a new submission against its owner's queue and quota (409 beyond them). An array: its
    interrupted tasks."""
    job_id, state = job["id"], JobState(job["state"])
    if state is not J.INTERRUPTED:
        raise Conflict(
            f"only an INTERRUPTED job can be resumed; this one is "
            f"{state.value} (rerun makes a copy of any job)",
        )
    s = sup.s
    owner, groups = job["owner"], list(job.get("groups") or [])
    preemptible = bool(job["spec"].get("preemptible"))
    quota_jobs = None if preemptible else s.quota_for(owner, groups).jobs
    if job.get("kind") == "array":
        try:
            with _changed_meanwhile(job_id):
                result = await asyncio.to_thread(
                    sup.records.resume_array, job_id, (owner, s.max_queued_jobs, quota_jobs)
                )
        except (QueueFull, QuotaFull) as e:
            raise Conflict(str(e)) from None
        sup.wake.set()
        return result
    try:
        with _changed_meanwhile(job_id):
            result = await asyncio.to_thread(
                sup.records.transition,
                job_id,
                J.QUEUED,
                reason="RESUMED",
                message="resumed by its owner",
                restarts=0,
                hang_restarts=0,
                exit_code=None,
                expect=frozenset({J.INTERRUPTED}),
                counts=(owner, s.max_queued_jobs, quota_jobs),
            )
    except (QueueFull, QuotaFull) as e:
        raise Conflict(str(e)) from None
    sup.wake.set()
    return result


async def retry_push(sup: JobSupervisor, job: dict) -> dict:
    """Push a SYNC_FAILED job's volumes again; the job's record after the push (SYNC_FAILED
    again if it failed again; FINALIZING on a service in standby, whose leader carries it)."""
    job_id, state = job["id"], JobState(job["state"])
    if job.get("kind") == "array":
        failed = [t["id"] for t in job.get("tasks") or () if t["state"] == J.SYNC_FAILED.value]
        raise Conflict(
            f"job {job_id} is an array: retry the push of each SYNC_FAILED task"
            + (f" ({', '.join(failed[:10])})" if failed else "")
        )
    if state is not J.SYNC_FAILED:
        raise Conflict(
            f"a job's push runs now only while it is RUNNING, and only a SYNC_FAILED job's "
            f"push can be retried; this one is {state.value}",
        )
    with _changed_meanwhile(job_id):
        return await sup.retry_push(job_id)


async def push_now(sup: JobSupervisor, job: dict) -> dict:
    """The owner's "push now" of a RUNNING job's rw/rwd volumes (a live push: settled files,
    nothing deleted; :mod:`gpulab.live_push`): asked, and the supervisor runs it within a
    look; Conflict while one is asked or runs, or when the job has nothing to push."""
    job_id = job["id"]
    if not pushable(JobSpec.from_json(job["spec"])):
        raise Conflict(f"job {job_id} has no rw or rwd volume: nothing to push")
    try:
        result, asked = await sup.request_push(job_id)
    except KeyError:
        raise NotFound(f"no job {job_id}") from None
    except InvalidTransition:
        raise Conflict(
            f"job {job_id} is no longer RUNNING: its final push runs at its end"
        ) from None
    if not asked:
        raise Conflict(
            f"a push of job {job_id} is already under way: one at a time (see its live_push)"
        )
    return result


async def delete(sup: JobSupervisor, job: dict) -> None:
    """Delete an ended job: its record, saved logs, containers, volumes and network."""
    job_id = job["id"]
    if job.get("kind") == "task":
        raise Conflict(
            f"job {job_id} is task {job['task_index']} of array {job['array']}: delete the array"
        )
    if JobState(job["state"]) not in ENDED:
        raise Conflict(f"job {job_id} is {job['state']}: interrupt it first")
    if job.get("kind") == "array":
        return await _delete_array(sup, job_id)
    # the record goes first, in one compare-and-set on its ended state: a resume racing
    # this delete either wins (409 here) or finds no job (404 there); what the engine
    # still holds is removed below, or by the supervisor's sweep of orphaned containers
    try:
        await asyncio.to_thread(sup.records.delete, job_id)
    except KeyError:
        raise NotFound(f"no job {job_id}") from None
    except InvalidTransition as e:
        raise Conflict(f"job {job_id} changed meanwhile: {e}") from None
    await _remove_remains(sup, job)


async def _remove_remains(sup: JobSupervisor, job: dict) -> None:
    """What the engine and the logs directory still hold of a deleted job."""
    job_id = job["id"]
    await sup.remove_from_engine(job_id, job["spec"], job.get("node") or "")
    await release_network(sup.ctx, job_id, workers_of(job))  # if still there

    def unlink() -> None:  # file system work off the event loop
        for path in sup.saved_logs(job_id):
            path.unlink(missing_ok=True)

    await asyncio.to_thread(unlink)


async def _delete_array(sup: JobSupervisor, job_id: str) -> None:
    """An ended array and its tasks: the records in one compare-and-set, then each task's
    remains (the sweep of orphaned containers takes what a fault leaves)."""
    try:
        _, tasks = await asyncio.to_thread(sup.records.delete_array, job_id)
    except KeyError:
        raise NotFound(f"no job {job_id}") from None
    except InvalidTransition as e:
        raise Conflict(f"job {job_id} changed meanwhile: {e}") from None
    for task in tasks:
        await _remove_remains(sup, task)


#: what a user may ask of an existing job, by the name the API and the pages give it
ACTIONS = ("interrupt", "resume", "rerun", "push")


@dataclass(frozen=True)
class Acted:
    """What came of an action: the job's record after it (a rerun's: the new job's)."""

    job: dict
    #: a new job was made (a rerun)
    created: bool = False
    #: asked, and the supervisor carries it out (an interrupt of a started job)
    pending: bool = False
    #: carried out, and it failed again (a retried push)
    failed: bool = False


async def act(
    sup: JobSupervisor, settings: GpulabSettings, job: dict, action: str, *, admin: bool
) -> Acted:
    """Take one of the :data:`ACTIONS` on ``job`` (``admin``: whether the caller has the
    admin scope, for a rerun's priority); NotFound for an action that does not exist."""
    if action == "interrupt":
        result, at_once = await interrupt(sup, job)
        return Acted(result, pending=not at_once)
    if action == "resume":
        return Acted(await resume(sup, job))
    if action == "rerun":
        return Acted(await rerun(sup, settings, job, admin=admin), created=True)
    if action == "push" and job["state"] == J.RUNNING.value and job.get("kind") != "array":
        return Acted(await push_now(sup, job), pending=True)
    if action == "push":
        result = await retry_push(sup, job)
        return Acted(result, failed=result["state"] == J.SYNC_FAILED.value)
    raise NotFound(f"no action {action}")


@dataclass(frozen=True)
class JobList:
    """A page of a job list: the states it was filtered on (as parsed, in the order given;
    none: every state), the page's jobs, how many match in all, the page's window and the
    next page's cursor."""

    states: list[str]
    jobs: list[dict]
    total: int
    limit: int
    offset: int
    #: the cursor of the next page (its first job follows this page's last), None at the end
    next_cursor: str | None = None


def list_jobs(
    records: JobRecords,
    owner: str | None,
    *,
    states: str = "",
    labels: Sequence[str] = (),
    limit: str | None = None,
    offset: str | None = None,
    newest_first: bool = False,
    cursor: str | None = None,
) -> JobList:
    """A page of ``owner``'s jobs (None: everyone's; who may ask for whose, the adapters
    decide), from the reader's query as sent: ``states``, a state filter
    (:func:`~gpulab.jobs.states.parse_state_filter`), ``labels``, ``key=value`` filters,
    ``limit`` and ``offset``, the page's window (:func:`gpulab.bounds.page_window`; None: the
    defaults), ``cursor``, where the page starts (a :class:`JobList`'s ``next_cursor``: the
    jobs after that one, however many were added or deleted before it meanwhile). Oldest
    first, or ``newest_first``. Invalid (400) naming the first argument at fault, in that
    order. Blocking: one read of the records."""
    chosen = parse_state_filter(states)
    try:
        wanted = checks.label_filters(FieldError, labels)
        first, skip = page_window(limit, offset)
    except FieldError as e:
        raise Invalid(str(e), field=e.field) from None
    after = None
    if cursor is not None:
        try:
            after = parse_job_cursor(cursor)
        except ValueError as e:
            raise Invalid(str(e), field="cursor") from None
    # one more than the page: whether a next one exists, wherever the cursor stands
    rows, total = records.page(
        owner, set(chosen) or None, wanted or None, first + 1, skip, newest_first, cursor=after
    )
    more = len(rows) > first
    rows = rows[:first]
    return JobList(chosen, rows, total, first, skip, job_cursor(rows[-1]) if more else None)
