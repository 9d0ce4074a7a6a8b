"""``gpulab notebook start|stop|list|logs|push``: notebooks from the command line.

    gpulab notebook start [SERVER] [--framework F] [--flavor F] [-v VOLUME]... [-l k=v]... [--wait]
    gpulab notebook stop [SERVER] [--wait]
    gpulab notebook list [-l k=v]... [--all | --user NAME]
    gpulab notebook logs [SERVER] [--tail N] [--user NAME]
    gpulab notebook push [SERVER] [--user NAME]

A notebook is a JupyterHub server: starting and stopping one is the hub's REST API
(``POST``/``DELETE /hub/api/users/NAME/servers/SERVER``, the options of the spawn form as
``user_options``, which the spawner checks as it checks the form's), and ``start --wait``
follows the hub's progress event stream (``.../progress``) as the spawn page does, then prints
the notebook's URL. Its state, labels and output are gpulab's (``/services/gpulab/api/
notebooks``). The same token reaches both: a token from the hub's Token page carries the
user's ``self`` scopes (their servers) and gpulab's. SERVER is the server's name; none (or
``''``) is the default server.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any
from urllib.parse import quote, urlsplit

from .client import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, POLL, Client, CliError
from .commands import _all_pages, _list_params, _pairs
from .output import note, out, print_json, table, when

#: gpulab's notebook states that hold (or are about to hold) a container
ACTIVE = frozenset({"STARTING", "RUNNING", "STOPPING"})
#: the longest a server's name may be (the hub's database column; checked there too)
MAX_SERVER_CHARS = 255
#: the form's options, as ``start``'s flags give them: (flag dest, user_options key)
OPTIONS = (
    ("framework", "framework"),
    ("version", "version"),
    ("editor", "editor"),
    ("image", "image"),
    ("image_pull_policy", "image_pull_policy"),
    ("image_pull_secret", "image_pull_secret"),
    ("flavor", "flavor"),
    ("cpu", "cpus"),
    ("memory", "memory"),
    ("gpu", "gpus"),
    ("gpu_model", "gpu_model"),
    ("node_pool", "node_pool"),
    ("notify_webhook", "notify_webhook"),
    ("notify_email", "notify_email"),
)


def add_notebook_commands(top, common, positive_float, whole) -> None:
    nb = top.add_parser("notebook", aliases=["notebooks"], parents=[common], help="notebooks")
    actions = nb.add_subparsers(dest="command_name", metavar="ACTION")
    actions.required = True

    def server_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "server",
            nargs="?",
            default="",
            metavar="SERVER",
            help="the notebook's (server's) name (default: your default server)",
        )

    start = actions.add_parser(
        "start",
        parents=[common],
        help="start a notebook (a new one, or a stopped one again)",
        description="Start the notebook SERVER with the spawn form's options. Without any "
        "option a notebook that ran before starts again with the options it had; with one, "
        "the options are those given (the rest: the defaults). Prints its URL once it runs "
        "(--wait: the hub's progress messages on stderr until then).",
    )
    server_arg(start)
    start.add_argument("--framework", help="a framework of the catalog (default: its default)")
    start.add_argument("--version", help="the framework's version (default: its first)")
    start.add_argument("--editor", help="the editor: jupyterlab or vscode (default: the first)")
    start.add_argument(
        "--image",
        help="instead of the framework's: an image the admins allow, or one from a registry "
        "they allow",
    )
    start.add_argument(
        "--image-pull-policy",
        choices=("always", "if-not-present", "never"),
        help="for an image from a registry (default: the site's)",
    )
    start.add_argument(
        "--image-pull-secret",
        metavar="SECRET",
        help="for a private image: your secret (gpulab secret set) holding USERNAME:PASSWORD",
    )
    start.add_argument("--flavor", help="a resource flavor; --gpu/--cpu/--memory override it")
    start.add_argument("--gpu", "--gpus", metavar="N", help="GPUs (0.5: half of a shared GPU)")
    start.add_argument("--cpu", "--cpus", type=positive_float, metavar="N", help="CPUs")
    start.add_argument("--memory", metavar="SIZE", help="memory, such as 512M or 8G")
    start.add_argument("--gpu-model", metavar="MODEL", help="GPUs of this model only")
    start.add_argument("--node-pool", metavar="POOL", help="a node of this pool only")
    start.add_argument(
        "-v",
        "--volume",
        action="append",
        metavar="VOLUME",
        help="bucket@store[/prefix]:/mount[:ro|rw|rwd]; repeatable",
    )
    start.add_argument("-l", "--label", action="append", metavar="KEY=VALUE", help="repeatable")
    start.add_argument(
        "--auto-restart",
        action="store_true",
        help="start it again when the maximum run time stops it",
    )
    start.add_argument("--notify-webhook", metavar="URL", help="POST a notice when it ends")
    start.add_argument("--notify-email", metavar="ADDRESS", help="mail a notice when it ends")
    start.add_argument(
        "--notify-on", metavar="A,B", help="which events: done, failed (default: both)"
    )
    start.add_argument(
        "-w",
        "--wait",
        action="store_true",
        help="follow the start (progress on stderr) until it runs; exit 1 if it fails",
    )
    start.set_defaults(func=cmd_notebook_start)

    stop = actions.add_parser(
        "stop",
        parents=[common],
        help="stop a notebook (its workspace is pushed; it can be started again)",
    )
    server_arg(stop)
    stop.add_argument(
        "-w",
        "--wait",
        action="store_true",
        help="wait until it is STOPPED (exit 1 if it ends otherwise, e.g. SYNC_FAILED)",
    )
    stop.set_defaults(func=cmd_notebook_stop)

    push = actions.add_parser(
        "push",
        parents=[common],
        help="push a running notebook's workspace, home and writable volumes now (or retry a "
        "SYNC_FAILED notebook's push)",
        description="A live push: files unchanged for a few seconds and while read are sent, "
        "nothing is deleted until the stop's push. One at a time per notebook.",
    )
    server_arg(push)
    push.add_argument("--user", help="this user's notebook (admins)")
    push.set_defaults(func=cmd_notebook_push)

    ls = actions.add_parser("list", aliases=["ls"], parents=[common], help="your notebooks")
    ls.add_argument(
        "-l", "--label", action="append", metavar="KEY=VALUE", help="only these; repeatable"
    )
    who = ls.add_mutually_exclusive_group()
    who.add_argument("-A", "--all", action="store_true", help="every user's notebooks (admins)")
    who.add_argument("--user", help="this user's notebooks (admins)")
    ls.set_defaults(func=cmd_notebook_list)

    logs = actions.add_parser(
        "logs",
        parents=[common],
        help="the last lines of a notebook's output (its editor's and kernels' messages)",
        description="The tail of the notebook container's log, tokens and cookies scrubbed. "
        "A stopped notebook has none (its log goes with its container).",
    )
    server_arg(logs)
    logs.add_argument(
        "-n", "--tail", type=whole, metavar="N", help="the last N lines (1-10000, default 200)"
    )
    logs.add_argument("--user", help="this user's notebook (admins)")
    logs.set_defaults(func=cmd_notebook_logs)


# --- helpers ------------------------------------------------------------------------------------


def _server(name: str) -> str:
    if "/" in name or len(name) > MAX_SERVER_CHARS:
        raise CliError(
            f"{name[:64]!r} is not a server name (no '/', at most {MAX_SERVER_CHARS} characters)",
            EXIT_USAGE,
        )
    return name


def hub_server_path(user: str, server: str) -> str:
    """The hub API's path of a user's server: ``/users/NAME/server`` for the default one."""
    base = f"/users/{quote(user, safe='')}"
    return f"{base}/servers/{quote(server, safe='')}" if server else f"{base}/server"


def notebook_path(user: str, server: str) -> str:
    """gpulab's path of a notebook (the default server is the empty name)."""
    return f"/notebooks/{quote(user, safe='')}/{quote(server, safe='')}"


