"""``gpulab job exec`` and ``gpulab job shell``: commands and a terminal in a running job (see
:mod:`gpulab.cli` and the service; the rules: :mod:`gpulab.jobs.exec`).

``exec`` prints the command's output and exits with its exit code (124 when it ran past its
time-out, like coreutils' ``timeout``). ``shell`` puts the local terminal in raw mode and
carries every byte both ways over the service's WebSocket, the window's size included
(SIGWINCH), until the remote shell exits; it exits with the shell's exit code.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from urllib.parse import urlencode

from .client import EXIT_FAILED, EXIT_OK, EXIT_USAGE, SERVICE_PATH, Client, CliError
from .output import note, print_json

#: the exit code of a command killed at its time-out (coreutils' timeout says the same)
EXIT_TIMED_OUT = 124
#: seconds to wait for the service beyond the command's own time-out
_SLACK = 30
#: the service's default and largest time-out (jobs/exec.py)
DEFAULT_TIMEOUT, MAX_TIMEOUT = 60.0, 600.0


def _job_id(job_id: str) -> str:
    if not job_id.isascii() or not job_id.isalnum() or job_id != job_id.lower():
        raise CliError(f"{job_id!r} is not a job id (such as j1a2b3c4d5e6f)", EXIT_USAGE)
    return job_id


def cmd_job_exec(args: argparse.Namespace, client: Client) -> int:
    if not args.command:
        raise CliError("exec needs a command: gpulab job exec ID -- CMD [ARGS...]", EXIT_USAGE)
    timeout = args.timeout if args.timeout is not None else DEFAULT_TIMEOUT
    rank = getattr(args, "rank", None)
    result = client.json(
        "POST",
        f"/jobs/{_job_id(args.id)}/exec",
        params=[] if rank is None else [("rank", str(rank))],
        json={"command": list(args.command), "timeout": timeout},
        timeout=(10, timeout + _SLACK),
    )
    if args.output == "json":
        print_json(result)
    else:
        sys.stdout.write(result["output"])
        sys.stdout.flush()
    if result.get("truncated"):
        note("gpulab: the output was cut at the service's limit (1 MiB)")
    if result.get("exit_code") is None:
        note(f"gpulab: the command ran past its time-out ({timeout:g} s) and was killed")
        return EXIT_TIMED_OUT
    return int(result["exit_code"])


def cmd_job_shell(args: argparse.Namespace, client: Client) -> int:
    return asyncio.run(_shell(client, _job_id(args.id), getattr(args, "rank", None)))


def _ws_url(client: Client, job_id: str, cols: int, rows: int, rank: int | None = None) -> str:
    scheme, _, rest = client.url.partition("://")
    ws = "wss" if scheme == "https" else "ws"
    params: dict[str, int] = {"cols": cols, "rows": rows}
    if rank is not None:
        params["rank"] = rank
    query = urlencode(params)
    return f"{ws}://{rest}{SERVICE_PATH}/api/jobs/{job_id}/shell?{query}"


def _size(fd: int) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(fd)
        return max(size.columns, 1), max(size.lines, 1)
    except OSError:
        return 80, 24


async def _connect(client: Client, job_id: str, cols: int, rows: int, rank: int | None = None):
    """The open WebSocket, or a CliError with the service's message."""
    from tornado.httpclient import HTTPClientError, HTTPRequest
    from tornado.websocket import websocket_connect

    request = HTTPRequest(
        _ws_url(client, job_id, cols, rows, rank),
        headers={
            "Authorization": client.session.headers["Authorization"],
            "User-Agent": "gpulab-cli",
        },
        connect_timeout=10,
        request_timeout=60,
    )
    try:
        return await websocket_connect(request, max_message_size=16 * 1024 * 1024)
    except HTTPClientError as e:
        raise CliError(_refusal(client, e)) from None
    except OSError as e:
        raise CliError(f"cannot reach gpulab at {client.url}: {e.strerror or e}") from None


def _refusal(client: Client, e) -> str:
    """The service's reason for refusing the handshake (its JSON message, if any)."""
    body = e.response.body if e.response is not None else b""
    try:
        message = json.loads(body or b"{}").get("message")
    except (ValueError, AttributeError):
        message = None
    if e.code in (301, 302, 303, 307, 308, 401):
        return (
            f"the hub at {client.url} refused the API token (expired or revoked?): create one "
            "on the hub's Token page and set GPULAB_TOKEN or run `gpulab login`"
        )
    return str(message) if message else f"gpulab answered HTTP {e.code} to the shell's request"


