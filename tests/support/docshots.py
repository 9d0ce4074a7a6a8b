"""The screenshots the docs show are ones the browser tests take.

Each browser test saves its pages as artifacts/screenshots/<test>-NN-<what>.png
(tests/browser/conftest.py, ``Shots``). The shots named below are also the docs' pictures:
with ``GPULAB_DOC_SHOTS=1`` in the environment, a run of the browser tests copies each of
them, as it is taken, to docs/img/<name> (a copy of the file just written: no test is slower
and none takes a picture of its own for the docs). Without it nothing in docs/img changes.
tests/unit/test_docs_links.py checks that every picture of the docs is one of these, and that
each of these is shown somewhere.

Refresh the pictures after a change to a page::

    GPULAB_DOC_SHOTS=1 pytest -p no:cacheprovider tests/browser
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"

#: (test name, what the shot is called in that test) -> file name in docs/img
DOC_SHOTS: dict[tuple[str, str], str] = {
    ("test_spawn_form_errors_then_jupyterlab", "spawn-form"): "spawn-form.png",
    ("test_spawn_form_errors_then_jupyterlab", "spawn-form-field-error"): "spawn-form-error.png",
    ("test_spawn_form_errors_then_jupyterlab", "spawn-progress"): "spawn-progress.png",
    ("test_spawn_form_errors_then_jupyterlab", "jupyterlab"): "jupyterlab.png",
    ("test_spawn_form_errors_then_jupyterlab", "home-with-notebook"): "home-notebook-running.png",
    ("test_vscode_over_https_file_survives_restart_terminal_and_refusals", "vscode-terminal"): (
        "vscode.png"
    ),
    ("test_submit_job_follow_logs_until_done", "submit-form"): "job-submit-form.png",
    ("test_submit_job_follow_logs_until_done", "job-done"): "job-done.png",
    ("test_submit_a_distributed_job_and_read_each_ranks_log", "job-two-workers-done-all-ranks"): (
        "job-two-workers.png"
    ),
    ("test_terminal_panel_runs_a_command_and_shows_its_output", "job-terminal"): (
        "job-terminal.png"
    ),
    ("test_secrets_page_and_the_submit_forms_extra_fields", "secrets"): "secrets.png",
    ("test_half_a_gpu_from_the_form", "spawn-form-gpu-share"): "spawn-form-gpu-share.png",
    ("test_half_a_gpu_from_the_form", "admin-gpu-share"): "admin-gpu-share.png",
}


def wanted() -> bool:
    return os.environ.get("GPULAB_DOC_SHOTS", "") not in ("", "0")


def keep_for_docs(test: str, what: str, shot: Path) -> Path | None:
    """Copy ``shot`` to docs/img when it is one of the docs' pictures and GPULAB_DOC_SHOTS
    asks for it; the path written, else None."""
    name = DOC_SHOTS.get((test, what))
    if name is None or not wanted():
        return None
    DOCS_IMG.mkdir(parents=True, exist_ok=True)
    target = DOCS_IMG / name
    shutil.copyfile(shot, target)
    return target
