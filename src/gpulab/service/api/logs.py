"""A job's output over the REST API (``/api/jobs/{id}/logs``): one rank's, or every rank's
merged, read or followed live. Which rank, the cap on the streams open at once and where the
output is (the job's workloads, waited for while it starts, or its saved log) are the jobs
domain's (:func:`gpulab.jobs.output.read`); this handler delivers it.

Followers read through a thread pool of their own (``base.pool("logs")``), so that they never
take the engine pool's threads from spawns and jobs."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import threading

from tornado.iostream import StreamClosedError

from ...jobs import output
from ...runtime.base import WorkloadGone
from ..base import BaseHandler, answer_refusals, authenticated, pool

#: chunks a log stream may buffer for a slow client before its reader thread waits
LOG_QUEUE_CHUNKS = 64
#: a line of a rank's followed output longer than this is cut into several prefixed ones
LOG_LINE_MAX = 64 * 1024


async def _in_pool(read):
    """A blocking read of the engine's logs, on the log streams' pool."""
    return await asyncio.get_running_loop().run_in_executor(pool("logs"), read)


class JobLogsHandler(BaseHandler):
    @authenticated
    async def get(self, job_id: str):
        """The job's output; ?follow=true streams it until the job's container ends."""
        job = await self.own_job(job_id)
        follow = self.flag("follow")
        rank = self.get_argument("rank", None)
        user = self.current_user["name"]
        # a rank the job does not have is a 404, a stream over the caps a 429
        with answer_refusals():
            async with output.read(
                self.supervisor, job, rank, user, follow, lambda: self._client_gone, _in_pool
            ) as found:
                self.set_header("Content-Type", "text/plain; charset=utf-8")
                if found is None:  # the client went while the job was starting
                    return
                if found.live:
                    await self._stream(list(found.live), follow)
                else:
                    self.write(found.whole)
                    self.finish()

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