def _name(user: str, server: str) -> str:
    return f"{user}/{server}" if server else f"{user}'s default notebook"


def user_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """The spawn form's options from ``start``'s flags; None when none was given (the hub
    then starts the notebook with the options it had)."""
    options: dict[str, Any] = {}
    for dest, key in OPTIONS:
        if getattr(args, dest, None) is not None:
            options[key] = getattr(args, dest)
    if args.volume:
        options["volumes"] = list(args.volume)
    if args.label:
        options["labels"] = _pairs(args.label, "KEY", "-l/--label")
    if args.auto_restart:
        options["auto_restart"] = True
    if args.notify_on is not None:
        if not (args.notify_webhook or args.notify_email):
            raise CliError("--notify-on needs --notify-webhook or --notify-email", EXIT_USAGE)
        options["notify_on"] = [e.strip() for e in args.notify_on.split(",") if e.strip()]
    return options or None


def labels_text(labels: Any) -> str:
    if not isinstance(labels, dict) or not labels:
        return "-"
    return ",".join(f"{k}={v}" for k, v in labels.items())


def notebook_rows(notebooks: list[dict]) -> list[list]:
    rows = []
    for nb in notebooks:
        opts = nb.get("options") or {}
        image = opts.get("image") or ""
        if opts.get("framework"):
            image = f"{opts['framework']} {opts.get('version') or ''}".strip()
        rows.append(
            [
                nb.get("user"),
                nb.get("server") or "(default)",
                nb.get("state"),
                image or "-",
                opts.get("gpus", "-"),
                when(nb.get("created")),
                when(nb.get("running_since")),
                labels_text(opts.get("labels")),
            ]
        )
    return rows


def _record(client: Client, user: str, server: str) -> dict:
    return client.json("GET", notebook_path(user, server))


