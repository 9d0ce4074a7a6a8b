"""Exec and shell in a running job: ``POST /api/jobs/ID/exec`` runs a command to its end and
answers its output and exit code; ``GET /api/jobs/ID/shell`` is a WebSocket carrying an
interactive terminal (a TTY exec). Both go through the runtime, so they work on every backend.

Who: the job's owner and admins, with ``custom:gpulab:jobs:manage``; anyone else gets the
404 of a job that does not exist. Every exec and every shell is recorded in the job's events
(who, and what command) before it runs. Commands run as the job's user (1000:100), never as
one of the caller's choosing, within the job container's limits.

The shell's WebSocket protocol: binary frames both ways are the terminal's bytes; a text frame
from the client is a control message, ``{"resize": [cols, rows]}``; when the shell exits the
service sends the text frame ``{"exit": CODE}`` (null when unknown) and closes. A browser
sends its cookies with a WebSocket to any site, so the handshake is refused unless its
``Origin`` is this very host (cross-site WebSocket hijacking), and a cookie-authenticated one
must also carry the page's XSRF token (``?_xsrf=``). Terminal content is never logged.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import math
import shlex
from urllib.parse import urlsplit

from tornado import websocket

from ...bounds import MiB, shown, size_text
from ...jobs.spec import JOB_SPEC_SCHEMA, JobSpecError, parse_command
from ...lifecycle import JobState
from ...names import rank_name
from ...runtime.base import ExecSession, WorkloadGone
from ..base import JOBS_MANAGE, ApiError, BaseHandler, authenticated
from .jobs import parse_rank

log = logging.getLogger("gpulab.service")

#: seconds an exec may run: its default, and the most a caller may ask for
DEFAULT_EXEC_TIMEOUT, MAX_EXEC_TIMEOUT = 60.0, 600.0
#: the most output an exec answers (stdout and stderr together); the rest is dropped
MAX_EXEC_OUTPUT = 1 * MiB
#: concurrent execs, and shells, per user and in all (each holds an engine connection and a
#: thread for its whole length)
MAX_EXECS_PER_USER, MAX_EXECS = 4, 32
MAX_SHELLS_PER_USER, MAX_SHELLS = 4, 32
#: the largest terminal, and the largest WebSocket message (a paste) a shell takes: with the
#: session's bounded input queue (runtime.execution.MAX_PENDING_INPUT), what one shell's input
#: may hold in the service's memory
MAX_TERMINAL_SIZE = 1000
MAX_SHELL_MESSAGE = 1 * MiB
#: characters of a command kept in the job's event
EVENT_COMMAND_CHARS = 200


#: the request body of an exec (the OpenAPI document's), and its answer
EXEC_REQUEST = {
    "type": "object",
    "additionalProperties": False,
    "required": ["command"],
    "properties": {
        "command": JOB_SPEC_SCHEMA["properties"]["command"],
        "timeout": {
            "type": ["number", "null"],
            "exclusiveMinimum": 0,
            "maximum": MAX_EXEC_TIMEOUT,
            "default": DEFAULT_EXEC_TIMEOUT,
            "description": "seconds before the command is killed",
        },
    },
}
EXEC_RESULT = {
    "type": "object",
    "required": ["exit_code", "output", "truncated", "timed_out"],
    "properties": {
        "exit_code": {"type": ["integer", "null"], "description": "null: it timed out"},
        "output": {"type": "string", "description": "stdout and stderr as they came (UTF-8)"},
        "truncated": {"type": "boolean"},
        "timed_out": {"type": "boolean"},
    },
}
EXEC_DESCRIPTION = (
    "The command runs as the job's user (1000:100) in its working directory, within its "
    "limits; past `timeout` it is killed with what it started (exit_code null, timed_out "
    f"true). Output past {size_text(MAX_EXEC_OUTPUT)} is dropped (truncated true)."
)

_execs: dict[str, int] = {}
_shells: dict[str, int] = {}
_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _shell_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The threads of the shells: per open shell, one reads its terminal and one writes its
    input (which waits while the shell's input is full) or resizes it."""
    global _pool
    if _pool is None:
        _pool = concurrent.futures.ThreadPoolExecutor(
            2 * MAX_SHELLS + 8, thread_name_prefix="gpulab-shell"
        )
    return _pool


