"""``gpulab doctor ...`` and ``gpulab admin backup|restore|upgrade-db ...``: an operator's
programs on the hub's host.

Unlike every other command they do not speak the REST API: they read the host (the engine,
NVML, the stores, the databases) with the hub's own configuration. So each is a program of its
own, ``python -m gpulab.doctor`` (:mod:`gpulab.doctor`) and ``python -m gpulab.admin``
(:mod:`gpulab.admin`), which these commands run with the same Python and whose exit status
they return: the CLI itself still loads nothing of gpulab outside this package
(tests/unit/test_cli.py).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

#: command -> (its program, its line in the command list)
PROGRAMS = {
    "doctor": (
        "gpulab.doctor",
        "(operators, on the hub's host) check what gpulab needs of this host: engine, "
        "GPUs, images, stores, address pools, database, proxy",
    ),
    "admin": (
        "gpulab.admin",
        "(operators, on the hub's host) back up, restore, upgrade the databases: "
        "gpulab admin backup DEST | restore SRC DATA_DIR | upgrade-db",
    ),
}


def run_program(command: str, args: Sequence[str]) -> int:
    """Run the command's program with ``args`` (its own options, --help included); its exit
    status."""
    return subprocess.call([sys.executable, "-m", PROGRAMS[command][0], *args])


def add_host_commands(top) -> None:
    """``gpulab doctor`` and ``gpulab admin`` in the command list; ``gpulab.cli.main`` hands
    their arguments to :func:`run_program` before parsing, so that they are the programs'
    own."""
    for command, (_, summary) in PROGRAMS.items():
        top.add_parser(command, add_help=False, help=summary).set_defaults(
            func=lambda args, command=command: run_program(command, []), needs_client=False
        )
