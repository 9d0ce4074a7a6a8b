"""The docs hold together: every relative link and anchor resolves, every picture is one the
browser tests take, every fenced block says what it is, and the generated references (the
command line's, the states') say what the code says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from urllib.parse import unquote

from gpulab.lifecycle import JOB_TRANSITIONS, NOTEBOOK_TRANSITIONS, JobState, NotebookState

from ..support.docblocks import REPO, anchors, blocks, links, pages
from ..support.docshots import DOC_SHOTS


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page in pages():
        for target in links(page):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / unquote(path)).resolve() if path else page
            where = f"{page.relative_to(REPO)}: {target}"
            if not file.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{where} (no heading with that anchor)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_every_picture_of_the_docs_is_a_screenshot_the_tests_take():
    shown = set()
    for page in pages():
        for target in links(page):
            if target.endswith(".png"):
                shown.add((page.parent / target).resolve())
    img = REPO / "docs" / "img"
    made = {(img / name).resolve() for name in DOC_SHOTS.values()}
    assert shown - made == set(), f"pictures no browser test takes: {sorted(shown - made)}"
    assert made - shown == set(), f"screenshots kept for the docs but shown nowhere: {made - shown}"
    assert {p.resolve() for p in img.glob("*.png")} == made, "docs/img holds other files"


def test_every_fenced_block_says_what_it_is():
    """A block without a language could hide a command from the docs' test: each says sh (a
    command, run or given a reason), text (output, a diagram), python, json, ini..."""
    bare = [b.where for page in pages() for b in blocks(page) if not b.lang]
    assert not bare, "fenced blocks without a language: " + ", ".join(bare)


def test_the_command_line_reference_is_what_the_parser_says():
    generated = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "cli-reference.py")],
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert (REPO / "docs" / "cli.md").read_text() == generated, (
        "docs/cli.md is stale: run `.venv/bin/python scripts/cli-reference.py > docs/cli.md`"
    )


def _state_table(text: str, heading: str) -> dict[str, set[str]]:
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| ([A-Z_]+) \| .* \| ([A-Z_, ]+) \|$", section, re.M)
    return {state: {s.strip() for s in nxt.split(",")} for state, nxt in rows}


def test_the_states_reference_is_what_the_lifecycle_says():
    text = (REPO / "docs" / "states.md").read_text()
    for heading, states, table in (
        ("Notebooks", NotebookState, NOTEBOOK_TRANSITIONS),
        ("Jobs", JobState, JOB_TRANSITIONS),
    ):
        documented = _state_table(text, heading)
        assert list(documented) == [s.value for s in states], heading
        for state in states:
            assert documented[state.value] == {s.value for s in table[state]}, (heading, state)


def test_the_python_and_json_blocks_parse():
    """A configuration example that is not even Python (or JSON) would stop the hub that
    copies it; output and abridged documents are marked text."""
    import json

    bad = []
    for page in pages():
        for b in blocks(page):
            try:
                if b.lang == "python":
                    compile(b.text, b.where, "exec")
                elif b.lang == "json":
                    json.loads(b.text)
            except (SyntaxError, ValueError) as e:
                bad.append(f"{b.where}: {e}")
    assert not bad, "\n".join(bad)
