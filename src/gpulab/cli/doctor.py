"""``gpulab doctor [--config FILE] [--json] [--users N]``: an operator's check of the hub's host.

Unlike every other command it does not speak the REST API: it reads the host (the engine,
NVML, the stores, the database) with the hub's own configuration. So it is a program of its
own, ``python -m gpulab.doctor`` (:mod:`gpulab.doctor`), which this command runs with the same
Python and whose exit status it returns: the CLI itself still loads nothing of gpulab outside
this package (tests/unit/test_cli.py).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

#: the doctor's own program
PROGRAM = "gpulab.doctor"


def run_doctor(args: Sequence[str]) -> int:
    """Run the doctor with ``args`` (its own options, --help included); its exit status."""
    return subprocess.call([sys.executable, "-m", PROGRAM, *args])


def add_doctor_command(top) -> None:
    """``gpulab doctor`` in the command list; ``gpulab.cli.main`` hands its arguments to
    :func:`run_doctor` before parsing, so that they are the doctor's own."""
    top.add_parser(
        "doctor",
        add_help=False,
        help="(operators, on the hub's host) check what gpulab needs of this host: engine, "
        "GPUs, images, stores, address pools, database, proxy",
    ).set_defaults(func=lambda args: run_doctor([]), needs_client=False)
