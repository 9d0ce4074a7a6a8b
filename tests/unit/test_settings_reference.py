"""docs/settings.md is generated from the settings' help= (scripts/settings-reference.py): the
one description of each setting, never a hand-kept copy that drifts from the code."""

import os
import subprocess
import sys
from pathlib import Path

from traitlets import TraitType

from gpulab.notebooks.spawner import NotebookSpawner
from gpulab.settings import GpulabSettings

REPO = Path(__file__).resolve().parents[2]


def test_the_reference_is_what_the_code_says():
    generated = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "settings-reference.py")],
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert (REPO / "docs" / "settings.md").read_text() == generated, (
        "docs/settings.md is stale: run "
        "`.venv/bin/python scripts/settings-reference.py > docs/settings.md`"
    )


def test_every_setting_says_what_it_does():
    for cls in (GpulabSettings, NotebookSpawner):
        for name, trait in vars(cls).items():
            if isinstance(trait, TraitType) and trait.metadata.get("config"):
                assert len((trait.help or "").split()) >= 4, f"{cls.__name__}.{name} has no help="
                assert f"c.{cls.__name__}.{name}`" in (REPO / "docs" / "settings.md").read_text()
