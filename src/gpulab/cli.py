"""``gpulab``: the command line of gpulab's users, talking to the gpulab service's REST API.

    gpulab login --url URL [--token TOKEN]        save the hub URL and an API token (mode 0600)
    gpulab job run [options] -- CMD [ARGS...]     submit a training job; --follow streams its logs
                                                  (--workers N: a distributed job of N containers)
    gpulab job list [--state A,B] [-l k=v]... [--all | --user NAME]
    gpulab job get|logs [-f] [--rank K]|events|stop [--wait]|resume|rerun|push|delete ID
    gpulab job exec [--timeout S] [--rank K] ID -- CMD [ARGS...]   run a command in a RUNNING job
    gpulab job shell [--rank K] ID                an interactive terminal in a RUNNING job
    gpulab secret set NAME | list | delete NAME   secrets a job's env refers to (--secret-env)
    gpulab usage [--user NAME]
    gpulab notebook list [--all | --user NAME]

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
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence

from .cli_client import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    Client,
    CliError,
    normalize_url,
    settings,
    write_config,
)
from .cli_commands import (
    build_submission,
    cmd_job_delete,
    cmd_job_events,
    cmd_job_get,
    cmd_job_list,
    cmd_job_logs,
    cmd_job_run,
    cmd_job_simple_action,
    cmd_job_stop,
    cmd_login,
    cmd_notebook_list,
    cmd_usage,
)
from .cli_exec import add_exec_commands
from .cli_output import (
    duration,
    note,
    runtime,
    table,
)
from .cli_secrets import add_run_options, add_secret_commands

#: the most workers (containers) of one distributed job: the API's limit
#: (``gpulab.jobs.spec_fields.MAX_WORKERS``, not imported: the CLI stays light)
MAX_WORKERS = 64

#: what `gpulab.cli` offers besides main() (its tests and other callers use these names)
__all__ = [
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


# --- the parser ---------------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # exit 2 with the usage, as argparse does, but one prefix
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"gpulab: error: {message}\n")


def _common() -> argparse.ArgumentParser:
    """Options every command takes, before or after its name (-o json, --url)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "-o",
        "--output",
        choices=("table", "json"),
        default=argparse.SUPPRESS,
        help="table (default) or json (the API's own JSON)",
    )
    p.add_argument(
        "--url",
        default=argparse.SUPPRESS,
        help="the hub's URL (default: $GPULAB_URL, $JUPYTERHUB_URL or the config file)",
    )
    return p


