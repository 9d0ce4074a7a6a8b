"""``gpulab``: the command line of gpulab's users, talking to the gpulab service's REST API.

    gpulab login --url URL [--token TOKEN]        save the hub URL and an API token (mode 0600)
    gpulab job run [options] -- CMD [ARGS...]     submit a training job; --follow streams its logs
                                                  (--workers N: a distributed job of N containers)
    gpulab job list [--state A,B] [-l k=v]... [--all | --user NAME]
    gpulab job get|logs [-f] [--rank K]|events|stop [--wait]|resume|rerun|push|delete ID
    gpulab job exec [--timeout S] [--rank K] ID -- CMD [ARGS...]   run a command in a RUNNING job
    gpulab job shell [--rank K] ID                an interactive terminal in a RUNNING job
    gpulab secret set NAME | list | delete NAME   secrets a job's env refers to (--secret-env)
    gpulab usage [--user NAME] [--month YYYY-MM]
    gpulab notebook start [SERVER] [--framework F] [--flavor F] [-v VOL]... [-l k=v]... [--wait]
    gpulab notebook stop [SERVER] [--wait]           (JupyterHub's API: the same token)
    gpulab notebook list [-l k=v]... [--all | --user NAME]
    gpulab notebook logs [SERVER] [--tail N]         its output, tokens scrubbed
    gpulab notebook push [SERVER]                    its data pushed now (a live push)
    gpulab snapshot create NAME [--notebook S] | list | restore NAME --notebook S | delete NAME
    gpulab doctor [--config FILE] [--json]       (operators, on the hub's host) check the host
    gpulab admin backup DEST | restore SRC DIR | upgrade-db   (operators) the databases

Every command prints a human table by default and the API's JSON with ``-o json``.

Where the hub is and who you are: ``GPULAB_URL`` (or ``JUPYTERHUB_URL``) and ``GPULAB_TOKEN``
(or ``JUPYTERHUB_API_TOKEN``, which notebooks already have), else the config file
``$GPULAB_CONFIG`` or ``~/.config/gpulab/config.json`` (``{"url": ..., "token": ...}``) that
``gpulab login`` writes. The token is never printed.

``job exec`` prints the command's output and exits with its exit code (124: it ran past its
time-out and was killed); ``job shell`` puts this terminal in raw mode until the remote shell
exits, and exits with its exit code. Both are for the job's owner and admins, run as the job's
user, and are recorded in the job's events.

Exit codes: 0 success (for ``job run --follow`` and ``job logs -f``: the job ended DONE),
1 an API error (its message, and the field at fault, on stderr) or a followed job that ended
otherwise, 2 bad usage or missing configuration, 130 interrupted (Ctrl-C stops following, not
the job).

The package speaks the REST API and nothing else (gpulab's, and JupyterHub's to start and stop
notebooks): it imports nothing of gpulab outside itself (``client`` the connection, ``output``
the tables, ``commands``, ``exec``, ``secrets``, ``notebooks`` and ``snapshots`` the
commands, ``parser`` the command tree; tests/unit/test_cli.py checks it). ``gpulab doctor``
and ``gpulab admin`` are the commands that do not speak the REST API: they run ``python -m
gpulab.doctor`` and ``python -m gpulab.admin``, programs of their own (``doctor``, ``admin``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator, Sequence

from .client import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    Client,
    CliError,
    normalize_url,
    settings,
    write_config,
)
from .commands import build_submission
from .host import PROGRAMS, run_program
from .output import duration, note, runtime, table
from .parser import MAX_WORKERS, build_parser

#: what `gpulab.cli` offers besides main() (its tests and other callers use these names)
__all__ = [
    "MAX_WORKERS",
    "CliError",
    "build_parser",
    "build_submission",
    "duration",
    "main",
    "normalize_url",
    "runtime",
    "settings",
    "table",
    "write_config",
]


def main(argv: Sequence[str] | None = None) -> int:
    with _ctrl_c_interrupts():
        return _run(argv)


@contextlib.contextmanager
def _ctrl_c_interrupts() -> Iterator[None]:
    """Ctrl-C (SIGINT) raises KeyboardInterrupt while the CLI runs, whatever SIGINT the
    process inherited, so that a user who presses it gets the prompt back at once.

    Python installs that handler at start-up only where SIGINT is not ignored, and a shell
    without job control starts each command it runs in the background (``cmd &`` in a script,
    a CI job's steps) with SIGINT ignored, which exec keeps for every process below it. Such a
    ``gpulab job run --follow`` never saw Ctrl-C: it sat in the read of a silent log stream
    until the job wrote again or ended (a CI run once failed so). With the handler, Ctrl-C
    interrupts whatever the CLI waits in (a socket's read or connect, the poll's sleep) and
    Python raises in the main thread: measured, the process ends within 0.1 s. A handler that
    a program calling main() set itself is kept; from another thread nothing changes (signals
    are the main thread's).
    """
    before = signal.getsignal(signal.SIGINT)
    if before not in (signal.SIG_IGN, signal.SIG_DFL):
        yield
        return
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _run(argv: Sequence[str] | None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] and given[0] in PROGRAMS:  # their options are their own (python -m ...)
        try:
            return run_program(given[0], given[1:])
        except KeyboardInterrupt:
            note("gpulab: interrupted")
            return EXIT_INTERRUPTED
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2)
        return int(e.code or 0)
    if not hasattr(args, "output"):  # -o is SUPPRESSed so that `gpulab -o json job list` works
        args.output = "table"
    try:
        if not getattr(args, "needs_client", True):
            return args.func(args)
        url, token = settings(args)
        return args.func(args, Client(url, token))
    except CliError as e:
        note(f"gpulab: error: {e}")
        return e.code
    except KeyboardInterrupt:
        note("gpulab: interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. | head
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (no flush error at exit)
        return EXIT_OK
