"""Every shell block of the docs (README.md, docs/**/*.md) runs, or says why it does not.

A fenced block marked sh/bash/shell/console is run here with bash (``set -euo pipefail``), in
the checkout, against a hub this module starts (tests.conftest.hub_with), unless an HTML comment
right above it says ``<!-- not run here: REASON -->``. A block that fails (any command's exit
status, an HTTP error from curl) fails its test. What the test sets for the blocks:

- ``http://127.0.0.1:8000`` (``make run``'s address) is this hub's address;
- ``$TOKEN``: an API token of the user ``alice``, whose notebooks and jobs the blocks make;
  the ``gpulab`` command is configured as the README tells a user to once
  (``GPULAB_URL``, ``GPULAB_TOKEN``), for the blocks that go on from there;
- ``curl`` fails on an HTTP error (``--fail-with-body``), so a refused request is a failure;
- ``GPULAB_DATA_DIR`` (a directory of the test's) and an empty ``GPULAB_SITE_CONFIG``, so that
  a block reading ``jupyterhub_config.py`` (``gpulab doctor``) writes nothing into the checkout
  and never reads this machine's /etc/gpulab; ``$WANDB_KEY``, the value a secrets example sends.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ..support.docblocks import REPO, blocks, pages

CONFIG = ""  # the repository's jupyterhub_config.py as it is (make run's)

#: commands that install, build, change the host or serve forever: a block that holds one is
#: never run here, and fails unless it says why it is not run
NEVER_RUN = re.compile(
    r"(^|[\s;&|(])(apt|apt-get|dpkg|pip3?|npm|make|systemctl|journalctl|install|sudo|nginx|"
    r"certbot|jupyterhub|docker\s+(rmi|rm|system|volume|network|build|run|pull|push)|"
    r"rm\s+-[a-z]*r|scripts/(install|build|ensure|swarm|serve)[\w.-]*)(?=$|[\s;&|)])",
    re.M,
)

SHELL_BLOCKS = [b for page in pages() for b in blocks(page) if b.shell]
TO_RUN = [b for b in SHELL_BLOCKS if b.not_run is None]


@pytest.fixture(scope="module")
def hub(hub_with):
    return hub_with(CONFIG)


@pytest.fixture(scope="module")
def alice(hub):
    return hub.create_user("alice")


def test_every_shell_block_runs_or_says_why_not():
    """The reasons are visible, and say something."""
    for b in SHELL_BLOCKS:
        assert b.not_run is None or len(b.not_run) > 10, f"{b.where}: say why it is not run"
    assert TO_RUN, "no block of the docs runs here"


def test_no_block_that_installs_or_serves_runs_here():
    risky = [f"{b.where}: {m.group(2)}" for b in TO_RUN for m in [NEVER_RUN.search(b.text)] if m]
    assert not risky, (
        "blocks that install, build, change the host or serve, with no "
        "'<!-- not run here: REASON -->' above them: " + ", ".join(risky)
    )


@pytest.mark.parametrize("block", TO_RUN, ids=[b.where for b in TO_RUN])
def test_a_docs_shell_block_works(block, hub, alice, tmp_path):
    if NEVER_RUN.search(block.text):
        pytest.fail(f"{block.where} is not run: it installs, builds or serves (say why above it)")
    script = block.text.replace("http://127.0.0.1:8000", hub.url)
    prelude = 'curl() { command curl --fail-with-body -sS "$@"; }\nset -euo pipefail\n'
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(REPO / "src"),
        "TOKEN": alice,
        "WANDB_KEY": "wandb-test-key",
        "GPULAB_DATA_DIR": str(tmp_path / "data"),
        "GPULAB_SITE_CONFIG": "",
        "GPULAB_CONFIG": str(tmp_path / "gpulab-cli.json"),
        "HOME": str(tmp_path),
    }
    for name in ("JUPYTERHUB_URL", "JUPYTERHUB_API_TOKEN"):
        env.pop(name, None)
    env.update(GPULAB_URL=hub.url, GPULAB_TOKEN=alice)
    run = subprocess.run(
        ["bash", "-c", prelude + script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert run.returncode == 0, (
        f"{block.where} exited {run.returncode}:\n{script}\n--- stdout\n{run.stdout[-3000:]}"
        f"\n--- stderr\n{run.stderr[-3000:]}"
    )
