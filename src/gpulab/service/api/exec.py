"""Exec and shell in a running job: ``POST /api/jobs/ID/exec`` runs a command to its end and
answers its output and exit code; ``GET /api/jobs/ID/shell`` is a WebSocket carrying an
interactive terminal (a TTY exec). The rules (only while RUNNING, the caps, the job's events)
are :mod:`gpulab.jobs.exec`'s.

Who: the job's owner and admins, with ``custom:gpulab:jobs:manage``; anyone else gets the
404 of a job that does not exist.

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
from urllib.parse import urlsplit

from tornado import websocket

from ...bounds import MAX_COMMAND_BYTES, MAX_COMMAND_ITEMS, MiB, size_text
from ...jobs import exec as execs
from ...jobs.exec import DEFAULT_EXEC_TIMEOUT, MAX_EXEC_OUTPUT, MAX_EXEC_TIMEOUT
from ...jobs.spec import JOB_SPEC_SCHEMA
from ...runtime.base import ExecSession
from ..base import JOBS_MANAGE, ApiError, BaseHandler, answer_refusals, authenticated, pool

#: the largest terminal, and the largest WebSocket message (a paste) a shell takes: with the
#: session's bounded input queue (runtime.execution.MAX_PENDING_INPUT), what one shell's input
#: may hold in the service's memory
MAX_TERMINAL_SIZE = 1000
MAX_SHELL_MESSAGE = 1 * MiB


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
    f"true). Output past {size_text(MAX_EXEC_OUTPUT)} is dropped (truncated true). The "
    f"command has a job's caps: at most {MAX_COMMAND_ITEMS} entries and "
    f"{size_text(MAX_COMMAND_BYTES)} in UTF-8 together (a string counts as sh, -c and it), "
    "which the schema's maxLength (characters) cannot state."
)


class JobExecHandler(BaseHandler):
    @authenticated
    async def post(self, job_id: str):
        """Run a command in the running job: its exit code (null on time-out) and output."""
        job = await self.own_job(job_id, JOBS_MANAGE)
        with answer_refusals():
            result = await execs.run(
                self.supervisor,
                job,
                self.get_argument("rank", "0"),
                self.request.body,
                by=self.current_user["name"],
            )
        self.write_json(result)


def same_host(origin: str, host: str) -> bool:
    """Whether a browser's ``Origin`` is this very host (scheme aside, as tornado compares)."""
    return bool(host) and urlsplit(origin).netloc.lower() == host.lower()


class JobShellHandler(BaseHandler, websocket.WebSocketHandler):
    """An interactive terminal in the running job, over a WebSocket (see the module)."""

    session: ExecSession | None = None
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

    def handshake(self) -> tuple[int, int]:
        """The rest of the handshake's checks (the page's XSRF token, the upgrade), and the
        terminal's size: run once the job and the rank were found right."""
        self.refuse_without_xsrf()
        if self.request.headers.get("Upgrade", "").lower() != "websocket":
            raise ApiError(400, "this is a WebSocket: connect with Upgrade: websocket")
        return self.terminal_size()

    @authenticated
    async def get(self, job_id: str):
        self.refuse_cross_site()
        job = await self.own_job(job_id, JOBS_MANAGE)
        me, rank = self.current_user["name"], self.get_argument("rank", "0")
        with answer_refusals():
            async with execs.shell(self.supervisor, job, rank, me, self.handshake) as session:
                self.session = session
                try:
                    # returns when the WebSocket has closed (or was refused: nothing opened)
                    await super().get(job_id)
                finally:
                    if self._pump is None:  # never upgraded: nobody reads it to its end
                        session.close()
                        await asyncio.get_running_loop().run_in_executor(
                            pool("shell"), _drain, session
                        )

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
        self._pump = loop.run_in_executor(pool("shell"), self._pump_terminal, loop)

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
            await asyncio.get_running_loop().run_in_executor(pool("shell"), session.write, message)
            return
        size = _resize(message)
        if size is None:
            self.close(1008, 'text frames are control messages: {"resize": [cols, rows]}')
            return
        await asyncio.get_running_loop().run_in_executor(pool("shell"), session.resize, *size)

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
