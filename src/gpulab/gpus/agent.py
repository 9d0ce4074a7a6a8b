"""The GPU agent of a Swarm's nodes: what each node's GPUs do, read where they are.

On one engine the service reads its own host's devices with NVML (:mod:`.usage`). On a Swarm
the GPUs are on the nodes, where the service cannot call NVML; each node runs this program
instead, as the one task of a global service (``SwarmRuntime.watch_gpus``), from gpulab's sync
helper image: every ``interval`` seconds it reads its node's devices with the same
:func:`~.usage.read_devices` and prints one JSON line (:func:`reading_line`) to its output.
The service reads each task's last lines through the manager's service logs
(:func:`latest_readings`): no port, no network path and no credential of its own, and the
lines carry no user data (a device's id, UUID, utilization and memory figures).

A reading is a point in time: one older than ``max_age`` (the agent stopped, its node is
down, the logs did not come) is no reading, and a node without one is *unknown*, never idle.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .usage import DeviceUsage, NvmlUsage

#: the key that marks a line as a reading (anything else in the output is ignored)
MARK = "gpulab-gpu-agent"
#: how many of its last lines are asked of each agent task (a reading and a log line or two)
TAIL = 3


@dataclass(frozen=True)
class Reading:
    """One line of an agent: its node, when it read (epoch seconds, by the node's clock),
    its devices' usage, and why it read none ("" when it could)."""

    node: str
    time: float
    devices: tuple[DeviceUsage, ...]
    problem: str = ""


def reading_line(node: str, now: float, devices: Sequence[DeviceUsage], problem: str = "") -> str:
    """The line an agent prints: compact JSON, one line."""
    return json.dumps(
        {
            MARK: 1,
            "node": node,
            "time": round(now, 3),
            "devices": [
                {
                    "id": d.id,
                    "utilization": d.utilization,
                    "memory_used": d.memory_used,
                    "memory_total": d.memory_total,
                    "uuid": d.uuid,
                }
                for d in devices
            ],
            "problem": problem,
        },
        separators=(",", ":"),
    )


def parse_line(line: str | bytes) -> Reading | None:
    """A reading from one line of an agent's output; None for anything else (a log line, a
    line cut short, a value of the wrong kind)."""
    if isinstance(line, bytes):
        line = line.decode(errors="replace")
    start = line.find("{")  # after a timestamp or a details prefix, if the engine added one
    if start < 0:
        return None
    try:
        data = json.loads(line[start:])
        if not isinstance(data, dict) or data.get(MARK) != 1:
            return None
        node, when = data["node"], data["time"]
        if not isinstance(node, str) or not node or not isinstance(when, int | float):
            return None
        devices = tuple(
            DeviceUsage(
                id=str(d["id"]),
                utilization=None if d["utilization"] is None else int(d["utilization"]),
                memory_used=int(d["memory_used"]),
                memory_total=int(d["memory_total"]),
                uuid=str(d.get("uuid") or ""),
            )
            for d in data["devices"]
        )
        return Reading(node, float(when), devices, str(data.get("problem") or ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def latest_readings(
    lines: Iterable[str | bytes], now: float, max_age: float
) -> dict[str, list[DeviceUsage]]:
    """node -> its devices' usage, from the agents' output ``lines``: each node's newest
    reading, if it is at most ``max_age`` seconds old at ``now`` (and not from further than
    that in the future: a clock gone wrong). A node with no such reading, or whose newest one
    read nothing (no NVML there: ``problem``), is left out: unknown."""
    newest: dict[str, Reading] = {}
    for line in lines:
        r = parse_line(line)
        if r is not None and (r.node not in newest or r.time > newest[r.node].time):
            newest[r.node] = r
    return {
        node: list(r.devices)
        for node, r in sorted(newest.items())
        if abs(now - r.time) <= max_age and not r.problem
    }


def max_age(interval: float) -> float:
    """How old a reading may be and still count: three of the agent's intervals, and 10 s
    for the logs' way to the manager."""
    return 3 * interval + 10


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="gpulab-gpu-agent", description=__doc__)
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between readings")
    parser.add_argument("--once", action="store_true", help="print one reading and end")
    args = parser.parse_args(argv)
    # PID 1 of its container: SIGTERM has no default action there, so end on it here
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    node = os.environ.get("GPULAB_NODE", "") or os.uname().nodename
    reader = NvmlUsage()
    while True:
        devices = reader.read()
        print(reading_line(node, time.time(), devices, reader.problem), flush=True)
        if args.once:
            return
        time.sleep(max(args.interval, 1.0))


if __name__ == "__main__":
    main()
