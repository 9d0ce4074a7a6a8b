"""Job records: submissions, checked state transitions with their history, and usage."""

from __future__ import annotations

import base64
import functools
import re
import secrets
import threading
import time
import weakref
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, exists, func, or_, select, update
from sqlalchemy.orm import aliased, selectinload
from sqlalchemy.sql.elements import UnaryExpression
from sqlalchemy.sql.operators import custom_op

from ..billing import BILLED_STATES, billed_minutes
from ..db import Database, Job, JobEvent
from ..faults import fault_point
from ..lifecycle import (
    JOB_QUOTA_STATES,
    InvalidTransition,
    JobState,
    check_job_transition,
    utcnow,
)
from ..live_push import ended_push, iso_seconds, push_busy, trim_live_pushes
from ..statelog import state_change
from .gang import ranks, spec_workers
from .spec.ports import job_path
from .states import ACTIVE, ENDED, array_state
from .usage import bills_of, month_report, owner_usage, owners_billed, settle

#: what a user or the scheduler may ask of an active job ("" for nothing)
REQUESTS = frozenset({"", "interrupt", "preempt"})

UNFINISHED_STATES = frozenset({JobState.QUEUED} | ACTIVE)
UNFINISHED_VALUES = frozenset(x.value for x in UNFINISHED_STATES)
#: a task its array's stop asks to stop (until FINALIZING: its outcome is decided then)
INTERRUPTIBLE_TASK = frozenset(ACTIVE - {JobState.FINALIZING})
#: the ended states whose records retention deletes: never SYNC_FAILED (its output waits
#: for a push, and a record is how its owner retries it)
RETAINED = frozenset(ENDED - {JobState.SYNC_FAILED})
_RETAINED_VALUES = [s.value for s in RETAINED]


def _unindexed(column):
    """``column`` as SQLite's planner may not use an index for (its unary +)."""
    return UnaryExpression(column, operator=custom_op("+"), type_=column.type)


class _Rows:
    """A job row and its event rows, read like a :class:`Job` by :func:`job_json`."""

    __slots__ = ("_row", "events")

    def __init__(self, row, events):
        self._row, self.events = row, events

    def __getattr__(self, name: str):
        return getattr(self._row, name)


class RequestChanged(InvalidTransition):
    """The job's request changed since the caller looked (an interrupt during a preemption)."""

    def __init__(self, request: str):
        ValueError.__init__(self, f"the job's request changed meanwhile (now {request or 'none'})")
        self.request = request
        self.old = self.new = None


class QuotaFull(Exception):
    """The owner's quota counts as many jobs as it allows (QUEUED included)."""

    def __init__(self, count: int, cap: int):
        self.count, self.cap = count, cap
        super().__init__(
            f"your quota allows {cap} jobs queued or running at once (QUEUED counts) and you "
            f"have {count}: wait for one to end, or submit this one as preemptible (it may "
            "wait for idle GPUs beyond the quota)"
        )


class QueueFull(Exception):
    """The owner already has as many queued or active jobs as allowed."""

    def __init__(self, count: int, cap: int, adding: int = 1):
        self.count, self.cap = count, cap
        more = f" and this array has {adding} tasks" if adding > 1 else ""
        super().__init__(
            f"you have {count} jobs queued or running{more}; the most is {cap}: wait for some "
            "to end"
        )


def _iso(t: datetime | None) -> str | None:
    return t.isoformat().replace("+00:00", "Z") if t else None


#: the longest cursor a job list takes (an ISO time and a job id, encoded)
MAX_CURSOR = 128


def job_cursor(job: dict) -> str:
    """The cursor of a list's next page after ``job`` (its last row): its submission time
    and id, URL-safe and opaque to readers (:func:`parse_job_cursor`)."""
    raw = f"{job['submitted']}|{job['id']}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def parse_job_cursor(text: str) -> tuple[datetime, str]:
    """(submitted, id) of a :func:`job_cursor`; ValueError if it is not one."""
    try:
        if len(text) > MAX_CURSOR:
            raise ValueError
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
        when, job_id = raw.rsplit("|", 1)
        at = datetime.fromisoformat(when.replace("Z", "+00:00"))
    except (ValueError, UnicodeDecodeError):
        raise ValueError("cursor is not one this service gave (a list's next page)") from None
    # a job's id as this service makes them (never a NUL or another character a database
    # refuses), and a time in UTC, as the records keep it
    if at.tzinfo is None or not re.fullmatch(r"[a-z0-9]{1,32}", job_id):
        raise ValueError("cursor is not one this service gave (a list's next page)")
    return at.astimezone(UTC), job_id


def event_json(e: JobEvent) -> dict:
    return {
        "at": _iso(e.at),
        "kind": e.kind,
        "state": e.state,
        "reason": e.reason,
        "message": e.message,
        "exit_code": e.exit_code,
    }


def job_json(
    j: Job, now: datetime | None = None, history: bool = False, billed: int | None = None
) -> dict:
    """The API's view of a job; ``billed``: its billed minutes when the caller knows them
    (then its events are not read unless ``history``)."""
    minutes = billed if billed is not None else billed_minutes(j.events, now or utcnow())
    workers = spec_workers(j.spec)
    gpus = int(((j.spec or {}).get("resources") or {}).get("gpus") or 0)
    out = {
        "id": j.id,
        "name": j.name,
        "owner": j.owner,
        # "job", "array" (a sweep: its tasks run) or "task" (one of an array's)
        "kind": j.kind or "job",
        "array": j.parent or None,
        "task_index": j.task_index,
        "state": j.state,
        "reason": j.reason,
        "message": j.message,
        "exit_code": j.exit_code,
        "submitted": _iso(j.submitted),
        "updated": _iso(j.updated),
        "running_since": _iso(j.running_since),
        "devices": [d for d in j.devices.replace(";", ",").split(",") if d],
        "node": j.node or "",
        "over_quota": bool(j.over_quota),
        "restarts": j.restarts,
        "hang_restarts": j.hang_restarts,
        "billed_minutes": minutes,
        # every worker's GPUs, for the whole billed time
        "billed_gpu_minutes": minutes * gpus * workers,
        "workers": [
            {
                "rank": r.rank,
                "container": r.name if j.container else "",
                "node": r.node,
                "devices": list(r.devices),
            }
            for r in ranks(j.container or "", workers, j.devices, j.node or "")
        ],
        "spec": j.spec,
        "request": j.request,
        # the live pushes of its rw/rwd volumes while it runs (gpulab.live_push)
        "push_requested": _iso(j.push_requested),
        "live_push": live_push_json(j.live_push),
        "outcome": j.outcome or None,
        "container": j.container,
        "groups": [g for g in j.groups.split(",") if g],
        # where each exposed port opens (behind the hub's login: service/api/ports.py)
        "ports": [
            {
                "name": p.get("name"),
                "port": p.get("port"),
                "url": f"{job_path(j.id)}/ports/{p.get('name')}/",
            }
            for p in (j.spec or {}).get("ports") or ()
        ],
    }
    if history:
        out["history"] = [event_json(e) for e in j.events]
    return out


