#!/usr/bin/env python3
"""What gpulab reads from this host's NVIDIA driver, checked against the real driver.

The unit tests drive these paths through a stub ``libnvidia-ml.so.1``; this script drives
them through the real one, on a GPU host, without Docker, a hub or a database (it needs
Python, nvidia-ml-py, and PyTorch for the load):

1. the inventory (``gpus.inventory.discover_nvml``): devices, models, memory, driver, CUDA;
2. ``gpulab doctor``'s driver and GPU findings from that inventory, and its CUDA rule for
   an image built for the driver's CUDA and for one built for a newer major version;
3. the usage that the hang detector, the idle culler and ``/metrics`` read
   (``gpus.usage.NvmlUsage``), idle and while a PyTorch matrix-product loop runs on GPU 0,
   found by the device's index and by its UUID as the ledger may book it;
4. the Swarm GPU agent's line (``python -m gpulab.gpus.agent --once``) as the service
   parses it (``latest_readings``).

Usage, from the repository root: ``PYTHONPATH=src python3 scripts/gpu-check.py [--load S]``.
Prints what it read, one line per check, and exits 1 when any check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from gpulab.cuda import cuda_shortfall
from gpulab.doctor.checks import OK, check_driver, check_gpus
from gpulab.gpus.agent import latest_readings, max_age
from gpulab.gpus.inventory import discover_nvml
from gpulab.gpus.usage import NvmlUsage, busiest, usage_of

LOAD = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(20):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
"""

failures: list[str] = []


def check(name: str, ok: bool, found: object) -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {found}", flush=True)
    if not ok:
        failures.append(name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", type=float, default=12.0, help="seconds of load on GPU 0")
    args = parser.parse_args()

    t = time.perf_counter()
    inv = discover_nvml()
    took = time.perf_counter() - t
    check(
        "inventory",
        bool(inv.devices) and bool(inv.driver) and bool(inv.cuda) and not inv.problem,
        f"{[d.to_json() for d in inv.devices]} driver {inv.driver} CUDA {inv.cuda} "
        f"in {took * 1000:.0f} ms {inv.problem}",
    )
    if not inv.devices:
        return 1

    findings = [check_driver(inv, (), True), *check_gpus((), inv, True)]
    for f in findings:
        check(f"doctor {f.check}", f.status == OK, f"{f.status}: {f.found} {f.todo}".strip())
    check(
        "CUDA rule, image built for the driver's CUDA",
        cuda_shortfall("img", inv.cuda, inv.cuda) is None,
        "runs",
    )
    newer = f"{int(inv.cuda.split('.')[0]) + 1}.0"
    refusal = cuda_shortfall("img", newer, inv.cuda)
    check(f"CUDA rule, image built for CUDA {newer}", bool(refusal), refusal)

    reader = NvmlUsage()
    t = time.perf_counter()
    idle = reader.read()
    took = time.perf_counter() - t
    ids = [d.id for d in inv.devices]
    check(
        "usage, idle",
        [u.id for u in idle] == ids and all(u.memory_total > 0 for u in idle),
        f"{[(u.id, u.utilization, u.memory_used >> 20, u.uuid) for u in idle]} "
        f"(MiB used) in {took * 1000:.1f} ms",
    )
    uuid = idle[0].uuid
    check("usage found by UUID", usage_of(idle, [uuid]) == [idle[0]], uuid)

    load = subprocess.Popen([sys.executable, "-c", LOAD, str(args.load)])
    peak, peak_mem, reads = 0, 0, []
    end = time.time() + args.load + 5
    while time.time() < end and load.poll() is None:
        time.sleep(0.5)
        t = time.perf_counter()
        now = usage_of(reader.read(), ["0"])
        reads.append(time.perf_counter() - t)
        peak = max(peak, busiest(now) or 0)
        peak_mem = max(peak_mem, now[0].memory_used if now else 0)
    load.wait(timeout=60)
    check("load ran", load.returncode == 0, f"exit {load.returncode}")
    check(
        "usage under load (hang detector's busiest)",
        peak >= 50 and peak_mem > idle[0].memory_used,
        f"peak {peak}% and {peak_mem >> 20} MiB over {len(reads)} reads, "
        f"each {1000 * sum(reads) / max(len(reads), 1):.1f} ms on average",
    )
    time.sleep(2)
    after = usage_of(reader.read(), ["0"])
    check(
        "usage after the load ended",
        bool(after) and (busiest(after) or 0) <= 10,
        f"{busiest(after)}% and {after[0].memory_used >> 20 if after else '?'} MiB",
    )
    reader.close()

    env = dict(os.environ, GPULAB_NODE="node-a")
    line = subprocess.run(
        [sys.executable, "-m", "gpulab.gpus.agent", "--once"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    readings = latest_readings(line.splitlines(), time.time(), max_age(10))
    got = [u.id for u in readings.get("node-a", [])]
    check("GPU agent's line, as the service parses it", got == ids, line.strip())

    print(json.dumps({"failures": failures}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