def _int_range(low: int, high: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high}, got {value}")
        return value

    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    p = Parser(
        prog="gpulab",
        description="Training jobs and notebooks on a gpulab hub.",
        epilog="Configuration: GPULAB_URL and GPULAB_TOKEN, or `gpulab login`. "
        "Exit codes: 0 ok, 1 API error or job not DONE, 2 usage/configuration, 130 Ctrl-C.",
        parents=[common],
    )
    top = p.add_subparsers(dest="group", metavar="COMMAND", parser_class=Parser)
    top.required = True

    login = top.add_parser(
        "login",
        parents=[common],
        help="save the hub URL and your API token (~/.config/gpulab/config.json, mode 0600)",
        description="Check the token against the hub, then save the URL and token to "
        "$GPULAB_CONFIG or ~/.config/gpulab/config.json (mode 0600). Without --token (or with "
        "--token -) the token is read from the terminal or stdin, keeping it out of the "
        "shell history.",
    )
    login.add_argument("--token", help="an API token from the hub's Token page; - for stdin")
    login.add_argument("--no-verify", action="store_true", help="save without checking")
    login.set_defaults(func=cmd_login, needs_client=False)

    job = top.add_parser("job", help="training jobs", parents=[common]).add_subparsers(
        dest="command_name", metavar="ACTION", parser_class=Parser
    )
    job.required = True

    run = job.add_parser(
        "run",
        parents=[common],
        help="submit a job",
        usage="gpulab job run [options] -- CMD [ARGS...]",
        description="Submit a job that runs CMD with ARGS (put -- before CMD). Prints the "
        "job's id; with --follow, streams its output until it ends and exits 0 if it ended "
        "DONE, 1 otherwise.",
    )
    run.add_argument("--name", help="lowercase letters, digits and '-' (default: generated)")
    image = run.add_mutually_exclusive_group()
    image.add_argument("--framework", help="a framework of the catalog (default: its default)")
    image.add_argument("--image", help="an image of the catalog or one the admins allow")
    run.add_argument("--version", help="the framework's version (default: its first)")
    run.add_argument("--flavor", help="a resource flavor; --gpu/--cpu/--memory override it")
    run.add_argument(
        "--gpu", "--gpus", type=_int_range(0), metavar="N", help="GPUs (default 1 without flavor)"
    )
    run.add_argument("--cpu", "--cpus", type=_positive_float, metavar="N", help="CPUs (default 1)")
    run.add_argument("--memory", metavar="SIZE", help="memory, such as 512M or 8G (default 4G)")
    run.add_argument(
        "--workers",
        type=_int_range(1, MAX_WORKERS),
        metavar="N",
        help=f"containers of a distributed job, each with the --gpu/--cpu/--memory given "
        f"(1-{MAX_WORKERS}, default 1); placed all together, each told MASTER_ADDR, "
        "WORLD_SIZE and its RANK",
    )
    run.add_argument(
        "-v",
        "--volume",
        action="append",
        metavar="VOLUME",
        help="bucket@store[/prefix]:/mount[:ro|rw|rwd]; repeatable",
    )
    run.add_argument("-e", "--env", action="append", metavar="NAME=VALUE", help="repeatable")
    run.add_argument("-l", "--label", action="append", metavar="KEY=VALUE", help="repeatable")
    run.add_argument("--timeout", metavar="DURATION", help="most the job may run: 90s, 2h, 1d...")
    run.add_argument("--retries", type=int, metavar="N", help="restarts after a failure (0-128)")
    run.add_argument(
        "--hang-restart",
        metavar="PERIOD",
        help="restart the command in place after PERIOD without output or CPU progress",
    )
    run.add_argument("--preemptible", action="store_true", help="may use idle GPUs beyond quota")
    run.add_argument("--priority", type=int, metavar="N", help="0-100 (default 50)")
    add_run_options(run)  # ports, secrets, git, working dir, read-only root
    run.add_argument("-f", "--follow", action="store_true", help="stream the output until it ends")
    run.add_argument("command", nargs="*", metavar="CMD", help=argparse.SUPPRESS)
    run.set_defaults(func=cmd_job_run)

    ls = job.add_parser("list", aliases=["ls"], parents=[common], help="list your jobs")
    ls.add_argument("--state", metavar="A,B", help="only these states, e.g. RUNNING,QUEUED")
    ls.add_argument("-l", "--label", action="append", metavar="KEY=VALUE", help="repeatable")
    who = ls.add_mutually_exclusive_group()
    who.add_argument("-A", "--all", action="store_true", help="every user's jobs (admins)")
    who.add_argument("--user", help="this user's jobs (admins)")
    ls.set_defaults(func=cmd_job_list)

    def with_id(name: str, help_: str, func, **kw) -> argparse.ArgumentParser:
        sub = job.add_parser(name, parents=[common], help=help_, **kw)
        sub.add_argument("id", metavar="ID", help="the job's id")
        sub.set_defaults(func=func)
        return sub

    with_id("get", "a job, its spec and history", cmd_job_get, aliases=["describe"])
    logs = with_id("logs", "a job's output", cmd_job_logs)
    logs.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="stream until the job ends; exit 0 if it ended DONE, 1 otherwise",
    )
    logs.add_argument(
        "--rank",
        type=_int_range(0, MAX_WORKERS - 1),
        metavar="K",
        help="only worker K's output, as it wrote it (a distributed job; default: every "
        "rank's, each line prefixed [rank K])",
    )
    with_id("events", "a job's history", cmd_job_events)
    stop = with_id("stop", "interrupt a queued or running job", cmd_job_stop, aliases=["cancel"])
    stop.add_argument("--wait", action="store_true", help="wait until it is INTERRUPTED")
    with_id("resume", "queue an INTERRUPTED job again", cmd_job_simple_action("resume"))
    with_id("rerun", "submit a copy of a job (prints the new id)", cmd_job_simple_action("rerun"))
    with_id("push", "retry the push of a SYNC_FAILED job", cmd_job_simple_action("push"))
    with_id("delete", "delete an ended job, its logs and volumes", cmd_job_delete, aliases=["rm"])
    add_exec_commands(with_id, _int_range(0, MAX_WORKERS - 1))  # exec and shell

    add_secret_commands(top, common)

    usage = top.add_parser("usage", parents=[common], help="your billed minutes")
    usage.add_argument("--user", help="this user's (admins)")
    usage.set_defaults(func=cmd_usage)

    nb = top.add_parser("notebook", aliases=["notebooks"], parents=[common], help="notebooks")
    nb_actions = nb.add_subparsers(dest="command_name", metavar="ACTION", parser_class=Parser)
    nb_actions.required = True
    nb_ls = nb_actions.add_parser("list", aliases=["ls"], parents=[common], help="your notebooks")
    who = nb_ls.add_mutually_exclusive_group()
    who.add_argument("-A", "--all", action="store_true", help="every user's notebooks (admins)")
    who.add_argument("--user", help="this user's notebooks (admins)")
    nb_ls.set_defaults(func=cmd_notebook_list)
    return p


def main(argv: Sequence[str] | None = None) -> int:
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


if __name__ == "__main__":
    raise SystemExit(main())