def live_push_json(raw: dict | None) -> dict | None:
    """The last live push as the API shows it (None: none yet): whether one runs now (and
    since when, asked by the interval or the owner), when the last one ended, how it went,
    the files and bytes it sent."""
    if not raw:
        return None
    keys = ("running", "trigger", "started", "at", "ok", "message", "files", "bytes")
    return {k: raw.get(k) for k in keys}


def _with_tasks(out: dict, tasks: list[dict], listed: bool = False) -> None:
    """An array's view: its tasks (index, id, state, exit code, parameters... ; in a list,
    only the counts), how many are in each state, and the bill of them all."""
    counts: dict[str, int] = {}
    for t in tasks:
        counts[t["state"]] = counts.get(t["state"], 0) + 1
    out["task_counts"] = counts
    out["billed_minutes"] = sum(t["billed_minutes"] for t in tasks)
    out["billed_gpu_minutes"] = sum(t["billed_gpu_minutes"] for t in tasks)
    if not listed:
        out["tasks"] = tasks


#: seconds everyone's counts by state may be reused by this process's readers when no job
#: of it changed state meanwhile (another process's changes: at most this late)
COUNTS_MAX_AGE = 5.0
#: per database: {instance: [generation, (generation, read at, counts) or None]}
_COUNTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_COUNTS_LOCK = threading.Lock()


