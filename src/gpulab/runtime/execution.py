"""Commands run in a running workload's container, through the Docker Engine API's exec.

Both backends speak that API (one engine, or a Swarm node's own engine: the manager has no
exec), so both use these blocking helpers, on a thread of the runtime's exec pool:

- :func:`run_command`: a command run to its end, or to its time-out, with its combined output
  capped. A command that outlives its time-out is killed with what it started (Docker has no
  API to stop an exec): it runs under ``/bin/sh`` (every job image has one: the job runner
  needs it), which first prints its PID; a second exec stops and kills that process tree.
- :class:`EngineExecSession`: an interactive TTY exec, read and written as a byte stream.

Every exec runs as gpulab's container user (1000:100), never as a user of the caller's
choosing, in the container's working directory, within the container's limits.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import struct
import threading
import time
from collections import deque
from collections.abc import Callable

import docker
from docker.errors import APIError, NotFound

from .base import ExecSession, WorkloadGone

#: the user every exec runs as: the one gpulab runs its workloads' containers as
EXEC_USER = "1000:100"
#: prints the shell's PID (the first line of stdout), then becomes the command
_PID_FIRST = ["/bin/sh", "-c", 'echo "$$"; exec "$@"', "sh"]
#: stops, then kills, a process and its descendants ($1), deepest last (/proc/PID/task/*/children;
#: without it, the process alone)
_KILL_TREE = (
    'k() { kill -STOP "$1"; for t in /proc/"$1"/task/*/children; do kids=; '
    'read -r kids 2>/dev/null < "$t"; for c in $kids; do k "$c"; done; done; '
    'kill -KILL "$1"; }; k "$1" 2>/dev/null'
)
#: an interactive shell, bash where the image has it, else sh, after its PID (the first line)
SHELL = [
    "/bin/sh",
    "-c",
    'echo "$$"; if command -v bash >/dev/null 2>&1; then exec bash; else exec sh; fi',
]
#: seconds a new session's shell may take to print its PID
_PID_WAIT = 15.0
#: Docker's default detach keys (ctrl-p,ctrl-q) would hold back every ctrl-p (shell history)
#: until the next key: a sequence nobody types instead
DETACH_KEYS = "ctrl-],ctrl-^,ctrl-]"
#: seconds the engine may take to report an exec's exit code after its output ended
_EXIT_GRACE = 5.0
_CHUNK = 65536
#: bytes of a shell's input that may wait to be sent to the engine: past it, :meth:`write
#: <EngineExecSession.write>` waits (back-pressure onto its caller) instead of growing the
#: service's memory while the shell does not take its input (nobody reads its output)
MAX_PENDING_INPUT = 256 * 1024
#: the most one send to the engine's connection takes (a TLS record); input is queued in
#: pieces of this size, so that a refused non-blocking send is retried with the very same bytes
_SEND_PIECE = 16384


def _not_running(name: str, e: APIError) -> WorkloadGone:
    """The engine's refusal as WorkloadGone: gone (404) or not running (409)."""
    if isinstance(e, NotFound):
        return WorkloadGone(name)
    return WorkloadGone(f"{name} is not running ({e.explanation or e})")


def _start(
    client: docker.APIClient, exec_id: str, tty: bool
) -> tuple[socket.socket, bytes, object]:
    """Start an exec on a hijacked connection: (its socket, what the HTTP parser had already
    read past the response's headers, the response, which must stay referenced while the
    socket is used: its collection would close the connection)."""
    res = client._post_json(
        client._url("/exec/{0}/start", exec_id),
        headers={"Connection": "Upgrade", "Upgrade": "tcp"},
        data={"Tty": tty, "Detach": False},
        stream=True,
    )
    client._raise_for_status(res)
    buffered = res.raw._fp.fp  # the HTTP parser's buffered reader over the connection
    raw = buffered.raw._sock
    # output written right behind the headers may sit in the parser's buffer: take it out
    # without waiting (a non-blocking peek reads only what is buffered or already arrived)
    raw.setblocking(False)
    try:
        early = buffered.peek()
    except (BlockingIOError, ssl.SSLWantReadError):
        early = b""
    if early:
        buffered.read(len(early))
    return raw, early, res


def exit_code(client: docker.APIClient, exec_id: str, deadline: float) -> int | None:
    """The exec's exit code once it has ended; None when it still runs at ``deadline``."""
    pause = 0.02
    while True:
        info = client.exec_inspect(exec_id)
        if not info.get("Running") and info.get("ExitCode") is not None:
            return int(info["ExitCode"])
        if time.monotonic() >= deadline:
            return None
        time.sleep(pause)
        pause = min(pause * 2, 0.25)


def _kill(client: docker.APIClient, container: str, exec_id: str, pid: int) -> None:
    """Kill a timed-out command's process tree, if it still runs (its PID is not reused yet)."""
    with contextlib.suppress(APIError):
        if not client.exec_inspect(exec_id).get("Running"):
            return
        killer = client.exec_create(
            container, ["/bin/sh", "-c", _KILL_TREE, "sh", str(pid)], user=EXEC_USER
        )
        client.exec_start(killer["Id"])


