"""Install and serve are two things (docs/install.md): scripts/install.sh puts gpulab, its
proxy, the engine and the images in place, and says so; scripts/serve.sh (what the systemd
unit deploy/systemd/gpulab.service runs, and `make serve`, `make run`) starts the hub and
installs nothing.

Real parts only: systemd-analyze, the hub with its proxy and the gpulab service, pip, npm,
the Docker engine and scripts/build-images.sh (which finds the suite's images up to date).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import requests

from ..conftest import _need

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "deploy" / "systemd" / "gpulab.service"

#: what installing runs and serving must never: the package managers, the image build's tools
INSTALL_TOOLS = ("apt-get", "apt", "dpkg", "npm", "npx", "pip", "pip3", "make", "debootstrap")


def test_systemd_unit_passes_verify(tmp_path):
    """The shipped unit passes `systemd-analyze verify` with no warning. The unit names the
    installation's prefix, /opt/gpulab, which does not exist here, and verify checks that
    ExecStart= is an executable file: so the copy verified is the shipped text with /opt/gpulab
    replaced by this checkout (its scripts/serve.sh exists), written as gpulab.service in a
    directory of its own. Nothing else of the text changes."""
    analyze = shutil.which("systemd-analyze")
    if not analyze:
        _need("systemd-analyze is missing (Debian: apt-get install systemd)")
    text = UNIT.read_text()
    assert "ExecStart=/opt/gpulab/scripts/serve.sh\n" in text
    rendered = tmp_path / "gpulab.service"
    rendered.write_text(text.replace("/opt/gpulab", str(REPO)))
    run = subprocess.run(
        [analyze, "verify", str(rendered)], capture_output=True, text=True, timeout=60
    )
    # verify exits 0 on unknown keys and bad values, with a line saying so: none is allowed
    assert run.returncode == 0 and not (run.stdout + run.stderr).strip(), run.stdout + run.stderr
    # ... and a bad copy is caught by it (the check above can fail)
    rendered.write_text(text.replace("/opt/gpulab", str(tmp_path / "nowhere")))
    bad = subprocess.run([analyze, "verify", str(rendered)], capture_output=True, text=True)
    assert bad.returncode != 0 and "serve.sh" in bad.stderr, bad.stderr


def _trap_dir(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A directory of stand-ins for the install tools, first on a PATH: each records its
    name and arguments in calls.log and fails. `docker` records its arguments in docker.log
    and runs the real one (the hub asks it for the bridge's gateway)."""
    traps = tmp_path / "traps"
    traps.mkdir()
    calls, docker_calls = tmp_path / "calls.log", tmp_path / "docker.log"
    for name in INSTALL_TOOLS:
        tool = traps / name
        tool.write_text(f'#!/bin/sh\necho "{name} $*" >>{calls}\nexit 97\n')
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    real_docker = shutil.which("docker")
    assert real_docker
    docker = traps / "docker"
    docker.write_text(f'#!/bin/sh\necho "$*" >>{docker_calls}\nexec {real_docker} "$@"\n')
    docker.chmod(docker.stat().st_mode | stat.S_IXUSR)
    return traps, calls, docker_calls


def test_serve_starts_the_hub_without_installing(hub_with, tmp_path):
    """scripts/serve.sh (the unit's ExecStart) starts the hub, its proxy and the gpulab
    service, and runs no install step: with stand-ins for apt-get, dpkg, npm, pip, make and
    debootstrap first on its PATH, none is called, pip (the venv's, which serve.sh puts first)
    writes nothing to PIP_LOG, and docker is asked nothing that builds or fetches an image.
    The time to a hub that answers is measured and reported, not asserted beyond the start's
    own limit (60 s)."""
    traps, calls, docker_calls = _trap_dir(tmp_path)
    hub = hub_with(start=False)
    hub.argv = [str(REPO / "scripts" / "serve.sh")]
    hub.env.update(
        PATH=f"{traps}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        PIP_LOG=str(tmp_path / "pip.log"),
    )
    t0 = time.monotonic()
    hub.start()
    took = time.monotonic() - t0
    print(f"serve.sh: the hub and the gpulab service answered {took:.1f} s after the start")
    assert requests.get(f"{hub.url}/services/gpulab/api/health", timeout=10).ok
    assert not calls.exists(), f"serve ran install tools:\n{calls.read_text()}"
    assert not (tmp_path / "pip.log").exists(), "serve ran pip"
    asked = docker_calls.read_text().splitlines() if docker_calls.exists() else []
    fetching = [a for a in asked if a.split()[:1] in (["build"], ["pull"], ["import"], ["load"])]
    assert not fetching, f"serve asked docker for images: {fetching}"


