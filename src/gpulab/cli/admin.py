"""``gpulab admin backup|restore|upgrade-db ...``: an operator's commands on the hub's host.

Like ``gpulab doctor``, they read the hub's configuration and its databases rather than speak
the REST API, so they are a program of their own, ``python -m gpulab.admin``
(:mod:`gpulab.admin`), which this command runs with the same Python and whose exit status it
returns: the CLI itself still loads nothing of gpulab outside this package.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

#: the operator's program
PROGRAM = "gpulab.admin"


def run_admin(args: Sequence[str]) -> int:
    """Run ``python -m gpulab.admin`` with ``args`` (its own, --help included)."""
    return subprocess.call([sys.executable, "-m", PROGRAM, *args])


def add_admin_command(top) -> None:
    """``gpulab admin`` in the command list; ``gpulab.cli.main`` hands its arguments to
    :func:`run_admin` before parsing, so that they are the program's own."""
    top.add_parser(
        "admin",
        add_help=False,
        help="(operators, on the hub's host) back up, restore, upgrade the databases: "
        "gpulab admin backup DEST | restore SRC DATA_DIR | upgrade-db",
    ).set_defaults(func=lambda args: run_admin([]), needs_client=False)