class _Collector:
    """Demultiplexes an exec's stdout and stderr frames into one capped output, taking the
    PID line that :data:`_PID_FIRST` prints first out of stdout."""

    def __init__(self, cap: int):
        self.cap = cap
        self.out = bytearray()
        self.truncated = False
        self.pid: int | None = None
        self._pid_line: bytearray | None = bytearray()
        self._buf = bytearray()

    def feed(self, data: bytes) -> None:
        self._buf += data
        while len(self._buf) >= 8:
            kind = self._buf[0]
            (size,) = struct.unpack(">I", self._buf[4:8])
            if len(self._buf) < 8 + size:
                return
            payload = bytes(self._buf[8 : 8 + size])
            del self._buf[: 8 + size]
            if kind == 1 and self._pid_line is not None:
                self._pid_line += payload
                if b"\n" not in self._pid_line:
                    continue
                head, _, payload = bytes(self._pid_line).partition(b"\n")
                self._pid_line = None
                with contextlib.suppress(ValueError):
                    self.pid = int(head)
            self._keep(payload)

    def _keep(self, payload: bytes) -> None:
        room = self.cap - len(self.out)
        if len(payload) > room:
            self.truncated = True
            payload = payload[: max(room, 0)]
        self.out += payload


def run_command(
    client: docker.APIClient, container: str, command: list[str], timeout: float, max_output: int
) -> tuple[int | None, bytes, bool]:
    """Blocking: run ``command`` in ``container`` (see the module's docstring).

    Returns (exit code, or None when it ran past ``timeout`` seconds and was killed; its
    stdout and stderr as they came, at most ``max_output`` bytes; whether more was cut).
    Output past the cap is read and dropped, so that the command never blocks on a full
    pipe. Raises WorkloadGone when the container is gone or not running."""
    deadline = time.monotonic() + timeout
    try:
        ex = client.exec_create(container, [*_PID_FIRST, *command], user=EXEC_USER)
        raw, early, res = _start(client, ex["Id"], tty=False)
    except APIError as e:
        raise _not_running(container, e) from None
    found = _Collector(max_output)
    found.feed(early)
    ended = False
    try:
        while (left := deadline - time.monotonic()) > 0:
            raw.settimeout(left)
            try:
                data = raw.recv(_CHUNK)
            except (TimeoutError, ssl.SSLWantReadError, BlockingIOError):
                continue
            if not data:
                ended = True
                break
            found.feed(data)
    finally:
        with contextlib.suppress(OSError):
            raw.close()
        res.close()
    # its output ended: so has the command, or it closed its output and runs on (then it has
    # until its time-out); past the time-out, it is killed unless it ended meanwhile
    now = time.monotonic()
    code = exit_code(client, ex["Id"], max(deadline, now + _EXIT_GRACE) if ended else now)
    if code is None and found.pid is not None:
        _kill(client, container, ex["Id"], found.pid)
    return code, bytes(found.out), found.truncated


class InputQueue:
    """A terminal's input on its way to the engine: at most ``cap`` bytes wait, in pieces of
    at most ``piece`` bytes. :meth:`put` waits for room (any thread); the sender takes
    :meth:`head` and reports what went with :meth:`sent`; :meth:`close` wakes every waiter."""

    def __init__(self, cap: int = MAX_PENDING_INPUT, piece: int = _SEND_PIECE):
        if piece > cap:
            raise ValueError("a piece must fit in the queue")
        self.cap, self.piece = cap, piece
        self._pieces: deque[bytes] = deque()
        self._size = 0
        self._room = threading.Condition()  # notified as the queue shrinks, and on close
        self.closed = False

    def put(self, data: bytes, queued: Callable[[], None] | None = None) -> bool:
        """Queue ``data`` piece by piece, each once there is room for it (calling ``queued``
        after each). False when the queue was closed before all of it was queued (the rest
        is dropped: it has nowhere to go)."""
        view = memoryview(data)
        for start in range(0, len(view), self.piece):
            piece = bytes(view[start : start + self.piece])
            with self._room:
                while not self.closed and self._size + len(piece) > self.cap:
                    self._room.wait()
                if self.closed:
                    return False
                self._pieces.append(piece)
                self._size += len(piece)
            if queued is not None:
                queued()
        return True

    def head(self) -> bytes | None:
        """The first piece waiting (None: nothing waits, or the queue is closed). The sender
        sends it, or sends it again whole if the connection refused it (as TLS wants)."""
        with self._room:
            return self._pieces[0] if self._pieces and not self.closed else None

    def sent(self, n: int) -> None:
        """The first ``n`` bytes of :meth:`head` went: make room for the writers."""
        with self._room:
            if not self._pieces:
                return
            head = self._pieces[0]
            if n < len(head):
                self._pieces[0] = head[n:]
            else:
                self._pieces.popleft()
            self._size -= min(n, len(head))
            self._room.notify_all()

    def __len__(self) -> int:
        """Bytes waiting."""
        with self._room:
            return self._size

    def close(self) -> None:
        with self._room:
            self.closed = True
            self._pieces.clear()
            self._size = 0
            self._room.notify_all()