def test_serve_without_install_says_so(tmp_path):
    """Without an installation serve.sh refuses at once, naming the install command (and
    installs nothing itself)."""
    env = {**os.environ, "GPULAB_VENV": str(tmp_path / "no-venv")}
    run = subprocess.run(
        [str(REPO / "scripts" / "serve.sh")], env=env, capture_output=True, text=True, timeout=30
    )
    assert run.returncode == 1
    assert "gpulab is not installed; run scripts/install.sh" in run.stderr
    assert not (tmp_path / "no-venv").exists()


def _install(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(REPO / "scripts" / "install.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _tree(path: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in path.rglob("*") if not p.is_symlink()}


def test_install_twice_second_run_does_nothing(docker_client, images, tmp_path):
    """scripts/install.sh into a fresh virtual environment and proxy directory (GPULAB_VENV,
    GPULAB_NODE_DIR: never the checkout's own .venv and .build/node, which the suite runs
    from) installs both and says so; the engine answers, and the images the suite uses are up
    to date (the sync image may be rebuilt: its hash holds the tree's sync code), which it
    says. A second run changes nothing (no file of the venv or the proxy directory is
    touched) and says "nothing to do", every step "in place".

    The first run is a real pip install of gpulab and its dependencies (from pip's cache after
    the suite's own set-up) and a real npm install of configurable-http-proxy: the slowest
    test of its module (about a minute on 2 cores)."""
    for tool in ("npm", "node"):
        if not shutil.which(tool):
            _need(f"{tool} is missing (scripts/install-prereqs.sh)")
    venv, node = tmp_path / "venv", tmp_path / "node"
    env = {
        **os.environ,
        "GPULAB_VENV": str(venv),
        "GPULAB_NODE_DIR": str(node),
        "PYTHON": sys.base_prefix + "/bin/python3",
    }
    env.pop("VIRTUAL_ENV", None)
    first = _install(env)
    assert first.returncode == 0, first.stdout + first.stderr
    lines = first.stdout.splitlines()
    assert any(line.startswith("[install] venv    installed gpulab ") for line in lines), lines
    assert any(
        line.startswith("[install] proxy   installed configurable-http-proxy 5.") for line in lines
    ), lines
    assert any(line.startswith("[install] engine  in place: Docker ") for line in lines), lines
    # the images: in place, or the sync image rebuilt (its hash holds this tree's sync code,
    # which another checkout sharing the engine may have built differently)
    assert any(
        line.startswith(("[install] images  in place: ", "[install] images  built gpulab/sync:"))
        for line in lines
    ), lines
    assert "[install] done    installed: venv proxy" in first.stdout, first.stdout
    # what it installed works
    ok = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import gpulab, jupyterhub; print(gpulab.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert ok.stdout.strip() == str(REPO / "src" / "gpulab" / "__init__.py")
    chp = node / "node_modules" / ".bin" / "configurable-http-proxy"
    assert subprocess.run(
        [str(chp), "--version"], capture_output=True, text=True
    ).stdout.startswith("5.")

    before = {**_tree(venv), **_tree(node)}
    second = _install(env)
    assert second.returncode == 0, second.stdout + second.stderr
    steps = [
        line
        for line in second.stdout.splitlines()
        if not line.startswith(("[install] done", "[install] next"))
    ]
    assert len(steps) == 4, second.stdout
    for line, step in zip(steps, ("venv", "proxy", "engine", "images"), strict=True):
        assert line.startswith(f"[install] {step:<7} in place: "), second.stdout
    assert "[install] done    nothing to do: " in second.stdout, second.stdout
    assert {**_tree(venv), **_tree(node)} == before
