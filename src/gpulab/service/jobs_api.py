"""REST API of training jobs (under /services/gpulab/api/jobs).

Permissions are JupyterHub RBAC scopes: ``custom:gpulab:jobs:read`` to read one's own jobs,
``custom:gpulab:jobs:manage`` to submit and act on them; tokens carrying
``custom:gpulab:admin`` (and only those: the hub's admin flag counts for nothing) see and act on
everyone's. Another user's job is a 404 with the same body as an unknown id: its existence is
not revealed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import threading

from tornado.iostream import StreamClosedError

from ..errors import FieldError
from ..jobs.containers import rank_log_share, read_tail
from ..jobs.gang import merge_logs, rank_name, strip_stamps
from ..jobs.records import ACTIVE, ENDED, QueueFull
from ..jobs.scheduler import can_ever_fit
from ..jobs.spec import parse_job_spec
from ..lifecycle import InvalidTransition, JobState
from ..runtime.base import WorkloadGone
from .app_base import (
    ASCII_SPACE,
    JOBS_MANAGE,
    JOBS_READ,
    ApiError,
    BaseHandler,
    authenticated,
    read,
)

J = JobState
#: a started job can be interrupted until it is FINALIZING (its outcome is decided then)
INTERRUPTIBLE = frozenset(ACTIVE - {J.FINALIZING})
READ, MANAGE = JOBS_READ, JOBS_MANAGE

#: chunks a log stream may buffer for a slow client before its reader thread waits
LOG_QUEUE_CHUNKS = 64
#: a line of a rank's followed output longer than this is cut into several prefixed ones
LOG_LINE_MAX = 64 * 1024
#: log streams one user may hold open at once, and threads for all streams together (a
#: pool of their own: followers never take the engine pool's threads from spawns and jobs)
MAX_LOG_STREAMS_PER_USER = 8
LOG_STREAM_THREADS = 64
_streams_open: dict[str, int] = {}
_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _log_pool() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = concurrent.futures.ThreadPoolExecutor(
            LOG_STREAM_THREADS, thread_name_prefix="gpulab-logs"
        )
    return _pool


class JobsBase(BaseHandler):
    @property
    def supervisor(self):
        return self.settings["supervisor"]

    @property
    def jobs(self):
        return self.supervisor.records

    async def own_job(self, job_id: str, scope: str = READ) -> dict:
        me = self.require(scope)
        job = await read(self.jobs.get, job_id)
        if job is None or (job["owner"] != me["name"] and not self.is_admin(me)):
            raise ApiError(404, f"no job {job_id}")
        return job

    def body(self) -> dict:
        try:
            data = json.loads(self.request.body or b"{}")
        except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
            raise ApiError(400, "the body must be a JSON object", field="body") from None
        if not isinstance(data, dict):
            raise ApiError(400, "the body must be a JSON object", field="body")
        return data


class JobsHandler(JobsBase):
    @authenticated
    async def get(self):
        """List jobs: yours (admins: ?user=NAME or ?all=true), ?state=A,B, ?label=k=v."""
        me = self.require(READ)
        user = self.get_argument("user", me["name"])
        want_all = self.flag("all")
        if (user != me["name"] or want_all) and not self.is_admin(me):
            raise ApiError(403, "only admins may list other users' jobs")
        states = None
        raw = self.get_argument("state", "", strip=False)
        if raw.strip(ASCII_SPACE):
            # names in any (ASCII) case, around ASCII white space: what the document's pattern
            # says ("ſ".upper() is "S", and "\xa0" is white space to str.strip())
            states = {s.strip(ASCII_SPACE) for s in raw.split(",")}
            states = {s.upper() if s.isascii() else s for s in states}
            unknown = states - {s.value for s in JobState}
            if unknown:
                raise ApiError(
                    400,
                    f"unknown state {sorted(unknown)[0]}; states are: "
                    + ", ".join(s.value for s in JobState),
                    field="state",
                )
        labels = {}
        for item in self.get_arguments("label"):
            if "=" not in item:
                raise ApiError(400, "label filters are key=value", field="label")
            k, v = item.split("=", 1)
            labels[k] = v
        limit, offset = self.page_args()
        rows, total = await read(
            self.jobs.page, None if want_all else user, states, labels or None, limit, offset
        )
        self.write_page("jobs", rows, total, limit, offset)

    @authenticated
    async def post(self):
        """Submit a job; 201 with the job, or 400 naming the field and the reason."""
        me = self.require(MANAGE)
        raw = self.body()
        job = await self.submit(me, raw)
        self.set_header("Location", self.request.path.rstrip("/") + "/" + job["id"])
        self.write_json(job, 201)

    async def submit(self, me: dict, raw: dict) -> dict:
        s = self.settings["gpulab"]
        user, groups = me["name"], list(me.get("groups") or [])
        host_gpus, gpu_home = self.supervisor.ledger.gpu_home()
        store = self.supervisor.secrets
        secret_names = (
            frozenset(i.name for i in await read(store.names, user)) if store.available else None
        )
        try:
            spec = parse_job_spec(
                raw,
                catalog=s.catalog,
                flavors=s.flavor_map,
                limits=s.limits_for(user, groups),
                default_flavor=None,
                allowed_images=frozenset(s.allowed_images),
                storage=s.storage,
                user=user,
                host_gpus=host_gpus,
                max_timeout=s.job_max_timeout,
                gpu_home=gpu_home,
                secret_names=secret_names,
                git_allowed=s.job_git_sources,
            )
        except FieldError as e:
            raise ApiError(400, str(e), field=e.field) from None
        if spec.priority > s.max_user_priority and not self.is_admin(self.current_user):
            raise ApiError(
                403,
                f"priority {spec.priority} is above {s.max_user_priority}, the highest a user "
                "may ask for (higher ones need the custom:gpulab:admin scope)",
                field="priority",
            )
        quota = s.quota_for(user, groups)
        # a gang's size is checked against every node by the ledger; its sum against the quota
        fits_on = host_gpus if spec.workers == 1 else spec.total_gpus
        if spec.workers > s.max_job_workers:
            raise ApiError(
                400,
                f"{spec.workers} workers requested but one user's jobs may have at most "
                f"{s.max_job_workers} together",
                field="workers",
            )
        why = self.supervisor.ledger.gang_refusal(spec.resources.gpus, spec.workers)
        why = why or can_ever_fit(spec.total_gpus, fits_on, quota, spec.preemptible, gpu_home)
        if why and spec.workers > 1 and not why.startswith(f"{spec.workers} workers"):
            why = f"{spec.workers} workers of {spec.resources.gpus} GPU(s) each: {why}"
        if why:
            raise ApiError(400, why, field="workers" if spec.workers > 1 else "resources.gpus")
        try:
            job = await asyncio.to_thread(
                self.jobs.create,
                user,
                spec.to_json(),
                spec.name,
                groups,
                max_unfinished=s.max_queued_jobs,
            )
        except QueueFull as e:
            raise ApiError(409, str(e)) from None
        self.supervisor.wake.set()
        return job


class JobHandler(JobsBase):
    @authenticated
    async def get(self, job_id: str):
        self.write_json(await self.own_job(job_id))

    @authenticated
    async def delete(self, job_id: str):
        """Delete an ended job: its record, saved logs, container and volumes."""
        job = await self.own_job(job_id, MANAGE)
        if JobState(job["state"]) not in ENDED:
            raise ApiError(409, f"job {job_id} is {job['state']}: interrupt it first")
        sup = self.supervisor
        # the record goes first, in one compare-and-set on its ended state: a resume racing
        # this delete either wins (409 here) or finds no job (404 there); what the engine
        # still holds is removed below, or by the supervisor's sweep of orphaned containers
        try:
            await asyncio.to_thread(self.jobs.delete, job_id)
        except KeyError:
            raise ApiError(404, f"no job {job_id}") from None
        except InvalidTransition as e:
            raise ApiError(409, f"job {job_id} changed meanwhile: {e}") from None
        await sup.remove_from_engine(job_id, job["spec"], job.get("node") or "")
        if int(job["spec"].get("workers") or 1) > 1:  # its own network, if still there
            with contextlib.suppress(Exception):
                await sup.runtime.remove_job_network(sup.s.instance, job_id)

        def unlink() -> None:  # file system work off the event loop
            for path in sup.saved_logs(job_id):
                path.unlink(missing_ok=True)

        await asyncio.to_thread(unlink)
        self.set_status(204)
        self.finish()


class JobEventsHandler(JobsBase):
    @authenticated
    async def get(self, job_id: str):
        job = await self.own_job(job_id)
        self.write_json({"id": job_id, "events": job["history"]})


class JobActionHandler(JobsBase):
    @authenticated
    async def post(self, job_id: str, action: str):
        job = await self.own_job(job_id, MANAGE)
        state = JobState(job["state"])
        jobs = self.jobs
        try:
            if action == "interrupt":
                if state is J.QUEUED:
                    try:
                        result = await asyncio.to_thread(
                            jobs.transition,
                            job_id,
                            J.INTERRUPTED,
                            reason="USER_INTERRUPT",
                            message="interrupted while queued",
                            expect=frozenset({J.QUEUED}),
                        )
                        return self.write_json(result)
                    except InvalidTransition:
                        # the scheduler placed it meanwhile: interrupt it as a started job
                        current = await asyncio.to_thread(jobs.get, job_id, False)
                        state = JobState(current["state"]) if current else state
                try:  # compare-and-set: only while the job can still be stopped
                    result = await asyncio.to_thread(
                        jobs.ask, job_id, "interrupt", states=INTERRUPTIBLE
                    )
                except InvalidTransition as e:
                    now = e.old.value if e.old else state.value
                    raise ApiError(409, f"job {job_id} is {now}: nothing to interrupt") from None
                self.supervisor.wake.set()
                return self.write_json(result, 202)
            elif action == "resume":
                if state is not J.INTERRUPTED:
                    raise ApiError(
                        409,
                        f"only an INTERRUPTED job can be resumed; this one is "
                        f"{state.value} (rerun makes a copy of any job)",
                    )
                result = await asyncio.to_thread(
                    jobs.transition,
                    job_id,
                    J.QUEUED,
                    reason="RESUMED",
                    message="resumed by its owner",
                    restarts=0,
                    hang_restarts=0,
                    exit_code=None,
                    expect=frozenset({J.INTERRUPTED}),
                )
                self.supervisor.wake.set()
            elif action == "rerun":
                # the copy belongs to the job's owner, also when an admin asks for it
                owner = {"name": job["owner"], "groups": job["groups"]}
                result = await JobsHandler.submit(self, owner, job["spec"])
                jobs_path = self.request.path.rsplit("/", 2)[0]
                self.set_header("Location", f"{jobs_path}/{result['id']}")
                return self.write_json(result, 201)
            elif action == "push":
                if state is not J.SYNC_FAILED:
                    raise ApiError(
                        409,
                        f"only a SYNC_FAILED job's push can be retried; this one is {state.value}",
                    )
                result = await self.supervisor.retry_push(job_id)
                return self.write_json(result, 200 if result["state"] != "SYNC_FAILED" else 502)
            else:
                raise ApiError(404, f"no action {action}")
        except InvalidTransition as e:
            raise ApiError(409, str(e)) from None
        except KeyError:  # deleted meanwhile (a concurrent DELETE): as if it never existed
            raise ApiError(404, f"no job {job_id}") from None
        self.write_json(result)


def parse_rank(text: str, job_id: str, workers: int) -> int:
    """A ``rank`` query parameter: 400 if it is no whole number, 404 if the job has no such
    worker (as for any part of a job that does not exist)."""
    if not (text.isascii() and text.isdigit()) or len(text) > 6:
        raise ApiError(400, f"rank must be a whole number, not {text[:20]!r}", field="rank")
    if int(text) >= workers:
        plural = "s" if workers > 1 else ""
        raise ApiError(
            404, f"job {job_id} has no rank {int(text)}: it has {workers} worker{plural}"
        )
    return int(text)


class JobLogsHandler(JobsBase):
    @authenticated
    async def get(self, job_id: str):
        """The job's output; ?follow=true streams it until the job's container ends."""
        job = await self.own_job(job_id)
        follow = self.flag("follow")
        workers = int(job["spec"].get("workers") or 1)
        rank = self.get_argument("rank", None)
        if rank is not None:
            rank = parse_rank(rank, job_id, workers)
        user = self.current_user["name"]
        # counted before anything waits: a follower waiting for its job to start holds a slot
        # too (per user, and in all, so that a few users cannot take every stream thread)
        # a distributed job's ranks followed together take one stream each
        cost = workers if workers > 1 and rank is None and follow else 1
        if _streams_open.get(user, 0) + cost > MAX_LOG_STREAMS_PER_USER:
            more = (
                f" (following all {workers} ranks takes {cost}: follow one with ?rank=K, "
                "or gpulab job logs --rank K)"
                if cost > 1
                else ""
            )
            raise ApiError(
                429,
                f"you have {_streams_open.get(user, 0)} of {MAX_LOG_STREAMS_PER_USER} job log "
                f"streams open; close one first{more}",
            )
        if sum(_streams_open.values()) + cost > LOG_STREAM_THREADS:
            raise ApiError(
                429, f"the service has {LOG_STREAM_THREADS} log streams open; try again later"
            )
        _streams_open[user] = _streams_open.get(user, 0) + cost
        try:
            if workers > 1 and rank is None:
                await self._all_ranks(job_id, workers, follow)
            else:
                await self._logs(job_id, follow, rank if workers > 1 else None)
        finally:
            _streams_open[user] -= cost
            if not _streams_open[user]:
                del _streams_open[user]

    async def _logs(self, job_id: str, follow: bool, rank: int | None = None) -> None:
        """One container's output: the job's, or one ``rank``'s of a distributed job."""
        sup = self.supervisor
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        name = rank_name(sup.container_name(job_id), rank or 0)
        started = await self._containers(job_id, [name], follow)
        if started is None:
            return None
        if not started:
            path = sup.log_file(job_id, rank)
            if path.exists():
                saved = await asyncio.to_thread(path.read_bytes)
                self.write(saved if rank is None else strip_stamps(saved))
            return self.finish()
        await self._stream([("", name)], follow)

    async def _containers(self, job_id: str, names: list[str], follow: bool) -> bool | None:
        """Whether every one of ``names`` exists; following a job that has not started yet,
        wait for them (or for its end). None: the client went meanwhile."""
        sup = self.supervisor
        waiting = {J.QUEUED.value, J.INITIALIZING.value, J.PENDING.value}
        while True:
            found = await asyncio.gather(*(sup.runtime.state(n) for n in names))
            if all(f is not None for f in found) or not follow:
                return all(f is not None for f in found)
            if self._client_gone:
                return None
            job = await asyncio.to_thread(self.jobs.get, job_id, False)
            if job is None or job["state"] not in waiting:
                return False
            await asyncio.sleep(0.5)

    async def _all_ranks(self, job_id: str, workers: int, follow: bool) -> None:
        """Every rank of a distributed job, each line prefixed ``[rank K]``: in time order
        (what the engine, or the saved logs, hold), then as it comes with ``follow``."""
        sup = self.supervisor
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        names = [rank_name(sup.container_name(job_id), r) for r in range(workers)]
        started = await self._containers(job_id, names, follow)
        if started is None:
            return None
        if not started:  # gone (or not started): what was saved
            path = sup.log_file(job_id)
            if path.exists():
                self.write(await asyncio.to_thread(path.read_bytes))
            return self.finish()
        if not follow:

            def read() -> bytes:
                share = rank_log_share(workers)  # the whole answer stays LOG_KEEP_BYTES
                per_rank = [read_tail(sup.runtime, n, share, timestamps=True) for n in names]
                return merge_logs(per_rank)

            with contextlib.suppress(WorkloadGone):  # ended and removed meanwhile
                self.write(await asyncio.get_running_loop().run_in_executor(_log_pool(), read))
            return self.finish()
        await self._stream([(f"[rank {r}] ", n) for r, n in enumerate(names)], follow)

    async def _stream(self, sources: list[tuple[str, str]], follow: bool) -> None:
        """Copy the containers' logs to the client through a bounded queue: ``sources`` are
        (prefix, container); with a prefix, each line is written whole, prefixed (a
        distributed job's ranks, interleaved as they come).

        A thread of the log-stream pool reads the engine's stream; when the queue is full it
        waits (back-pressure: a slow client never makes the service buffer a whole log).
        When the client goes, the engine's stream is closed, which ends the thread's read,
        and the queue is dropped: nothing outlives the request."""
        runtime = self.supervisor.runtime
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue(maxsize=LOG_QUEUE_CHUNKS)
        gone = threading.Event()
        streams = []
        try:
            for _, name in sources:
                streams.append(
                    await loop.run_in_executor(
                        _log_pool(), functools.partial(runtime.log_stream, name, follow)
                    )
                )
        except WorkloadGone:
            for stream in streams:
                stream.close()
            return self.finish()

        def put(item) -> bool:
            fut = asyncio.run_coroutine_threadsafe(queue.put(item), loop)
            while not gone.is_set():
                try:
                    fut.result(timeout=0.5)
                    return True
                except concurrent.futures.TimeoutError:
                    continue
                except concurrent.futures.CancelledError:
                    return False
            fut.cancel()
            return False

        def pump(prefix: bytes, stream) -> None:
            rest = b""
            try:
                for chunk in stream:
                    if prefix:  # whole lines only, each with its rank
                        *lines, rest = (rest + chunk).split(b"\n")
                        if len(rest) > LOG_LINE_MAX:
                            lines, rest = [*lines, rest], b""
                        chunk = b"".join(prefix + ln + b"\n" for ln in lines)
                    if chunk and not put(chunk):
                        return
                if rest:
                    put(prefix + rest + b"\n")
            except Exception:  # the container went away, or the stream was closed: the end
                pass
            finally:
                with contextlib.suppress(Exception):
                    stream.close()
            put(None)

        def close() -> None:
            gone.set()
            for stream in streams:
                with contextlib.suppress(Exception):
                    stream.close()  # unblocks the pump's read at once
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)  # and the handler's wait, if it is waiting

        self._on_close = close
        for (prefix, _), stream in zip(sources, streams, strict=True):
            loop.run_in_executor(_log_pool(), pump, prefix.encode(), stream)
        left = len(streams)  # the end is when every pump has ended
        try:
            while not gone.is_set():
                chunk = await queue.get()
                if chunk is None:
                    left -= 1
                    if left <= 0 or gone.is_set():
                        break
                    continue
                self.write(chunk)
                await self.flush()
        except StreamClosedError:
            return
        finally:
            close()
        if not self._finished:
            self.finish()

    _client_gone = False

    def on_connection_close(self) -> None:
        self._client_gone = True
        close = getattr(self, "_on_close", None)
        if close is not None:
            close()


class UsageHandler(JobsBase):
    @authenticated
    async def get(self):
        """Billed minutes: jobs (RUNNING to FINALIZING) and notebooks (RUNNING), per user."""
        me = self.require(READ)
        user = self.get_argument("user", me["name"])
        if user != me["name"] and not self.is_admin(me):
            raise ApiError(403, "only admins may read other users' usage")

        def both() -> tuple[dict, int]:  # one hop to a thread, not two
            return self.jobs.usage(user), self.records.billed_minutes(user)

        jobs, notebooks = await read(both)
        self.write_json(
            {
                "user": user,
                "jobs_billed_minutes": jobs["jobs_billed_minutes"],
                "notebooks_billed_minutes": notebooks,
                "billed_minutes": jobs["jobs_billed_minutes"] + notebooks,
            }
        )
