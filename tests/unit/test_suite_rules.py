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


def test_make_tests_workers_keep_each_modules_tests_together():
    """`make test` runs ``-n 3 --dist loadgroup``: tests/conftest.py marks each test with its
    module's group (modules that share a hub form one), and every test of a group must run
    on one worker, else a module's shared hub and module fixtures are made on both (with
    pytest 9.2, pytest-xdist dropped the groups silently: pytest-dev/pytest-xdist#1386)."""
    import subprocess
    import sys

    modules = ["tests/unit/test_suite_rules.py", "tests/unit/test_swarm_remove.py"]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2"]
        + ["--dist", "loadgroup", "-v", "-k", "not workers_keep", *modules],
        cwd=TESTS.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-2000:]
    workers: dict[str, set[str]] = {}
    for line in run.stdout.splitlines():
        if " PASSED " in line:
            worker, nodeid = line.split()[0], line.split(" PASSED ")[1].strip()
            assert "@" in nodeid, f"no group on {nodeid}: loadgroup does not group"
            workers.setdefault(nodeid.split("::")[0], set()).add(worker)
    assert set(workers) == set(modules)
    assert all(len(w) == 1 for w in workers.values()), workers


def test_the_timeline_sums_each_worker_and_work_unit():
    from types import SimpleNamespace as NS

    from ..support.timeline import Timeline, unit_of

    assert unit_of("tests/a.py::t[x@y]") == "tests/a.py"
    assert unit_of("tests/a.py::t[x]@tests.a") == "tests.a"
    assert unit_of("tests/a.py::t@tests.b") == "tests.b"
    timeline = Timeline()

    def report(worker, nodeid, start, stop, when="call"):
        node = NS(gateway=NS(id=worker))
        return NS(node=node, nodeid=nodeid, start=start, stop=stop, when=when)

    timeline.pytest_runtest_logreport(report("gw0", "tests/a.py::t1@g", 100, 110, "setup"))
    timeline.pytest_runtest_logreport(report("gw0", "tests/a.py::t1@g", 110, 130))
    timeline.pytest_runtest_logreport(report("gw1", "tests/b.py::t2", 100, 105))
    lines = timeline.summary()
    assert lines[:2] == [
        "gw0: busy 30 s, last test ended at 30 s",
        "gw1: busy 5 s, last test ended at 5 s",
    ]
    assert lines[2].split() == ["30.0", "s", "gw0", "g"]
    assert lines[3].split() == ["5.0", "s", "gw1", "tests/b.py"]