def _take(counts: dict[str, int], user: str, per_user: int, total: int, what: str) -> None:
    """Count one more of ``what`` for ``user``, or 429 over either cap."""
    if counts.get(user, 0) >= per_user:
        raise ApiError(429, f"you have {per_user} {what} open; wait for one to end")
    if sum(counts.values()) >= total:
        raise ApiError(429, f"the service has {total} {what} open; try again later")
    counts[user] = counts.get(user, 0) + 1


def _give(counts: dict[str, int], user: str) -> None:
    counts[user] -= 1
    if not counts[user]:
        del counts[user]


def parse_exec(body: dict) -> tuple[list[str], float]:
    """(argv, time-out) of an exec request, or a 400 naming the field at fault."""
    unknown = sorted(set(body) - {"command", "timeout"})
    if unknown:
        raise ApiError(
            400,
            f"unknown field {shown(unknown[0])}: an exec takes command and timeout",
            field=str(unknown[0]),
        )
    if "command" not in body:
        raise ApiError(
            400, "command is required: a list of strings or one shell line", field="command"
        )
    try:  # the same rules and caps as a job's command
        command = parse_command(body["command"])
    except JobSpecError as e:
        raise ApiError(400, str(e), field="command") from None
    timeout = body.get("timeout", DEFAULT_EXEC_TIMEOUT)
    if timeout is None:
        timeout = DEFAULT_EXEC_TIMEOUT
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or not 0 < timeout <= MAX_EXEC_TIMEOUT
    ):
        raise ApiError(
            400,
            f"timeout must be a number of seconds above 0 and at most {MAX_EXEC_TIMEOUT:g}, "
            f"not {shown(timeout)}",
            field="timeout",
        )
    return command, float(timeout)


def command_text(command: str | list[str]) -> str:
    """The command as the job's events show it (a shell line as given, a list quoted as a
    shell would), on one line, cut at EVENT_COMMAND_CHARS."""
    text = command if isinstance(command, str) else shlex.join(command)
    text = " ".join(text.split())
    if len(text) > EVENT_COMMAND_CHARS:
        text = text[: EVENT_COMMAND_CHARS - 1] + "…"
    return text


class ExecBase(BaseHandler):
    async def running_job(self, job_id: str) -> dict:
        """The caller's (or, for an admin, anyone's) job, if it is RUNNING; else 404 or 409."""
        job = await self.own_job(job_id, JOBS_MANAGE)
        if job["state"] != JobState.RUNNING.value:
            raise ApiError(
                409, f"job {job_id} is {job['state']}: only a RUNNING job can run commands"
            )
        return job

    def target(self, job: dict) -> tuple[str, str]:
        """The container to run in (``?rank=K`` of a distributed job, else rank 0) and how
        the events name it ("" for a one-container job)."""
        workers = int(job["spec"].get("workers") or 1)
        rank = parse_rank(self.get_argument("rank", "0"), job["id"], workers)
        name = rank_name(self.supervisor.container_name(job["id"]), rank)
        return name, (f" (rank {rank})" if workers > 1 else "")

    async def record(self, job_id: str, kind: str, message: str) -> None:
        await asyncio.to_thread(self.jobs.note, job_id, kind, kind.upper(), message)