async def _shell(client: Client, job_id: str, rank: int | None = None) -> int:
    import termios  # here, not above: POSIX only, and tornado is slow to import for the others
    import tty

    from tornado.websocket import WebSocketClosedError

    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    interactive = os.isatty(stdin)
    cols, rows = _size(stdout if os.isatty(stdout) else stdin)
    conn = await _connect(client, job_id, cols, rows, rank)
    loop = asyncio.get_running_loop()
    saved = termios.tcgetattr(stdin) if interactive else None
    exit_code: list[int | None] = [None]
    ended = asyncio.Event()

    def send(message: bytes | str) -> None:
        try:
            sent = conn.write_message(message, binary=isinstance(message, bytes))
        except WebSocketClosedError:
            return
        sent.add_done_callback(lambda f: f.cancelled() or f.exception())  # a close: read on

    def typed() -> None:
        try:
            data = os.read(stdin, 65536)
        except OSError:
            data = b""
        if data:
            send(data)
            return
        loop.remove_reader(stdin)  # end of input: the remote terminal is told (Ctrl-D)
        send(b"\x04")

    def resized() -> None:
        c, r = _size(stdout if os.isatty(stdout) else stdin)
        send(json.dumps({"resize": [c, r]}))

    try:
        if saved is not None:
            tty.setraw(stdin, termios.TCSANOW)  # not TCSAFLUSH: what was typed ahead goes too
        try:
            loop.add_reader(stdin, typed)
        except PermissionError:  # a regular file: read whole, then end of input
            send(await asyncio.to_thread(sys.stdin.buffer.read))
            send(b"\x04")
        with contextlib.suppress(NotImplementedError, ValueError):
            loop.add_signal_handler(signal.SIGWINCH, resized)
        while (message := await conn.read_message()) is not None:
            if isinstance(message, bytes):
                _write_all(stdout, message)
            else:
                with contextlib.suppress(ValueError, AttributeError):
                    exit_code[0] = json.loads(message).get("exit")
                    ended.set()
    finally:
        loop.remove_reader(stdin)
        with contextlib.suppress(NotImplementedError, ValueError):
            loop.remove_signal_handler(signal.SIGWINCH)
        if saved is not None:
            termios.tcsetattr(stdin, termios.TCSADRAIN, saved)
        conn.close()
    if not ended.is_set():
        reason = conn.close_reason or "the connection was lost"
        raise CliError(f"the shell ended: {reason}", EXIT_FAILED)
    code = exit_code[0]
    return int(code) if isinstance(code, int) else EXIT_OK


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            continue
        view = view[n:]


def add_exec_commands(with_id, rank_type=None) -> None:
    """The ``exec`` and ``shell`` sub-commands of ``gpulab job`` (``with_id``: parser.py's;
    ``rank_type``: how ``--rank`` is parsed)."""
    ex = with_id(
        "exec",
        "run a command in a RUNNING job; exits with its exit code",
        cmd_job_exec,
        usage="gpulab job exec [--timeout SECONDS] [--rank K] ID -- CMD [ARGS...]",
        description="Run CMD with ARGS in the job's container (put -- before CMD), as the "
        "job's user, and print its output (stdout and stderr). Exits with the command's exit "
        f"code, {EXIT_TIMED_OUT} if it ran past --timeout (then it is killed). Recorded in "
        "the job's events.",
    )
    ex.add_argument(
        "--timeout",
        type=_timeout,
        metavar="SECONDS",
        help=f"kill the command after this long (default {DEFAULT_TIMEOUT:g}, "
        f"at most {MAX_TIMEOUT:g})",
    )
    ex.add_argument(
        "--rank",
        type=rank_type or int,
        metavar="K",
        help="in worker K's container (a distributed job; default rank 0)",
    )
    ex.add_argument("command", nargs="*", metavar="CMD", help=argparse.SUPPRESS)
    sh = with_id(
        "shell",
        "an interactive terminal in a RUNNING job",
        cmd_job_shell,
        description="Open a shell (bash, else sh) in the job's container, as the job's user, "
        "in this terminal. `exit` ends it; gpulab exits with the shell's exit code. Recorded "
        "in the job's events.",
    )
    sh.add_argument(
        "--rank",
        type=rank_type or int,
        metavar="K",
        help="in worker K's container (a distributed job; default rank 0)",
    )


def _timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= MAX_TIMEOUT:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most {MAX_TIMEOUT:g}")
    return value
