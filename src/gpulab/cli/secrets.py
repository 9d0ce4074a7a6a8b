"""``gpulab secret set|list|delete`` and the ``job run`` options that reach into a job: its
ports, secrets in its environment, git repositories, working directory, read-only root.

    gpulab secret set NAME            the value from stdin (or typed, not echoed, on a terminal)
    gpulab secret list | delete NAME
    gpulab job run --port tensorboard=6006 --secret-env WANDB_API_KEY=wandb \\
        --git url=https://host/org/repo.git,branch=main --workdir /workspace/repo -- python x.py
"""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import Any

from .client import EXIT_OK, EXIT_USAGE, Client, CliError
from .output import print_json, table

GIT_KEYS = ("url", "branch", "revision", "path", "secret")


def add_secret_commands(top, common) -> None:
    secret = top.add_parser(
        "secret", aliases=["secrets"], parents=[common], help="your secrets (for jobs' env)"
    )
    actions = secret.add_subparsers(dest="command_name", metavar="ACTION")
    actions.required = True
    put = actions.add_parser(
        "set",
        parents=[common],
        help="store a secret (value from stdin)",
        description="Store (or replace) a secret. The value is read from stdin, or typed "
        "without echo on a terminal; it is never an argument (shell history, ps). A job uses "
        "it with --secret-env VAR=NAME; nobody can read it back.",
    )
    put.add_argument("name", metavar="NAME")
    put.set_defaults(func=cmd_secret_set)
    ls = actions.add_parser("list", aliases=["ls"], parents=[common], help="your secrets' names")
    ls.set_defaults(func=cmd_secret_list)
    rm = actions.add_parser("delete", aliases=["rm"], parents=[common], help="delete a secret")
    rm.add_argument("name", metavar="NAME")
    rm.set_defaults(func=cmd_secret_delete)


def cmd_secret_set(args: argparse.Namespace, client: Client) -> int:
    if sys.stdin.isatty():
        value = getpass.getpass(f"value of {args.name} (not echoed): ")
    else:
        value = sys.stdin.read()
        value = value[:-1] if value.endswith("\n") else value  # `echo x |` adds one
    data = client.json("PUT", f"/secrets/{args.name}", json={"value": value}, ok=(200, 201))
    print_json(data) if args.output == "json" else print(f"secret {data['name']} saved")
    return EXIT_OK


def cmd_secret_list(args: argparse.Namespace, client: Client) -> int:
    data = client.json("GET", "/secrets")
    if args.output == "json":
        print_json(data)
    else:
        table(
            ["NAME", "CREATED", "UPDATED"],
            [[s["name"], s["created"], s["updated"]] for s in data["secrets"]],
        )
    return EXIT_OK


def cmd_secret_delete(args: argparse.Namespace, client: Client) -> int:
    client.json("DELETE", f"/secrets/{args.name}", ok=(204,))
    print(f"secret {args.name} deleted")
    return EXIT_OK


def add_run_options(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "--port",
        action="append",
        metavar="NAME=PORT",
        help="open the job's PORT at /services/gpulab/jobs/ID/ports/NAME/ (repeatable)",
    )
    run.add_argument(
        "--share", action="append", metavar="USER", help="a user who may open the ports too"
    )
    run.add_argument(
        "--share-group", action="append", metavar="GROUP", help="a group who may open them"
    )
    run.add_argument(
        "--secret-env",
        action="append",
        metavar="VAR=SECRET",
        help="set VAR to the value of your secret SECRET (repeatable)",
    )
    run.add_argument(
        "--git",
        action="append",
        metavar="url=URL[,branch=B|revision=R][,path=P][,secret=S]",
        help="clone a repository before the job starts (repeatable)",
    )
    run.add_argument("--workdir", metavar="PATH", help="the command's working directory")
    run.add_argument(
        "--read-only", action="store_true", help="the image's file system read-only (/tmp stays)"
    )


def _split(text: str, flag: str, left: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise CliError(f"{flag} takes {left}=VALUE, not {text!r}", EXIT_USAGE)
    return name, value


def add_run_fields(args: argparse.Namespace, body: dict[str, Any]) -> None:
    """The options of add_run_options, into the submission ``body``."""
    if args.port:
        ports = []
        for text in args.port:
            name, number = _split(text, "--port", "NAME")
            if not number.isdigit():
                raise CliError(f"--port {text!r}: the port must be a number", EXIT_USAGE)
            port: dict[str, Any] = {"port": int(number), "name": name}
            if args.share:
                port["users"] = list(args.share)
            if args.share_group:
                port["groups"] = list(args.share_group)
            ports.append(port)
        body["ports"] = ports
    elif args.share or args.share_group:
        raise CliError("--share and --share-group need a --port", EXIT_USAGE)
    if args.secret_env:
        env = body.setdefault("env", {})
        for text in args.secret_env:
            var, secret = _split(text, "--secret-env", "VAR")
            if var in env:
                raise CliError(f"{var} is given twice (--env and --secret-env)", EXIT_USAGE)
            env[var] = {"secret": secret}
    if args.git:
        repos = []
        for text in args.git:
            repo = dict(_split(part, "--git", "KEY") for part in text.split(","))
            unknown = set(repo) - set(GIT_KEYS)
            if unknown or "url" not in repo:
                raise CliError(
                    f"--git {text!r}: give url=... and any of {', '.join(GIT_KEYS[1:])}",
                    EXIT_USAGE,
                )
            repos.append(repo)
        body["git"] = repos
    if args.workdir is not None:
        body["working_dir"] = args.workdir
    if args.read_only:
        body["read_only_rootfs"] = True
