"""A job's output over the REST API (``/api/jobs/{id}/logs``): one rank's, or every rank's
merged, read or followed live, within the cap on the streams open at once
(:mod:`gpulab.jobs.logs`, which also says what is kept and how ranks merge).

Followers read through a thread pool of their own (``base.pool("logs")``), so that they never
take the engine pool's threads from spawns and jobs."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import threading

from tornado.iostream import StreamClosedError

from ...jobs.gang import rank_of
from ...jobs.logs import LogStreams, merged_tail, strip_stamps
from ...lifecycle import JobState
from ...names import rank_name
from ...runtime.base import WorkloadGone
from ..base import BaseHandler, answer_refusals, authenticated, pool

J = JobState

#: chunks a log stream may buffer for a slow client before its reader thread waits
LOG_QUEUE_CHUNKS = 64
#: a line of a rank's followed output longer than this is cut into several prefixed ones
LOG_LINE_MAX = 64 * 1024
#: the log streams open in this service (each holds a thread of pool("logs"))
_streams = LogStreams()


class JobLogsHandler(BaseHandler):
    @authenticated
    async def get(self, job_id: str):
        """The job's output; ?follow=true streams it until the job's container ends."""
        job = await self.own_job(job_id)
        follow = self.flag("follow")
        workers = int(job["spec"].get("workers") or 1)
        rank = self.get_argument("rank", None)
        user = self.current_user["name"]
        with answer_refusals():  # a rank the job does not have is a 404
            rank = rank_of(rank, job_id, workers) if rank is not None else None
        with answer_refusals(), _streams.held(user, workers, rank, follow):  # else 429
            if workers > 1 and rank is None:
                await self._all_ranks(job_id, workers, follow)
            else:
                await self._logs(job_id, follow, rank if workers > 1 else None)

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
            read = functools.partial(merged_tail, sup.runtime, names)
            with contextlib.suppress(WorkloadGone):  # ended and removed meanwhile
                self.write(await asyncio.get_running_loop().run_in_executor(pool("logs"), read))
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
                        pool("logs"), functools.partial(runtime.log_stream, name, follow)
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
            loop.run_in_executor(pool("logs"), pump, prefix.encode(), stream)
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
