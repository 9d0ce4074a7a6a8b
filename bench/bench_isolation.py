"""What the engine charges for gpulab's isolation of a workload, without gpulab: ``docker run
--rm`` of ``true``, many at a time, plain and with each part of what gpulab's job containers
get (runtime/objects.py), the variants taking turns (issue #32 item 6: the bare loop's rate is
the target's anchor, and these parts are the engine's, not gpulab's).

    .venv/bin/python bench/bench_isolation.py [--runs 48] [--concurrency 16] [--rounds 2]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import subprocess
import time

IMAGE = "gpulab/python:3.11"
BASE = ["docker", "run", "--rm", "--cpus", "0.25", "--memory", "256m", "--user", "1000:100"]
NETWORK = "gpulab-bench-isolation"
HARDENED = ["--cap-drop", "ALL", "--security-opt", "no-new-privileges:true"]
HARDENED += ["--pids-limit", "4096"]
READ_ONLY = ["--read-only", "--tmpfs", "/tmp:rw,nosuid,nodev,size=256m,mode=1777"]
LOGS = ["--log-opt", "max-size=10m", "--log-opt", "max-file=3"]
VARIANTS = {
    "bare": [],
    "a network of its own": ["--network", NETWORK],
    "no capabilities, no new privileges, a process cap": HARDENED,
    "read-only root, /tmp a tmpfs": READ_ONLY,
    "all of them, and a rotated log": ["--network", NETWORK, *HARDENED, *READ_ONLY, *LOGS],
}


def loop(extra: list[str], runs: int, concurrency: int) -> float:
    def one(_: int) -> None:
        subprocess.run([*BASE, *extra, IMAGE, "true"], check=True, capture_output=True)

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(runs)))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=48, help="containers per variant and round")
    ap.add_argument("--concurrency", type=int, default=16, help="at a time")
    ap.add_argument("--rounds", type=int, default=2, help="rounds (the variants take turns)")
    args = ap.parse_args()
    subprocess.run(["docker", "network", "create", NETWORK], capture_output=True)
    try:
        loop([], args.concurrency, args.concurrency)  # warm-up
        took: dict[str, list[float]] = {k: [] for k in VARIANTS}
        for _ in range(args.rounds):
            for name, extra in VARIANTS.items():
                took[name].append(loop(extra, args.runs, args.concurrency))
    finally:
        subprocess.run(["docker", "network", "rm", NETWORK], capture_output=True)
    bare = statistics.mean(took["bare"])
    print(f"{args.runs} x docker run --rm {IMAGE} true, {args.concurrency} at a time")
    for name, times in took.items():
        mean = statistics.mean(times)
        rounds = ", ".join(f"{t:.1f}" for t in times)
        print(f"  {name:52s} {rounds} s, mean {mean:.1f} s: {bare / mean:.2f}x the bare rate")


if __name__ == "__main__":
    main()