class EngineExecSession(ExecSession):
    """An interactive TTY exec running :data:`SHELL` (see :class:`~.base.ExecSession`).

    All socket I/O happens in :meth:`read`'s thread, writes included (queued by
    :meth:`write` from any thread, which wakes the reader): one thread per connection is
    what a TLS socket allows. The reader sends queued input only as fast as the connection
    takes it (non-blocking, so that a shell busy writing output is still read), and at most
    :data:`MAX_PENDING_INPUT` bytes wait: :meth:`write` waits for room. A session closed while
    its shell runs hangs the shell up (SIGHUP, as a closed terminal does): what it started
    under ``nohup`` runs on."""

    def __init__(self, client: docker.APIClient, container: str, cols: int, rows: int):
        self._client, self._container = client, container
        try:
            ex = client.exec_create(
                container,
                SHELL,
                stdin=True,
                tty=True,
                user=EXEC_USER,
                environment={"TERM": "xterm-256color"},
                detach_keys=DETACH_KEYS,
            )
            self._id = ex["Id"]
            self._raw, self._early, self._res = _start(client, self._id, tty=True)
        except APIError as e:
            raise _not_running(container, e) from None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._input = InputQueue()
        self._closed = False
        self._released = False
        self._pid = self._read_pid()
        self.resize(cols, rows)

    def _read_pid(self) -> int | None:
        """The shell's PID, its first line of output (kept out of the terminal's)."""
        deadline = time.monotonic() + _PID_WAIT
        data = self._early
        while b"\n" not in data and (left := deadline - time.monotonic()) > 0:
            self._raw.settimeout(left)
            try:
                chunk = self._raw.recv(_CHUNK)
            except (TimeoutError, OSError):
                break
            if not chunk:
                break
            data += chunk
        with contextlib.suppress(OSError):
            self._raw.setblocking(False)
        head, newline, rest = data.partition(b"\n")
        if not newline:
            self._early = data
            return None
        self._early = rest
        try:
            return int(head.strip())
        except ValueError:
            self._early = data
            return None

    def read(self) -> bytes:
        if self._early:
            data, self._early = self._early, b""
            return data
        raw = self._raw
        while not self._closed:
            sending = self._flush()
            ready = isinstance(raw, ssl.SSLSocket) and raw.pending() > 0
            if not ready:
                readable, _, _ = select.select([raw, self._wake_r], [raw] if sending else [], [])
                if self._wake_r in readable:
                    with contextlib.suppress(BlockingIOError):
                        self._wake_r.recv(_CHUNK)
                ready = raw in readable
            if not ready:
                continue
            try:
                data = raw.recv(_CHUNK)
            except (BlockingIOError, ssl.SSLWantReadError, InterruptedError):
                continue
            except OSError:
                data = b""
            if data:
                return data
            break
        self._release()
        return b""

    def _flush(self) -> bool:
        """Send queued input as far as the connection takes it without blocking; True when
        some is left (the reader then waits for the connection to be writable, too). Input
        the engine cannot take must not stop the reader: a shell echoing a long paste blocks
        on its output until it is read."""
        while (piece := self._input.head()) is not None:
            try:
                sent = self._raw.send(piece)
            except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError):
                return True
            except ssl.SSLWantReadError:
                return False  # the TLS layer must read first: the reader's select sees to it
            except OSError:
                self._set_closed()
                return False
            self._input.sent(sent)
        return False

    def write(self, data: bytes) -> None:
        """Queue ``data`` for the terminal, waiting while :data:`MAX_PENDING_INPUT` bytes are
        already queued, until the reader has sent some or the session ends (see
        :meth:`.ExecSession.write`)."""
        self._input.put(data, self._wake)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a full wake-up pipe: the reader is awake anyway
            self._wake_w.send(b"w")

    def _set_closed(self) -> None:
        """Mark the session ended and wake the writers waiting for room."""
        self._closed = True
        self._input.close()

    def resize(self, cols: int, rows: int) -> None:
        with contextlib.suppress(APIError):  # not started yet, or ended: nothing to resize
            self._client.exec_resize(self._id, height=rows, width=cols)

    def close(self) -> None:
        self._set_closed()
        with contextlib.suppress(OSError):
            self._raw.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._wake_w.send(b"c")

    def _release(self) -> None:
        """Close the connection; hang up a shell that still runs (its user went away)."""
        if self._released:
            return
        self._released = True
        self._set_closed()
        for s in (self._raw, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                s.close()
        self._res.close()
        if self._pid is None:
            return
        with contextlib.suppress(APIError):
            if self._client.exec_inspect(self._id).get("Running"):
                hangup = self._client.exec_create(
                    self._container,
                    ["/bin/sh", "-c", 'kill -HUP "$1" 2>/dev/null', "sh", str(self._pid)],
                    user=EXEC_USER,
                )
                self._client.exec_start(hangup["Id"])

    def exit_code(self) -> int | None:
        try:
            return exit_code(self._client, self._id, time.monotonic() + _EXIT_GRACE)
        except APIError:
            return None