def _changes_counts(method):
    """A writer that may change how many jobs are in a state: everyone's counts read before
    it ends are not reused (:meth:`JobRecords.everyones_counts`)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        finally:
            with _COUNTS_LOCK:  # the record layer's writers run on several threads
                self._counts_slot()[0] += 1

    return wrapper


class JobRecords:
    def __init__(self, db: Database, instance: str):
        self.db = db
        self.instance = instance

    def _get(self, s, job_id: str, lock: bool = False) -> Job | None:
        """The job with its events; ``lock``: its row locked until the transaction ends, so
        that a compare-and-set is one on PostgreSQL too (SQLite's writers hold the database
        lock anyway, and the clause is left out there)."""
        q = select(Job).where(Job.instance == self.instance, Job.id == job_id)
        if lock:
            q = q.with_for_update(of=Job)
        return s.scalar(q.options(selectinload(Job.events)))

    def _locked(
        self, s, job_id: str, allowed: frozenset[JobState], target: JobState
    ) -> tuple[Job, JobState]:
        """The compare part of every compare-and-set: the job, its row locked, if it is in
        one of ``allowed``; KeyError if it is gone, InvalidTransition (to ``target``, for the
        message) otherwise."""
        job = self._get(s, job_id, lock=True)
        if job is None:
            raise KeyError(job_id)
        old = JobState(job.state)
        if old not in allowed:
            raise InvalidTransition("job", old, target)
        return job, old

    @_changes_counts
    def create(
        self,
        owner: str,
        spec: dict,
        name: str | None,
        groups=(),
        max_unfinished: int | None = None,
        quota_jobs: int | None = None,
        tasks: list[dict] | None = None,
    ) -> dict:
        """Insert a QUEUED job; with ``tasks`` (their specs), a job array and its tasks, each
        a QUEUED job of its own (named after the array and its index; told the array's id in
        its spec's ``task``). Quotas count an array as one job and the queue's cap counts its
        tasks (what runs). ``max_unfinished``: the most jobs ``owner`` may have queued or
        active (QueueFull); ``quota_jobs``: the most jobs their quota counts, those in the
        quota states (QUEUED, INITIALIZING, PENDING, RUNNING) except any running beyond the
        quota (QuotaFull). Counted and inserted in one transaction serialized per owner, so
        that concurrent submissions cannot overshoot either."""
        job_id = "j" + secrets.token_hex(6)
        name = name or f"job-{job_id[1:]}"  # unnamed jobs are named after their unique id
        now = utcnow()
        with self.db.session() as s:
            self._check_counts(
                s, owner, max_unfinished, quota_jobs, adding=len(tasks) if tasks else 1
            )
            job = self._new(job_id, owner, groups, name, spec, now)
            if tasks:
                job.kind = "array"
                job.message = f"{len(tasks)} tasks queued"
                job.events[0].message = job.message
            s.add(job)
            for i, task_spec in enumerate(tasks or ()):
                task_id = "j" + secrets.token_hex(6)
                task_spec = {**task_spec, "task": {**task_spec["task"], "array": job_id}}
                task = self._new(task_id, owner, groups, f"{name[:56]}-{i}", task_spec, now)
                task.kind, task.parent, task.task_index = "task", job_id, i
                s.add(task)
            s.flush()
            result = job_json(job, now, history=True)
        state_change("job", job_id, owner, None, result["state"], "SUBMITTED", result["message"])
        return result

    def _check_counts(
        self,
        s,
        owner: str,
        max_unfinished: int | None,
        quota_jobs: int | None,
        adding: int = 1,
    ) -> None:
        """In the caller's transaction, serialized per owner: refuse one more job of
        ``owner`` beyond ``max_unfinished`` queued or active jobs (QueueFull) or beyond
        ``quota_jobs`` jobs in the quota states, those running beyond the quota aside
        (QuotaFull). An array counts as one job against the quota, and its ``adding`` tasks
        (what runs) against the queue's cap."""
        if max_unfinished is None and quota_jobs is None:
            return
        self.db.serialize(s, "gpulab-queue", self.instance, owner)
        if quota_jobs is not None:
            counted = s.scalar(
                select(func.count())
                .select_from(Job)
                .where(
                    Job.instance == self.instance,
                    Job.owner == owner,
                    Job.state.in_([st.value for st in JOB_QUOTA_STATES]),
                    Job.over_quota == 0,
                    Job.kind != "task",  # an array counts as one job, its tasks not
                )
            )
            if counted >= quota_jobs:
                raise QuotaFull(counted, quota_jobs)
        if max_unfinished is not None:
            unfinished = s.scalar(
                select(func.count())
                .select_from(Job)
                .where(
                    Job.instance == self.instance,
                    Job.owner == owner,
                    Job.state.in_(UNFINISHED_VALUES),
                    Job.kind != "array",  # what runs: its tasks, each counted
                )
            )
            if unfinished + adding > max_unfinished:
                raise QueueFull(unfinished, max_unfinished, adding)

    def _new(self, job_id: str, owner: str, groups, name: str, spec: dict, now) -> Job:
        job = Job(
            id=job_id,
            instance=self.instance,
            owner=owner,
            groups=",".join(groups),
            name=name,
            spec=spec,
            state=JobState.QUEUED.value,
            priority=int(spec.get("priority", 50)),
            submitted=now,
            updated=now,
            reason="SUBMITTED",
            message="accepted, waiting for resources",
        )
        job.events.append(JobEvent(at=now, state=job.state, reason=job.reason, message=job.message))
        return job

    @_changes_counts
    def transition(
        self,
        job_id: str,
        state: JobState,
        *,
        expect: JobState | frozenset[JobState],
        expect_request: frozenset[str] | None = None,
        reason: str = "",
        message: str = "",
        exit_code: int | None = None,
        counts: tuple[str, int | None, int | None] | None = None,
        array_changes: list[dict] | None = None,
        **fields,
    ) -> dict:
        """Compare-and-set: move a job from a state in ``expect`` to ``state``, record why and
        set ``fields``, all in one transaction. ``counts`` (owner, max_unfinished,
        quota_jobs): check them first in the same transaction, as :meth:`create` does (a job
        queued again counts as a new one). A task's array is derived again in it; where its
        state changed, its record is appended to ``array_changes`` (when given).

        ``expect`` is the state (or states) the caller saw; ``expect_request``, if given, the
        requests it saw. Anything else means that a concurrent change won the race, and raises
        InvalidTransition, as does a move the lifecycle table does not allow.
        """
        expected = frozenset({expect}) if isinstance(expect, JobState) else expect
        with self.db.session() as s:
            if counts is not None:
                self._check_counts(s, *counts)
            array = self._lock_array_of(s, job_id)
            job, old = self._locked(s, job_id, expected, state)
            if expect_request is not None and job.request not in expect_request:
                raise RequestChanged(job.request)
            check_job_transition(old, state)
            now = utcnow()
            for key, value in fields.items():
                setattr(job, key, value)
            job.state = state.value
            job.updated = now
            job.reason, job.message = reason, message
            if exit_code is not None:
                job.exit_code = exit_code
            if state is JobState.RUNNING and "running_since" not in fields:
                # a restart after a failure keeps counting towards the same time-out
                keep = old is JobState.RESTARTING and job.running_since is not None
                job.running_since = job.running_since if keep else now
            if state in (JobState.QUEUED, *ENDED):
                job.running_since = None
            if state in (JobState.QUEUED, JobState.FINALIZING, *ENDED):
                job.request = ""  # nothing can be asked of it any more (or of this life)
            if state in (JobState.QUEUED, *ENDED) and state is not JobState.SYNC_FAILED:
                job.outcome = ""  # SYNC_FAILED keeps the outcome its retried push ends in
            job.events.append(
                JobEvent(
                    at=now, state=state.value, reason=reason, message=message, exit_code=exit_code
                )
            )
            if state not in BILLED_STATES:  # a billed period may have closed: settle it
                settle(self.db, s, job, now)
            own = (job.spec or {}).get("auto_delete_after")
            if state in RETAINED and isinstance(own, int | float) and not isinstance(own, bool):
                job.delete_at = now + timedelta(seconds=own)
            else:
                job.delete_at = None
            s.flush()
            if array is not None and self._derive(s, array, now) and array_changes is not None:
                array_changes.append(job_json(array, now, history=False))
            result = job_json(job, now, history=True)
        owner = result["owner"]
        state_change("job", job_id, owner, old.value, state.value, reason, message, exit_code)
        fault_point(f"transition:{state.value}")
        return result

    # --- job arrays ------------------------------------------------------------------------

    def _lock_array_of(self, s, job_id: str) -> Job | None:
        """A task's array, its row locked (None for any other job). Taken before the task's
        own row by every writer, so that two writers never wait for each other in turn."""
        parent = s.scalar(select(Job.parent).where(Job.instance == self.instance, Job.id == job_id))
        if not parent:
            return None
        q = select(Job).where(Job.instance == self.instance, Job.id == parent)
        return s.scalar(q.with_for_update(of=Job))

    def _tasks(self, s, array_id: str, lock: bool = False) -> list[Job]:
        q = select(Job).where(Job.instance == self.instance, Job.parent == array_id)
        if lock:
            q = q.with_for_update(of=Job)
        return list(s.scalars(q.order_by(Job.task_index)))

    def _derive(self, s, array: Job, now: datetime) -> bool:
        """The array's state from its tasks' (:func:`~gpulab.jobs.states.array_state`), in
        the transaction that changed one; a change is recorded as an event of kind "array"
        (never billed: the tasks are)."""
        rows = s.execute(
            select(Job.task_index, Job.state, Job.exit_code).where(
                Job.instance == self.instance, Job.parent == array.id
            )
        ).all()
        state, reason, message, code = array_state(
            [(i, st, c) for i, st, c in rows], array.request == "interrupt"
        )
        changed = state.value != array.state
        if not changed and (reason, message) == (array.reason, array.message):
            return False
        old = array.state
        array.state, array.reason, array.message = state.value, reason, message
        array.exit_code = code
        array.updated = now
        if state is JobState.RUNNING and array.running_since is None:
            array.running_since = now
        if state in ENDED or state is JobState.QUEUED:
            array.running_since = None
        if state in ENDED:
            array.request = ""  # decided: a task resumed later starts a new life
        # retention (delete_expired) takes an ended array with its tasks, after its own
        # auto_delete_after where it set one
        own = (array.spec or {}).get("auto_delete_after")
        if state in RETAINED and isinstance(own, int | float) and not isinstance(own, bool):
            array.delete_at = now + timedelta(seconds=own)
        else:
            array.delete_at = None
        if changed:
            array.events.append(
                JobEvent(
                    at=now,
                    kind="array",
                    state=state.value,
                    reason=reason,
                    message=message,
                    exit_code=code,
                )
            )
            state_change("job", array.id, array.owner, old, state.value, reason, message, code)
        return changed

    @_changes_counts
    def stop_array(self, array_id: str) -> dict:
        """Stop a job array: its queued tasks end INTERRUPTED at once and its started ones are
        asked to stop (the supervisor stops each, as any job's interrupt), all in one
        transaction; the array is INTERRUPTING until they have ended, then INTERRUPTED.
        InvalidTransition when nothing of it is unfinished, KeyError if it is gone."""
        with self.db.session() as s:
            array, _ = self._locked(s, array_id, UNFINISHED_STATES, JobState.INTERRUPTING)
            now = utcnow()
            array.request = "interrupt"
            stopped = []
            for task in self._tasks(s, array_id, lock=True):
                st = JobState(task.state)
                if st is JobState.QUEUED:
                    check_job_transition(st, JobState.INTERRUPTED)
                    task.state, task.updated = JobState.INTERRUPTED.value, now
                    task.reason, task.message = "USER_INTERRUPT", "its array was stopped"
                    task.running_since, task.request, task.outcome = None, "", ""
                    task.events.append(
                        JobEvent(at=now, state=task.state, reason=task.reason, message=task.message)
                    )
                    stopped.append(task.id)
                elif st in INTERRUPTIBLE_TASK:
                    task.request = "interrupt"
            s.flush()
            self._derive(s, array, now)
            result = job_json(array, now, history=True)
        for task_id in stopped:
            state_change(
                "job",
                task_id,
                result["owner"],
                "QUEUED",
                "INTERRUPTED",
                "USER_INTERRUPT",
                "its array was stopped",
            )
        return result

    @_changes_counts
    def resume_array(
        self, array_id: str, counts: tuple[str, int | None, int | None] | None = None
    ) -> dict:
        """Queue an INTERRUPTED array's interrupted tasks again (their restart counts and exit
        codes cleared); its other tasks keep their end. ``counts`` (owner, max_unfinished,
        quota_jobs): checked first, as :meth:`transition` does (the array one job, its tasks
        queued again each one in the queue). InvalidTransition unless the array is
        INTERRUPTED, KeyError if it is gone."""
        with self.db.session() as s:
            if counts is not None:
                again = s.scalar(
                    select(func.count())
                    .select_from(Job)
                    .where(
                        Job.instance == self.instance,
                        Job.parent == array_id,
                        Job.state == JobState.INTERRUPTED.value,
                    )
                )
                self._check_counts(s, *counts, adding=max(1, again))
            array, _ = self._locked(s, array_id, frozenset({JobState.INTERRUPTED}), JobState.QUEUED)
            now = utcnow()
            for task in self._tasks(s, array_id, lock=True):
                if task.state != JobState.INTERRUPTED.value:
                    continue
                task.state, task.updated = JobState.QUEUED.value, now
                task.reason, task.message = "RESUMED", "its array was resumed"
                task.restarts = task.hang_restarts = 0
                task.exit_code = None
                task.request, task.outcome = "", ""
                task.events.append(
                    JobEvent(at=now, state=task.state, reason=task.reason, message=task.message)
                )
            array.request = ""
            s.flush()
            self._derive(s, array, now)
            return job_json(array, now, history=True)

    @_changes_counts
    def delete_array(self, array_id: str) -> tuple[dict, list[dict]]:
        """Compare-and-set: delete an ended array and its tasks (every one ended); the array
        and its tasks as they were, for the caller to remove what the engine holds of them.
        InvalidTransition if a task is not ended, KeyError if it is gone."""
        with self.db.session() as s:
            array, _ = self._locked(s, array_id, ENDED, JobState.DONE)
            tasks = self._tasks(s, array_id, lock=True)
            for task in tasks:
                if JobState(task.state) not in ENDED:
                    raise InvalidTransition("job", JobState(task.state), JobState.DONE)
            out = job_json(array, history=False)
            gone = [job_json(t, history=False) for t in tasks]
            for task in tasks:
                s.delete(task)
            s.delete(array)
            return out, gone

    def tasks_of(self, array_id: str, s=None) -> list[dict]:
        """An array's tasks, as its view shows them (index order), with their billed minutes."""
        if s is None:
            with self.db.read() as s2:
                return self.tasks_of(array_id, s2)
        jobs = Job.__table__
        conn = s.connection()
        rows = conn.execute(
            select(
                jobs.c.id,
                jobs.c.name,
                jobs.c.task_index,
                jobs.c.state,
                jobs.c.reason,
                jobs.c.message,
                jobs.c.exit_code,
                jobs.c.restarts,
                jobs.c.updated,
                jobs.c.spec,
                jobs.c.node,
                jobs.c.devices,
            )
            .where(jobs.c.instance == self.instance, jobs.c.parent == array_id)
            .order_by(jobs.c.task_index)
        ).all()
        bills = bills_of(conn, [(r.id, r.state, r.updated) for r in rows], utcnow())
        out = []
        for r in rows:
            spec = r.spec or {}
            gpus = int((spec.get("resources") or {}).get("gpus") or 0) * spec_workers(spec)
            out.append(
                {
                    "index": r.task_index,
                    "id": r.id,
                    "name": r.name,
                    "state": r.state,
                    "reason": r.reason,
                    "message": r.message,
                    "exit_code": r.exit_code,
                    "restarts": r.restarts,
                    "node": r.node or "",
                    "devices": [d for d in (r.devices or "").replace(";", ",").split(",") if d],
                    "parameters": (spec.get("task") or {}).get("parameters") or {},
                    "billed_minutes": bills[r.id],
                    "billed_gpu_minutes": bills[r.id] * gpus,
                }
            )
        return out

    def ask(self, job_id: str, request: str, *, states: frozenset[JobState]) -> dict:
        """Compare-and-set a request ("interrupt" or "preempt") on an active job.

        It is written only while the job is in ``states``; a preemption never replaces an
        interrupt (the user's word wins), an interrupt replaces a preemption (the job then
        ends INTERRUPTED instead of going back to the queue). Raises InvalidTransition when
        the job is in no state for it."""
        if request not in REQUESTS:
            raise ValueError(f"unknown request {request!r}")
        with self.db.session() as s:
            job, _ = self._locked(s, job_id, states, JobState.INTERRUPTING)
            if not (request == "preempt" and job.request == "interrupt"):
                job.request = request
            s.flush()
            return job_json(job, history=True)

    def note(self, job_id: str, kind: str, reason: str, message: str, **fields) -> None:
        """An event that does not change the state (a fault recovery), and counters."""
        with self.db.session() as s:
            job = self._get(s, job_id, lock=True)
            if job is None:
                return
            for key, value in fields.items():
                setattr(job, key, value)
            job.events.append(
                JobEvent(at=utcnow(), kind=kind, state=job.state, reason=reason, message=message)
            )

    def request_push(self, job_id: str) -> tuple[dict, bool]:
        """The owner's "push now" of a RUNNING job: (its record, whether it was asked now);
        False when one is asked already or runs (one at a time). InvalidTransition when the
        job is not RUNNING; KeyError when there is no such job."""
        with self.db.session() as s:
            job = self._get(s, job_id, lock=True)
            if job is None:
                raise KeyError(job_id)
            if job.state != JobState.RUNNING.value:
                raise InvalidTransition("job's push", JobState(job.state), JobState.RUNNING)
            now, live = utcnow(), job.live_push or {}
            asked = job.push_requested.timestamp() if job.push_requested else None
            began = iso_seconds(live.get("started"))
            busy = push_busy(now.timestamp(), asked, bool(live.get("running")), began)
            if not busy:
                job.push_requested = now
            s.flush()
            return job_json(job, history=False), not busy

    def live_push_began(self, job_id: str, trigger: str) -> None:
        """A live push starts ("interval" or "request"): the request is taken, the last
        outcome kept until this one ends."""
        with self.db.session() as s:
            job = self._get(s, job_id, lock=True)
            if job is None:
                return
            last = dict(job.live_push or {})
            job.live_push = {
                **last,
                "running": True,
                "trigger": trigger,
                "started": _iso(utcnow()),
            }
            if trigger == "request":
                job.push_requested = None

    def live_push_ended(self, job_id: str, ok: bool, message: str, files: int, nbytes: int) -> None:
        """A live push ended: its outcome on the record and one event (kind "sync", reason
        LIVE_PUSH or LIVE_PUSH_FAILED). Never a state change: a failed live push stops
        nothing and loses nothing (the next one, or the stop's, pushes again)."""
        with self.db.session() as s:
            job = self._get(s, job_id, lock=True)
            if job is None:
                return
            now = utcnow()
            job.live_push = ended_push(job.live_push, _iso(now), ok, message, files, nbytes)
            reason = "LIVE_PUSH" if ok else "LIVE_PUSH_FAILED"
            job.events.append(
                JobEvent(at=now, kind="sync", state=job.state, reason=reason, message=message)
            )
            trim_live_pushes(job.events)

    def set_waiting(self, job_id: str, message: str) -> bool:
        """Say why a queued job waits (its message; no event, no state change), only while
        it is still QUEUED: a placement meanwhile wins."""
        with self.db.session() as s:
            res = s.execute(
                update(Job)
                .where(
                    Job.instance == self.instance,
                    Job.id == job_id,
                    Job.state == JobState.QUEUED.value,
                    Job.message != message,
                )
                .values(message=message)
            )
            return bool(res.rowcount)

    def set_progress(self, job_id: str, state: JobState, message: str) -> bool:
        """The job's message, while it is still in ``state`` (a transfer's progress: no
        event, no state change; a move meanwhile wins)."""
        with self.db.session() as s:
            res = s.execute(
                update(Job)
                .where(Job.instance == self.instance, Job.id == job_id, Job.state == state.value)
                .values(message=message)
            )
            return bool(res.rowcount)

    def forget_container(self, job_id: str) -> bool:
        """An ended job's container and volumes are gone: clear its container (only while
        it is still ended: a job resumed meanwhile keeps its new one)."""
        with self.db.session() as s:
            job = self._get(s, job_id, lock=True)
            if job is None or JobState(job.state) not in ENDED:
                return False
            job.container = ""
            return True

    def get(self, job_id: str, history: bool = True) -> dict | None:
        """One job with its events, read as plain rows (the API's hottest read: half the
        time of loading ORM objects, measured in bench/bench_api.py's set-up)."""
        jobs, events = Job.__table__, JobEvent.__table__
        with self.db.read() as s:
            conn = s.connection()
            row = conn.execute(
                select(jobs).where(jobs.c.instance == self.instance, jobs.c.id == job_id)
            ).first()
            if row is None:
                return None
            evs = conn.execute(
                select(events).where(events.c.job_id == job_id).order_by(events.c.id)
            ).all()
            out = job_json(_Rows(row, evs), history=history)
            if out["kind"] == "array":
                _with_tasks(out, self.tasks_of(job_id, s))
        return out

    def list(
        self,
        owner: str | None = None,
        states: set[str] | None = None,
        labels: dict[str, str] | None = None,
    ) -> list[dict]:
        with self.db.read() as s:
            # what runs: plain jobs and arrays' tasks, never an array (it holds nothing)
            q = select(Job).where(Job.instance == self.instance, Job.kind != "array")
            if owner is not None:
                q = q.where(Job.owner == owner)
            if states:
                q = q.where(Job.state.in_(states))
            q = q.options(selectinload(Job.events)).order_by(Job.submitted)
            now = utcnow()
            rows = [job_json(j, now) for j in s.scalars(q)]
        if labels:
            rows = [
                r
                for r in rows
                if all((r["spec"].get("labels") or {}).get(k) == v for k, v in labels.items())
            ]
        return rows

    def page(
        self,
        owner: str | None,
        states: set[str] | None,
        labels: dict[str, str] | None,
        limit: int,
        offset: int,
        newest_first: bool = False,
        with_total: bool = True,
        cursor: tuple[datetime, str] | None = None,
    ) -> tuple[list[dict], int | None]:
        """One page of :meth:`list` (oldest first, then by id) and how many match in all
        (None unless ``with_total``: a count reads every matching row of the index);
        ``cursor`` (submitted, id: :func:`parse_job_cursor`): only the jobs after that one
        in the page's order (then ``offset`` counts from there).

        The filter runs on a light query (ids and specs, no histories); only the page's jobs
        are loaded whole, so a long history of jobs costs one page's work per request.
        """
        with self.db.read() as s:
            # an array is one row (its tasks are in its view)
            where = [Job.instance == self.instance, Job.kind != "task"]
            if owner is not None:
                where.append(Job.owner == owner)
            if states:
                where.append(Job.state.in_(states))
            order = (
                (Job.submitted.desc(), Job.id.desc()) if newest_first else (Job.submitted, Job.id)
            )
            past = []  # the rows after the cursor (the count is of them all)
            if cursor is not None:
                at, last = cursor
                # the plain bound first: an index range (instance, submitted), so that a deep
                # page costs what a first one does (the OR alone walked from the newest job)
                if newest_first:
                    past += [Job.submitted <= at, or_(Job.submitted < at, Job.id < last)]
                else:
                    past += [Job.submitted >= at, or_(Job.submitted > at, Job.id > last)]
            if labels:  # labels live in the spec's JSON: filtered here, on ids and specs only

                def matches(spec) -> bool:
                    return all(
                        ((spec or {}).get("labels") or {}).get(k) == v for k, v in labels.items()
                    )

                ids = [
                    job_id
                    for job_id, spec in s.execute(
                        select(Job.id, Job.spec).where(*where, *past).order_by(*order)
                    )
                    if matches(spec)
                ]
                total = (
                    sum(matches(spec) for (spec,) in s.execute(select(Job.spec).where(*where)))
                    if past
                    else len(ids)
                )
                wanted = ids[offset : offset + limit]
            else:  # the database counts and pages
                if not with_total:
                    total = None
                elif owner is None and not states:  # everyone's: the kept counts
                    total = sum(self.everyones_counts().values())
                else:
                    total = s.scalar(select(func.count()).select_from(Job).where(*where))
                wanted = list(
                    s.scalars(
                        select(Job.id)
                        .where(*where, *past)
                        .order_by(*order)
                        .limit(limit)
                        .offset(offset)
                    )
                )
            if not wanted:
                return [], total
            # by id alone (the ids are this instance's, picked above in this snapshot): with
            # the instance too, SQLite's planner may walk an (instance, ...) index through
            # every job instead of looking up the page's ids
            rows = s.scalars(select(Job).where(Job.id.in_(wanted))).all()
            now = utcnow()
            bills = bills_of(s, [(j.id, j.state, j.updated) for j in rows], now)
            by_id = {j.id: job_json(j, now, billed=bills[j.id]) for j in rows}
            for j in rows:
                if j.kind == "array":
                    _with_tasks(by_id[j.id], self.tasks_of(j.id, s), listed=True)
            return [by_id[i] for i in wanted if i in by_id], total

    def usage(self, owner: str) -> dict:
        """Billed minutes of the owner's jobs (:func:`~gpulab.jobs.usage.owner_usage`)."""
        return owner_usage(self.db, self.instance, owner)

    def month_usage(
        self,
        month: str,
        owner: str | None = None,
        owners: list[str] | None = None,
        after: str | None = None,
        limit: int | None = None,
    ) -> list[dict]:
        """Each user's (or ``owner``'s, or only ``owners``') billed job minutes in ``month``
        ("YYYY-MM"); ``after``, ``limit``: a page of users by name
        (:func:`~gpulab.jobs.usage.month_report`)."""
        return month_report(self.db, self.instance, month, owner, owners, after, limit)

    def counts(self, owner: str | None = None, *, runs: bool = False) -> dict[str, int]:
        """How many of the owner's (or everyone's) jobs are in each state (one grouped query):
        an array once, as its owner sees it; ``runs``: what runs instead, each task of an
        array and never the array (the metrics' gpulab_jobs)."""
        where = [Job.instance == self.instance, Job.kind != ("array" if runs else "task")]
        if owner is not None:
            where.append(Job.owner == owner)
        with self.db.read() as s:
            rows = s.execute(
                select(Job.state, func.count()).where(*where).group_by(Job.state)
            ).all()
        return {state: n for state, n in rows}

    def _counts_slot(self) -> list:
        return _COUNTS.setdefault(self.db, {}).setdefault(self.instance, [0, None])

    def generation(self) -> int:
        """How many times a job of this process may have changed state: a reader that kept
        something these changes make stale compares it (:meth:`everyones_counts`, the
        admin page's users: :func:`gpulab.jobs.overview.admin_overview`)."""
        return self._counts_slot()[0]

    def everyones_counts(self) -> dict[str, int]:
        """:meth:`counts` of everyone's jobs, reused while no job of this process changed
        state and for at most :data:`COUNTS_MAX_AGE` seconds: a count reads every job's
        entry of an index (6 ms at 100,000 jobs), the admin page and the admin's list ask
        for it at each request, and the service's own writers (every state change goes
        through this class) make it stale."""
        slot = self._counts_slot()
        generation, kept = slot[0], slot[1]
        now = time.monotonic()
        if kept is not None and kept[0] == generation and now - kept[1] < COUNTS_MAX_AGE:
            return dict(kept[2])
        counts = self.counts(None)
        if slot[0] == generation:  # no change began and ended meanwhile: keep it
            slot[1] = (generation, now, counts)
        return dict(counts)

    def active_and_queued(self) -> list[dict]:
        """What the scheduler needs, without histories (it runs several times a second)."""
        wanted = {JobState.QUEUED.value} | {s.value for s in ACTIVE}
        with self.db.read() as s:
            q = select(Job).where(
                Job.instance == self.instance, Job.state.in_(wanted), Job.kind != "array"
            )
            return [
                {
                    "id": j.id,
                    # a task's array ("" for a plain job): its spec's parallelism caps them
                    "array": j.parent,
                    "task_index": j.task_index,
                    "owner": j.owner,
                    "state": j.state,
                    "spec": j.spec,
                    "groups": [g for g in j.groups.split(",") if g],
                    "request": j.request,
                    "outcome": j.outcome,
                    "over_quota": bool(j.over_quota),
                    "submitted": _iso(j.submitted),
                    "updated": _iso(j.updated),
                    "running_since": _iso(j.running_since),
                    "devices": j.devices or "",  # as stored: each rank's, ";"-separated
                }
                # sorted here, not by the database: an ORDER BY submitted leads SQLite's planner
                # to walk the submission index through every ended job instead of the
                # (instance, state) one through the few live ones
                for j in sorted(s.scalars(q), key=lambda j: (j.submitted, j.id))
            ]

    def ended_with_container(self) -> list[tuple[str, str, datetime, str, dict, str]]:
        """(id, container, updated, state, spec, node) of ended jobs whose container is still
        there."""
        with self.db.read() as s:
            q = select(Job.id, Job.container, Job.updated, Job.state, Job.spec, Job.node).where(
                Job.instance == self.instance,
                Job.state.in_({e.value for e in ENDED}),
                Job.container != "",
            )
            return [tuple(row) for row in s.execute(q)]

    @_changes_counts
    def delete(self, job_id: str) -> dict:
        """Compare-and-set: delete an ended job's record and return it; InvalidTransition if
        it is not ended (a resume won the race), KeyError if it is gone already. Whatever of
        it is left in the engine (container, volumes) is removed afterwards by the caller, or
        by the supervisor's sweep of containers without a record."""
        with self.db.session() as s:
            job, _ = self._locked(s, job_id, ENDED, JobState.DONE)
            out = job_json(job, history=False)
            s.delete(job)
            return out

    @_changes_counts
    def delete_expired(self, now: datetime, default: float | None, limit: int) -> list[dict]:
        """Delete up to ``limit`` ended jobs whose retention is over, with their events; their
        (id, node, spec) as :meth:`delete` returns them, the oldest due first. Over: an own
        ``auto_delete_after`` (``delete_at``) reached, else ``default`` seconds (None: never)
        since the job ended. Only DONE, FAILED, INTERRUPTED and ERROR jobs (never one that is
        not ended, nor SYNC_FAILED).

        Two steps, so that the write lock is held for the deletion alone: the candidates are
        picked by a read (a snapshot, beside the writers), each rule a walk of one index that
        stops at ``limit`` (:meth:`_due`); then one short write transaction re-reads them by
        id with the same conditions, their rows locked (a compare-and-set: a job resumed or
        made SYNC_FAILED since the pick is not deleted), and deletes those."""
        with self.db.read() as s:
            picked = self._due(s, now, default, limit)
        if not picked:
            return []
        with self.db.session() as s:
            # by primary key: on SQLite the other columns' indexes kept out (its planner
            # took (instance, state) or (instance, updated) and read every ended job: 50 ms
            # of write lock a batch with 100,000 of them, bench/bench_storage.py)
            bare = _unindexed if s.get_bind().dialect.name == "sqlite" else None
            rows = s.execute(
                select(Job.id, Job.node, Job.spec, Job.owner, Job.container, Job.kind)
                .where(Job.id.in_(picked), *self._expired(now, default, bare))
                .with_for_update()
            ).all()
            order = {job_id: i for i, job_id in enumerate(picked)}
            rows = self._with_tasks_retained(s, sorted(rows, key=lambda r: order[r.id]))
            if not rows:
                return []
            ids = [r.id for r in rows]
            s.execute(delete(JobEvent).where(JobEvent.job_id.in_(ids)))
            # by id alone (re-read above with every condition, this instance's, locked)
            s.execute(delete(Job).where(Job.id.in_(ids)))
        return [{"id": r.id, "node": r.node or "", "spec": r.spec, "owner": r.owner} for r in rows]

    def _expired(self, now: datetime, default: float | None, bare=None) -> tuple:
        """What makes a job retention's to delete, as SQL conditions (the deletion's
        compare-and-set); ``bare``: what each column is wrapped in (:func:`_unindexed`)."""
        c = bare or (lambda column: column)
        due = [c(Job.delete_at) <= now]
        if default is not None:
            cutoff = now - timedelta(seconds=default)
            due.append(c(Job.delete_at).is_(None) & (c(Job.updated) <= cutoff))
        return (
            c(Job.instance) == self.instance,
            c(Job.state).in_(_RETAINED_VALUES),
            c(Job.kind) != "task",  # a task goes with its array, never alone
            or_(*due),
        )

    def _due(self, s, now: datetime, default: float | None, limit: int) -> list[str]:
        """Up to ``limit`` ids of jobs whose retention is over, the oldest due first: those
        with their own ``delete_at`` (a walk of the (delete_at) index from the oldest) and,
        with a site default, the others by their end (a walk of (instance, updated), revision
        0011, up to the cut-off). Each walk stops at ``limit`` matches; what the second passes
        over on the way are the jobs unchanged since before the cut-off that it may not
        delete: those not ended (a long run), SYNC_FAILED, arrays kept for a task's push, or
        with a later ``delete_at`` of their own (longer than the site's)."""
        # SQLite's planner, without statistics, would take the states' index (every ended
        # job) and sort them: its unary + keeps a column's other indexes out of each walk
        bare = _unindexed if s.get_bind().dialect.name == "sqlite" else (lambda c: c)
        # an array with a task that is not retained (its output waiting for a push) is kept
        # whole (:meth:`_with_tasks_retained`): never picked, or a batch of them at the head
        # of the line would stop every sweep for good (a walk of the tasks' parent index)
        task = aliased(Job)
        held = exists().where(task.parent == Job.id, task.state.not_in(_RETAINED_VALUES))
        retained = (
            bare(Job.state).in_(_RETAINED_VALUES),
            bare(Job.kind) != "task",
            or_(bare(Job.kind) != "array", ~held),
        )
        own = (
            select(Job.id, Job.delete_at)
            .where(bare(Job.instance) == self.instance, *retained, Job.delete_at <= now)
            .order_by(Job.delete_at)
            .limit(limit)
        )
        due: list[tuple[datetime, str]] = [(at, i) for i, at in s.execute(own)]
        if default is not None:
            cutoff = now - timedelta(seconds=default)
            by_end = (
                select(Job.id, Job.updated)
                .where(
                    Job.instance == self.instance,
                    *retained,
                    bare(Job.delete_at).is_(None),
                    Job.updated <= cutoff,
                )
                .order_by(Job.updated)
                .limit(limit)
            )
            due.extend((at, i) for i, at in s.execute(by_end))
        due.sort(key=lambda d: (d[0], d[1]))
        return [i for _, i in due[:limit]]

    def _with_tasks_retained(self, s, rows: list) -> list:
        """Retention's picks, each array with its tasks when every one of them is retained
        (ended, not SYNC_FAILED); an array with another task is kept whole for now."""
        arrays = [r.id for r in rows if r.kind == "array"]
        if not arrays:
            return rows
        tasks: dict[str, list] = {a: [] for a in arrays}
        for t in s.execute(
            select(Job.id, Job.node, Job.spec, Job.owner, Job.container, Job.kind, Job.parent)
            .add_columns(Job.state)
            .where(Job.instance == self.instance, Job.parent.in_(arrays))
            .with_for_update()
        ).all():
            tasks[t.parent].append(t)
        out = []
        for r in rows:
            if r.kind != "array":
                out.append(r)
            elif all(t.state in _RETAINED_VALUES for t in tasks[r.id]):
                out.extend([r, *tasks[r.id]])
        return out

    def with_volumes(self) -> set[str]:
        """Ids of the jobs whose volumes may still be on a node: every job but the ended ones
        whose container and volumes were removed (``forget_container``)."""
        with self.db.read() as s:
            rows = s.execute(
                select(Job.id, Job.state, Job.container).where(Job.instance == self.instance)
            ).all()
        ended = {e.value for e in ENDED}
        return {i for i, state, container in rows if container or state not in ended}

    def ids(self) -> set[str]:
        """Every job id of this instance (the sweep of orphaned containers compares)."""
        with self.db.read() as s:
            return set(s.scalars(select(Job.id).where(Job.instance == self.instance)))

    # --- the admin page's reads: counts and pages, never every row -----------------------

    def owners_after(self, after: str, limit: int) -> list[str]:
        """Up to ``limit`` owners of jobs, by name, after ``after`` ("" from the first): a
        walk of the (instance, owner) index that stops at the page's end."""
        with self.db.read() as s:
            return list(
                s.scalars(
                    select(Job.owner)
                    .where(Job.instance == self.instance, Job.owner > after)
                    .group_by(Job.owner)
                    .order_by(Job.owner)
                    .limit(limit)
                )
            )

    def owner_rows(self, owners: list[str]) -> dict[str, dict]:
        """For each of ``owners`` (a page of them) with a job: ``jobs`` (what runs: plain
        jobs and arrays' tasks), ``jobs_active``, ``jobs_queued`` and ``groups`` (as their
        newest job remembers them). Two grouped queries on the owners' rows only."""
        if not owners:
            return {}
        mine = (Job.instance == self.instance, Job.owner.in_(owners))
        out: dict[str, dict] = {}
        active = {s.value for s in ACTIVE}
        with self.db.read() as s:
            for owner, state, n in s.execute(
                select(Job.owner, Job.state, func.count())
                .where(*mine, Job.kind != "array")
                .group_by(Job.owner, Job.state)
            ):
                row = out.setdefault(
                    owner, {"jobs": 0, "jobs_active": 0, "jobs_queued": 0, "groups": []}
                )
                row["jobs"] += n
                if state in active:
                    row["jobs_active"] += n
                elif state == JobState.QUEUED.value:
                    row["jobs_queued"] += n
            # each owner's newest job's groups: one seek of the (instance, owner, submitted)
            # index per owner of the page
            newest = aliased(Job)
            groups_of = (
                select(newest.groups)
                .where(newest.instance == self.instance, newest.owner == Job.owner)
                .order_by(newest.submitted.desc(), newest.id.desc())
                .limit(1)
                .scalar_subquery()
            )
            for owner, groups in s.execute(
                select(Job.owner, groups_of).where(*mine).group_by(Job.owner)
            ):
                row = out.setdefault(
                    owner, {"jobs": 0, "jobs_active": 0, "jobs_queued": 0, "groups": []}
                )
                row["groups"] = [g for g in (groups or "").split(",") if g]
        return out

    def usage_of_owners(self, owners: list[str]) -> dict[str, int]:
        """Billed job minutes of each of ``owners``, all time, as :meth:`usage` gives them
        one by one (:func:`~gpulab.jobs.usage.owners_billed`): three queries for the page."""
        return owners_billed(self.db, self.instance, owners)

    def existing(self, ids: list[str]) -> set[str]:
        """Which of ``ids`` are jobs of this instance (the GPU table links only those)."""
        if not ids:
            return set()
        with self.db.read() as s:
            found = s.execute(select(Job.id, Job.instance).where(Job.id.in_(ids)))
            return {i for i, instance in found if instance == self.instance}

    def total(self) -> int:
        """How many job records there are (an array once, as its owner sees it)."""
        with self.db.read() as s:
            return s.scalar(
                select(func.count())
                .select_from(Job)
                .where(Job.instance == self.instance, Job.kind != "task")
            )
