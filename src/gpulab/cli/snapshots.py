"""``gpulab snapshot create|list|restore|delete``: named snapshots of a notebook's workspace.

    gpulab snapshot create NAME [--notebook SERVER]    the workspace as stored (its last push)
    gpulab snapshot create NAME --job ID --volume /out  a job's rw volume (on the workspace store)
    gpulab snapshot list
    gpulab snapshot restore NAME --notebook SERVER     into a new, STOPPED or DELETED notebook
    gpulab snapshot delete NAME

The service's ``/api/snapshots/USER`` (docs/snapshots.md); USER is the token's (``--user``:
another's, for admins).
"""

from __future__ import annotations

import argparse
from urllib.parse import quote

from .client import EXIT_OK, EXIT_USAGE, Client, CliError
from .output import out, print_json, table, when


def add_snapshot_commands(top, common) -> None:
    snap = top.add_parser(
        "snapshot",
        aliases=["snapshots"],
        parents=[common],
        help="named snapshots of a notebook's workspace",
    )
    actions = snap.add_subparsers(dest="command_name", metavar="ACTION")
    actions.required = True

    def action(name: str, help_: str, func, named: bool = True, **kw) -> argparse.ArgumentParser:
        p = actions.add_parser(name, parents=[common], help=help_, **kw)
        if named:
            p.add_argument("name", metavar="NAME", help="the snapshot's name")
        p.add_argument("--user", help="this user's snapshots (admins)")
        p.set_defaults(func=func)
        return p

    create = action(
        "create",
        "take a snapshot of a notebook's workspace (or a job's rw volume) as stored",
        cmd_snapshot_create,
        description="Record the notebook's workspace as it is in object storage now (what "
        "its last push left: stop the notebook, or push it, first) under NAME (lowercase "
        "letters, digits, '.', '_', '-'); or, with --job and --volume, a job's rw/rwd volume "
        "on the workspace store. Only the files no snapshot of yours holds yet are copied, "
        "inside the store.",
    )
    source = create.add_mutually_exclusive_group()
    source.add_argument(
        "--notebook", default="", metavar="SERVER", help="the notebook (default: your default)"
    )
    source.add_argument("--job", metavar="ID", help="a job of yours (with --volume)")
    create.add_argument("--volume", metavar="MOUNT", help="the job volume's mount path, e.g. /out")
    action("list", "your snapshots and the space they take", cmd_snapshot_list, named=False)
    restore = action(
        "restore",
        "make a new, STOPPED or DELETED notebook's workspace the snapshot's",
        cmd_snapshot_restore,
        description="The notebook's workspace becomes exactly the snapshot's (files it lacks "
        "are deleted); a STOPPED notebook's local copy is removed, so that its next start "
        "pulls the restored workspace. Start it afterwards: gpulab notebook start SERVER.",
    )
    restore.add_argument(
        "--notebook", default="", metavar="SERVER", help="the notebook (default: your default)"
    )
    action(
        "delete",
        "delete a snapshot (and the files no other snapshot shares)",
        cmd_snapshot_delete,
        aliases=["rm"],
    )


def _base(args: argparse.Namespace, client: Client) -> str:
    return f"/snapshots/{quote(args.user or client.whoami(), safe='')}"


def _size(n) -> str:
    if not isinstance(n, int):
        return "-"
    for unit, scale in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


def _source(source: dict) -> str:
    if source.get("kind") == "job":
        return f"job {source.get('job')}:{source.get('volume')}"
    return f"notebook {source.get('notebook') or '(default)'}"


def cmd_snapshot_create(args: argparse.Namespace, client: Client) -> int:
    if (args.job is None) != (args.volume is None):
        raise CliError("--job and --volume go together (a job's volume)", EXIT_USAGE)
    if args.job is not None:
        body = {"name": args.name, "job": args.job, "volume": args.volume}
    else:
        body = {"name": args.name, "notebook": args.notebook}
    data = client.json("POST", _base(args, client), json=body, ok=(201,))
    if args.output == "json":
        print_json(data)
    else:
        out(
            f"snapshot {data['name']}: {data['objects']} files, {_size(data['bytes'])} "
            f"({_size(data.get('new_bytes'))} new)"
        )
    return EXIT_OK


def cmd_snapshot_list(args: argparse.Namespace, client: Client) -> int:
    data = client.json("GET", _base(args, client))
    if args.output == "json":
        print_json(data)
        return EXIT_OK
    table(
        ["NAME", "CREATED", "OF", "FILES", "SIZE"],
        [
            [
                s.get("name"),
                when(s.get("created")),
                _source(s.get("source") or {}),
                s.get("objects"),
                _size(s.get("bytes")),
            ]
            for s in data.get("snapshots") or []
        ],
    )
    quota = data.get("quota_bytes")
    out(
        f"\nstored: {_size(data.get('stored_bytes'))} of "
        f"{_size(quota) if quota is not None else 'unlimited'} (shared files counted once)"
    )
    return EXIT_OK


def cmd_snapshot_restore(args: argparse.Namespace, client: Client) -> int:
    path = f"{_base(args, client)}/{quote(args.name, safe='')}/restore"
    data = client.json("POST", path, json={"notebook": args.notebook})
    if args.output == "json":
        print_json(data)
    else:
        out(
            f"snapshot {data['name']} restored into notebook {data['notebook'] or '(default)'}: "
            f"{data['copied']} files copied, {data['deleted']} deleted, "
            f"{data['unchanged']} unchanged"
        )
    return EXIT_OK


def cmd_snapshot_delete(args: argparse.Namespace, client: Client) -> int:
    data = client.json("DELETE", f"{_base(args, client)}/{quote(args.name, safe='')}")
    if args.output == "json":
        print_json(data)
    else:
        out(f"snapshot {data['name']} deleted ({_size(data.get('freed_bytes'))} freed)")
    return EXIT_OK