class JobExecHandler(ExecBase):
    @authenticated
    async def post(self, job_id: str):
        """Run a command in the running job: its exit code (null on time-out) and output."""
        job = await self.running_job(job_id)
        name, where = self.target(job)
        body = self.body()
        command, timeout = parse_exec(body)
        me = self.current_user["name"]
        _take(_execs, me, MAX_EXECS_PER_USER, MAX_EXECS, "execs")
        try:
            await self.record(
                job_id, "exec", f"exec by {me}{where}: {command_text(body['command'])}"
            )
            log.info("exec by %s in job %s", me, job_id)  # not the command: it may hold secrets
            sup = self.supervisor
            try:
                code, output, truncated = await sup.runtime.exec_run(
                    name, command, timeout, MAX_EXEC_OUTPUT
                )
            except WorkloadGone:
                raise ApiError(409, f"job {job_id} is no longer running") from None
            except Exception as e:
                log.warning("exec in job %s failed: %s", job_id, type(e).__name__)
                raise ApiError(502, "the container engine could not run the command") from None
        finally:
            _give(_execs, me)
        self.write_json(
            {
                "exit_code": code,
                "output": output.decode("utf-8", "replace"),
                "truncated": truncated,
                "timed_out": code is None,
            }
        )


def same_host(origin: str, host: str) -> bool:
    """Whether a browser's ``Origin`` is this very host (scheme aside, as tornado compares)."""
    return bool(host) and urlsplit(origin).netloc.lower() == host.lower()