def follow_start(client: Client, user: str, server: str) -> str:
    """Follow the hub's progress events of the spawn until it ends: each message on stderr
    as ``[ 40%] message``; returns the notebook's URL, or raises CliError with the hub's
    reason when the start failed."""
    last = ""
    for event in client.hub_events(hub_server_path(user, server) + "/progress"):
        message = str(event.get("message") or "")
        if event.get("failed"):
            raise CliError(f"{_name(user, server)} did not start: {message or 'spawn failed'}")
        if event.get("ready"):
            return notebook_url(client.url, user, server, str(event.get("url") or ""))
        if message and message != last:
            progress = event.get("progress")
            shown = f"[{progress:3}%] " if isinstance(progress, int) else ""
            note(f"{shown}{message}")
            last = message
    # the stream ended without its last event (the hub restarted?): gpulab's record says
    nb = _record(client, user, server)
    if nb.get("state") != "RUNNING":
        raise CliError(f"{_name(user, server)} did not start: it is {nb.get('state')}")
    return notebook_url(client.url, user, server)


def notebook_url(hub_url: str, user: str, server: str, path: str = "") -> str:
    """The notebook's address: the hub's ``path`` for it (its progress event's ``url``, from
    the host's root) on the hub's scheme and host, else ``/user/NAME/SERVER/`` under the hub's
    URL."""
    if path.startswith("/"):
        parts = urlsplit(hub_url)
        return f"{parts.scheme}://{parts.netloc}{path}"
    server_part = f"{quote(server, safe='')}/" if server else ""
    return f"{hub_url}/user/{quote(user, safe='')}/{server_part}"


def _wait_stopped(client: Client, user: str, server: str) -> dict:
    while True:
        nb = _record(client, user, server)
        if nb.get("state") not in ACTIVE:
            return nb
        time.sleep(POLL)


def _state_line(nb: dict) -> str:
    text = f"notebook {nb.get('server') or '(default)'}: {nb.get('state')}"
    history = nb.get("history") or []
    if history and history[-1].get("message") and nb.get("state") not in ("RUNNING", "STOPPED"):
        text += f": {history[-1]['message']}"
    return text


# --- commands -----------------------------------------------------------------------------------


def cmd_notebook_start(args: argparse.Namespace, client: Client) -> int:
    server = _server(args.server)
    options = user_options(args)
    user = client.whoami()
    body = {"user_options": options} if options is not None else None
    r = client.request("POST", hub_server_path(user, server), hub=True, json=body, ok=(201, 202))
    if not args.wait:
        url = notebook_url(client.url, user, server)
        pending = r.status_code == 202
        if args.output == "json":
            print_json({"user": user, "server": server, "pending": pending, "url": url})
        elif pending:
            out(
                f"notebook {server or '(default)'}: starting (`gpulab notebook list` shows "
                f"when it runs); its URL: {url}"
            )
        else:
            out(f"notebook {server or '(default)'}: running at {url}")
        return EXIT_OK
    note(f"starting {_name(user, server)} (Ctrl-C stops following, not the start)")
    try:
        url = follow_start(client, user, server)
    except KeyboardInterrupt:
        raise CliError(
            f"stopped following {_name(user, server)}, which goes on starting", EXIT_INTERRUPTED
        ) from None
    if args.output == "json":
        print_json({**_record(client, user, server), "url": url})
    else:
        out(url)
    return EXIT_OK


def cmd_notebook_stop(args: argparse.Namespace, client: Client) -> int:
    server = _server(args.server)
    user = client.whoami()
    client.request("DELETE", hub_server_path(user, server), hub=True, ok=(202, 204))
    nb = _wait_stopped(client, user, server) if args.wait else _record(client, user, server)
    if args.output == "json":
        print_json(nb)
    else:
        out(_state_line(nb))
    if args.wait and nb.get("state") != "STOPPED":
        return EXIT_FAILED
    return EXIT_OK


def cmd_notebook_push(args: argparse.Namespace, client: Client) -> int:
    server = _server(args.server)
    user = args.user or client.whoami()
    r = client.request("POST", notebook_path(user, server) + "/push", ok=(200, 202, 502))
    nb = r.json()
    if args.output == "json":
        print_json(nb)
    elif r.status_code == 202:
        out(
            f"notebook {server or '(default)'}: push asked (`gpulab notebook list -o json` "
            "shows its live_push)"
        )
    else:
        out(_state_line(nb))
    return EXIT_FAILED if r.status_code == 502 else EXIT_OK


def cmd_notebook_list(args: argparse.Namespace, client: Client) -> int:
    params = _list_params(args)
    for label in args.label or []:
        _pairs([label], "KEY", "-l/--label")
        params.append(("label", label))
    data = _all_pages(client, "/notebooks", params, "notebooks")
    if args.output == "json":
        print_json(data)
        return EXIT_OK
    table(
        ["USER", "SERVER", "STATE", "IMAGE", "GPUS", "CREATED", "RUNNING SINCE", "LABELS"],
        notebook_rows(data["notebooks"]),
    )
    return EXIT_OK


def cmd_notebook_logs(args: argparse.Namespace, client: Client) -> int:
    server = _server(args.server)
    user = args.user or client.whoami()
    params = {"tail": str(args.tail)} if args.tail is not None else {}
    r = client.request("GET", notebook_path(user, server) + "/logs", params=params)
    sink = sys.stdout.buffer
    sink.write(r.content)
    sink.flush()
    return EXIT_OK
