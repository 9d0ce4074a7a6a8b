"""Fault injection for the reliability tests: the service kills itself at a named point.

Off unless the service's environment names a file in ``GPULAB_FAULT_FILE``. The file holds
one point name (``transition:RUNNING``, ``engine:start``, ...); the first time the process
crosses that point, the file is renamed to ``<file>.fired`` (so the point fires once, and the
test sees that it did) and the process sends itself SIGKILL: no ``finally``, no clean-up,
exactly what a power cut or the OOM killer leaves behind.
"""

from __future__ import annotations

import os
import signal

_ENV = "GPULAB_FAULT_FILE"


def fault_point(name: str) -> None:
    path = os.environ.get(_ENV)
    if not path:
        return
    try:
        with open(path) as f:
            wanted = f.read().strip()
    except OSError:
        return
    if wanted != name:
        return
    try:
        os.rename(path, path + ".fired")
    except OSError:
        return  # another thread fired it first
    os.kill(os.getpid(), signal.SIGKILL)
