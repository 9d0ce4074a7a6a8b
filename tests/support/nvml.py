"""A stand-in NVIDIA driver library for tests: ``fake_nvml.c`` (beside this file) compiled with
``cc`` into a directory as ``libnvidia-ml.so.1``. A process started with that directory on its
``LD_LIBRARY_PATH`` and ``FAKE_NVML_GPUS`` in its environment finds those GPUs through the real
nvidia-ml-py binding (see the C file for the variables it reads)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).with_name("fake_nvml.c")
LIBRARY = "libnvidia-ml.so.1"

#: two whole GPUs, as the tests' stand-in host has them
TWO_GPUS = "NVIDIA H100 80GB HBM3:81559;NVIDIA A100-SXM4-40GB:40960:-"


def build_fake_nvml(directory: Path) -> Path:
    """Compile the stand-in into ``directory`` (made if needed); returns the directory, to
    put on ``LD_LIBRARY_PATH``."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc) to build the stand-in libnvidia-ml.so.1")
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", f"-Wl,-soname,{LIBRARY}", "-o", str(directory / LIBRARY)]
        + [str(SOURCE)],
        check=True,
        capture_output=True,
    )
    return directory


def nvml_env(library_dir: Path | None, gpus: str = TWO_GPUS, **extra: str) -> dict[str, str]:
    """Environment variables that make a new process see ``gpus`` through the stand-in
    (``library_dir`` None: no NVIDIA library at all on its path)."""
    env = {"FAKE_NVML_GPUS": gpus, **extra}
    env["LD_LIBRARY_PATH"] = str(library_dir) if library_dir else ""
    return env


def set_usage(path: Path, usage: dict[str, tuple[int, int]]) -> None:
    """Write what the stand-in reports from now on (``FAKE_NVML_USAGE`` names ``path``):
    {device: (utilization percent, memory used in MiB)}, a device being a GPU's index ("0")
    or a MIG device's "GPU:SLOT" ("2:1"); a device left out is idle. Written whole and
    renamed, so that a process reading it never sees half of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(f"{k} {u} {m}\n" for k, (u, m) in usage.items()))
    tmp.replace(path)


def run_python(code: str, env: dict[str, str]) -> str:
    """Run ``code`` in a new Python (the loader reads LD_LIBRARY_PATH when a process starts);
    its standard output."""
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    if out.returncode != 0:
        raise AssertionError(f"python exited {out.returncode}:\n{out.stderr}")
    return out.stdout
