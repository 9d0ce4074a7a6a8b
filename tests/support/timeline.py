"""Where a test run's time went, per pytest-xdist worker and per work unit.

The controller sees every test's report (under pytest-xdist with the worker that ran it). At
the end it writes ``artifacts/timeline.tsv`` (the swarm lab's pass: ``timeline-swarm.tsv``;
worker, phase, start, seconds, test) and prints, per worker, how long it was busy and when it
finished, and the heaviest work units (an ``xdist_group``, else a module): a run whose
workers finish far apart is scheduled badly, one whose workers are both busy to the end is as
short as its tests allow.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


def unit_of(nodeid: str) -> str:
    """The work unit of a test under ``--dist loadgroup``: its group (after the last ``@``
    past any parameters), else its module."""
    at, bracket = nodeid.rfind("@"), nodeid.rfind("]")
    if at > bracket:
        return nodeid[at + 1 :]
    return nodeid.split("::", 1)[0]


class Timeline:
    def __init__(self, name: str = "timeline.tsv") -> None:
        self.name = name
        self.rows: list[tuple[str, str, float, float, str]] = []

    def pytest_runtest_logreport(self, report) -> None:
        node = getattr(report, "node", None)
        worker = getattr(getattr(node, "gateway", None), "id", None) or "main"
        start, stop = getattr(report, "start", None), getattr(report, "stop", None)
        if start is None or stop is None:
            return
        self.rows.append((worker, report.when, start, stop - start, report.nodeid))

    def summary(self) -> list[str]:
        if not self.rows:
            return []
        t0 = min(r[2] for r in self.rows)
        busy: dict[str, float] = defaultdict(float)
        end: dict[str, float] = defaultdict(float)
        units: dict[tuple[str, str], float] = defaultdict(float)
        for worker, _when, start, seconds, nodeid in self.rows:
            busy[worker] += seconds
            end[worker] = max(end[worker], start + seconds - t0)
            units[(unit_of(nodeid), worker)] += seconds
        lines = [
            f"{w}: busy {busy[w]:.0f} s, last test ended at {end[w]:.0f} s" for w in sorted(busy)
        ]
        heaviest = sorted(units.items(), key=lambda kv: -kv[1])[:15]
        lines += [f"  {s:7.1f} s  {w}  {u}" for (u, w), s in heaviest]
        return lines

    def write(self) -> None:
        if not self.rows:
            return
        t0 = min(r[2] for r in self.rows)
        ARTIFACTS.mkdir(exist_ok=True)
        with open(ARTIFACTS / self.name, "w") as f:
            for worker, when, start, seconds, nodeid in sorted(self.rows, key=lambda r: r[2]):
                f.write(f"{worker}\t{when}\t{start - t0:.2f}\t{seconds:.2f}\t{nodeid}\n")

    def pytest_terminal_summary(self, terminalreporter) -> None:
        lines = self.summary()
        if not lines:
            return
        self.write()
        if sum(r[3] for r in self.rows) < 120:  # a developer's short run: the file is enough
            return
        terminalreporter.write_sep("=", f"where the time went (artifacts/{self.name})")
        for line in lines:
            terminalreporter.write_line(line)
