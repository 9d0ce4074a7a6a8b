"""Rules of the test suite itself, read from its source.

A coroutine is run with ``tests.conftest.run_async``, never ``asyncio.run``: under
pytest-xdist a worker that ran a browser test holds Playwright's loop on its main thread for
the rest of the session, and ``asyncio.run`` there raises "cannot be called from a running
event loop" (four unit tests failed in CI that way, only after a browser module on their
worker)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def calls_of_asyncio_run(root: Path) -> list[str]:
    """Every ``asyncio.run(...)`` call in the modules under ``root`` (run_async's own hands
    the function to a thread, it does not call it)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            func = getattr(node, "func", None) if isinstance(node, ast.Call) else None
            if (
                isinstance(func, ast.Attribute)
                and func.attr == "run"
                and isinstance(func.value, ast.Name)
                and func.value.id == "asyncio"
            ):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_no_test_calls_asyncio_run():
    assert calls_of_asyncio_run(TESTS) == []


def test_the_rule_finds_a_call(tmp_path):
    (tmp_path / "test_x.py").write_text("import asyncio\nasyncio.run(main())\n")
    (tmp_path / "test_y.py").write_text('"""asyncio.run() in words"""  # asyncio.run(x)\n')
    assert calls_of_asyncio_run(tmp_path) == ["test_x.py:2"]