class JobShellHandler(ExecBase, websocket.WebSocketHandler):
    """An interactive terminal in the running job, over a WebSocket (see the module)."""

    session: ExecSession | None = None
    _user = ""
    _gone = False

    # --- the handshake: everything refused before the upgrade, as JSON errors ---------------

    def check_origin(self, origin: str) -> bool:
        """Tornado's own check after ours (:meth:`refuse_cross_site`): this host only."""
        return same_host(origin, self.request.headers.get("Host", ""))

    def refuse_cross_site(self) -> None:
        origin = self.request.headers.get("Origin")
        site = self.request.headers.get("Sec-Fetch-Site", "")
        if (origin and not self.check_origin(origin)) or (
            not origin and site in ("cross-site", "same-site")
        ):
            raise ApiError(403, "cross-origin WebSocket refused: open the shell from this site")

    def refuse_without_xsrf(self) -> None:
        """A browser's cookie authenticated the handshake: it must carry the page's token."""
        if getattr(self, "_token_authenticated", False):
            return
        token = self.get_argument("_xsrf", "")
        if not token or token.encode("utf-8", "replace") != self.xsrf_token:
            raise ApiError(403, "this shell needs the page's XSRF token (?_xsrf=): reload the page")

    def terminal_size(self) -> tuple[int, int]:
        out = []
        for name, default in (("cols", 80), ("rows", 24)):
            raw = self.get_argument(name, str(default), strip=False)
            if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= MAX_TERMINAL_SIZE:
                raise ApiError(
                    400, f"{name} must be a whole number from 1 to {MAX_TERMINAL_SIZE}", field=name
                )
            out.append(int(raw))
        return out[0], out[1]

    @authenticated
    async def get(self, job_id: str):
        self.refuse_cross_site()
        job = await self.running_job(job_id)
        name, where = self.target(job)
        self.refuse_without_xsrf()
        if self.request.headers.get("Upgrade", "").lower() != "websocket":
            raise ApiError(400, "this is a WebSocket: connect with Upgrade: websocket")
        cols, rows = self.terminal_size()
        me = self.current_user["name"]
        _take(_shells, me, MAX_SHELLS_PER_USER, MAX_SHELLS, "shells")
        self._user = me
        try:
            await self.record(job_id, "shell", f"shell opened by {me}{where}")
            log.info("shell opened by %s in job %s", me, job_id)
            sup = self.supervisor
            try:
                self.session = await sup.runtime.exec_session(name, cols, rows)
            except WorkloadGone:
                raise ApiError(409, f"job {job_id} is no longer running") from None
            except Exception as e:
                log.warning("shell in job %s failed: %s", job_id, type(e).__name__)
                raise ApiError(502, "the container engine could not open a shell") from None
            # returns when the WebSocket has closed (or was refused: then nothing opened)
            await super().get(job_id)
        finally:
            if self.session is not None:
                self.session.close()
                if self._pump is None:  # never upgraded: nobody reads it to its end
                    await asyncio.get_running_loop().run_in_executor(
                        _shell_pool(), _drain, self.session
                    )
            _give(_shells, me)

    # --- the open WebSocket -----------------------------------------------------------------

    _pump: asyncio.Future | None = None

    @property
    def max_message_size(self) -> int:
        return MAX_SHELL_MESSAGE

    @property
    def ping_interval(self) -> float:
        return 30.0  # a client gone without a word is noticed, and its shell hung up

    def open(self, job_id: str) -> None:
        self.set_nodelay(True)
        loop = asyncio.get_running_loop()
        self._pump = loop.run_in_executor(_shell_pool(), self._pump_terminal, loop)

    def _pump_terminal(self, loop: asyncio.AbstractEventLoop) -> None:
        """On a thread: the terminal's output to the client, each chunk sent before the next
        is read (a slow client slows the shell down, never fills the service's memory)."""
        session = self.session
        assert session is not None
        while data := session.read():
            if self._gone or not self._sent(data, loop):
                session.close()  # and read on to the end: that releases the connection
        if not self._gone:
            code = session.exit_code()
            with contextlib.suppress(RuntimeError):  # the loop closed: the service is ending
                asyncio.run_coroutine_threadsafe(self._ended(code), loop)

    def _sent(self, data: bytes, loop: asyncio.AbstractEventLoop) -> bool:
        """On the pump's thread: send ``data`` and wait until it is written (False: the
        client is gone)."""
        try:
            sent = asyncio.run_coroutine_threadsafe(self._send(data), loop)
        except RuntimeError:
            return False
        while not self._gone:
            try:
                return sent.result(timeout=1.0)
            except concurrent.futures.TimeoutError:
                continue
            except concurrent.futures.CancelledError:
                return False
        sent.cancel()
        return False

    async def _send(self, data: bytes) -> bool:
        try:
            await self.write_message(data, binary=True)
            return True
        except websocket.WebSocketClosedError:
            return False

    async def _ended(self, code: int | None) -> None:
        """The shell exited: say with what, then close."""
        if self._gone:
            return
        try:
            await self.write_message(json.dumps({"exit": code}))
        except websocket.WebSocketClosedError:
            return
        self.close(1000, "the shell exited")

    async def on_message(self, message: str | bytes) -> None:
        """Tornado reads the client's next message only once this returns: while the shell's
        input is full, its write waits on a thread and this client's socket is left unread
        (back-pressure up to the client, never a growing queue in the service)."""
        session = self.session
        if session is None:
            return
        if isinstance(message, bytes):
            await asyncio.get_running_loop().run_in_executor(_shell_pool(), session.write, message)
            return
        size = _resize(message)
        if size is None:
            self.close(1008, 'text frames are control messages: {"resize": [cols, rows]}')
            return
        await asyncio.get_running_loop().run_in_executor(_shell_pool(), session.resize, *size)

    def on_close(self) -> None:
        self._gone = True
        if self.session is not None:
            self.session.close()


def _resize(message: str) -> tuple[int, int] | None:
    """(cols, rows) of a control message ``{"resize": [cols, rows]}``; None if it is not one."""
    try:
        data = json.loads(message)
    except ValueError:
        return None
    size = data.get("resize") if isinstance(data, dict) else None
    if (
        isinstance(size, list)
        and len(size) == 2
        and all(type(n) is int and 1 <= n <= MAX_TERMINAL_SIZE for n in size)
    ):
        return size[0], size[1]
    return None


def _drain(session: ExecSession) -> None:
    while session.read():
        pass
