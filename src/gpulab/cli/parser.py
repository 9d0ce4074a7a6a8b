"""The ``gpulab`` command line's parser: every command, its options and its function (see
:mod:`gpulab.cli`).
"""

from __future__ import annotations

import argparse
import sys

from .client import EXIT_USAGE
from .commands import (
    cmd_job_delete,
    cmd_job_events,
    cmd_job_get,
    cmd_job_list,
    cmd_job_logs,
    cmd_job_run,
    cmd_job_simple_action,
    cmd_job_stop,
    cmd_login,
    cmd_usage,
)
from .exec import add_exec_commands
from .host import add_host_commands
from .notebooks import add_notebook_commands
from .secrets import add_run_options, add_secret_commands
from .snapshots import add_snapshot_commands

#: the most workers (containers) of one distributed job: the API's limit
#: (``gpulab.jobs.spec.MAX_WORKERS``, not imported: the CLI stays light)
MAX_WORKERS = 64
#: the most tasks of a job array (``gpulab.jobs.spec.array.MAX_COMPLETIONS``)
MAX_COMPLETIONS = 1000
#: the pull policies of an image from a registry (``gpulab.imagerefs.PULL_POLICIES``)
PULL_POLICIES = ("always", "if-not-present", "never")

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
    image.add_argument(
        "--image",
        help="an image of the catalog, one the admins allow, or one from a registry they allow",
    )
    run.add_argument("--version", help="the framework's version (default: its first)")
    run.add_argument(
        "--image-pull-policy",
        choices=PULL_POLICIES,
        help="for an image from a registry: pull it always, if-not-present (on the node) or "
        "never (default: the site's)",
    )
    run.add_argument(
        "--image-pull-secret",
        metavar="SECRET",
        help="for a private image: your secret (gpulab secret set) holding USERNAME:PASSWORD",
    )
    run.add_argument("--flavor", help="a resource flavor; --gpu/--cpu/--memory override it")
    run.add_argument(
        "--gpu", "--gpus", type=_int_range(0), metavar="N", help="GPUs (default 1 without flavor)"
    )
    run.add_argument("--cpu", "--cpus", type=_positive_float, metavar="N", help="CPUs (default 1)")
    run.add_argument("--memory", metavar="SIZE", help="memory, such as 512M or 8G (default 4G)")
    run.add_argument(
        "--gpu-model",
        metavar="MODEL",
        help="run on GPUs of this model only (as the platform names them, e.g. A100)",
    )
    run.add_argument(
        "--node-pool", metavar="POOL", help="run on a node of this pool only (every worker)"
    )
    run.add_argument(
        "--workers",
        type=_int_range(1, MAX_WORKERS),
        metavar="N",
        help=f"containers of a distributed job, each with the --gpu/--cpu/--memory given "
        f"(1-{MAX_WORKERS}, default 1); placed all together, each told MASTER_ADDR, "
        "WORLD_SIZE and its RANK",
    )
    run.add_argument(
        "--completions",
        type=_int_range(1, MAX_COMPLETIONS),
        metavar="N",
        help=f"a job array (a sweep): run N tasks (1-{MAX_COMPLETIONS}), each told "
        "GPULAB_TASK_INDEX (0 to N-1) and GPULAB_TASK_COUNT",
    )
    run.add_argument(
        "--parallelism",
        type=_int_range(1, MAX_COMPLETIONS),
        metavar="K",
        help="most tasks of the array running at once (default: all, as GPUs and quota allow)",
    )
    run.add_argument(
        "--parameters",
        metavar="FILE",
        help="a JSON file (- for stdin) with a list of parameter sets, one task per set, "
        "each told GPULAB_TASK_PARAMS and one GPULAB_PARAM_<KEY> per key",
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
        help=(
            "restart the command in place after PERIOD with no output, no CPU progress and "
            "no GPU activity"
        ),
    )
    run.add_argument("--preemptible", action="store_true", help="may use idle GPUs beyond quota")
    run.add_argument(
        "--terminate-after-preemption",
        action="store_true",
        help="when preempted, end INTERRUPTED instead of going back to the queue",
    )
    run.add_argument("--priority", type=int, metavar="N", help="0-100 (default 50)")
    run.add_argument(
        "--auto-delete-after",
        metavar="DURATION",
        help="delete the job's record and logs this long after it ends (default: the site's)",
    )
    run.add_argument(
        "--sync-interval",
        metavar="DURATION",
        help="push its rw/rwd volumes this often while it runs (0: at its end only; default: "
        "the flavor's, else the site's)",
    )
    add_run_options(run)  # ports, secrets, git, working dir, read-only root
    run.add_argument(
        "--notify-webhook", metavar="URL", help="POST a JSON notice here when the job ends"
    )
    run.add_argument(
        "--notify-email", metavar="ADDRESS", help="mail a notice here when the job ends"
    )
    run.add_argument(
        "--notify-on",
        metavar="A,B",
        help="which events: done, failed, interrupted, preempted (default: all)",
    )
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
    with_id(
        "push",
        "push a RUNNING job's rw/rwd volumes now (a live push), or retry a SYNC_FAILED job's",
        cmd_job_simple_action("push"),
    )
    with_id("delete", "delete an ended job, its logs and volumes", cmd_job_delete, aliases=["rm"])
    add_exec_commands(with_id, _int_range(0, MAX_WORKERS - 1))  # exec and shell

    add_secret_commands(top, common)

    usage = top.add_parser("usage", parents=[common], help="your billed minutes")
    usage.add_argument("--user", help="this user's (admins)")
    usage.add_argument(
        "--month",
        metavar="YYYY-MM",
        help="one month's billed job minutes and GPU-minutes (UTC; 'now': this month), "
        "everyone's for admins",
    )
    usage.set_defaults(func=cmd_usage)

    add_notebook_commands(top, common, _positive_float, _int_range(1, 10_000))
    add_snapshot_commands(top, common)

    add_host_commands(top)
    return p
