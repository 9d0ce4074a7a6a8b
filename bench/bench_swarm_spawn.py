"""Spawn benchmark on a Swarm: a notebook on a worker node of the swarm lab vs the same notebook
on a single-host hub, in one run, same image and options.

    .venv/bin/python bench/bench_swarm_spawn.py [--rounds 3]      (root: the lab needs it)

Brings the swarm lab up (`scripts/swarm-lab.sh up 2`, docs/swarm-lab.md) unless it is up
already, starts moto's S3 server on the lab's network (the nodes' sync helpers reach it there),
a Swarm hub and a single-host hub with the same store, then spawns a CPU notebook on each,
alternately, ROUNDS times: request -> ready. Printed: each side's times, medians and their
ratio. It takes the lab down at the end when it brought it up. (This was a test of
tests/swarm/test_swarm_notebooks.py that printed and asserted nothing: a benchmark.)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.support.hub import Hub  # noqa: E402
from tests.support.ports import free_port  # noqa: E402
from tests.swarm.conftest import SCRIPT, _load, start_s3  # noqa: E402
from tests.swarm.test_swarm_notebooks import BUCKET, CPU, _storage, _swarm_config  # noqa: E402


def time_to_ready(hub: Hub, user: str, server: str, token: str) -> float:
    t0 = time.monotonic()
    r = hub.spawn(user, server, CPU, token=token)
    if r.status_code not in (201, 202):
        raise RuntimeError(f"spawn {user}/{server}: {r.status_code} {r.text}")
    hub.wait_ready(user, server, timeout=180)
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="spawns per side")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-swarm-spawn-"))
    facts = work / "facts.json"
    up_before = subprocess.run([str(SCRIPT), "status", "--facts", str(facts)]).returncode == 0
    t0 = time.monotonic()
    subprocess.run([str(SCRIPT), "up", "2", "--facts", str(facts)], check=True)
    print(f"swarm lab up in {time.monotonic() - t0:.0f} s")
    lab = _load(facts)
    s3 = start_s3(lab, (BUCKET,), "bench-s3-credentials")
    swarm = Hub(
        work / "swarm", extra_config=_swarm_config(lab, s3.endpoint, s3.credentials, free_port())
    )
    single = Hub(work / "single", extra_config=_storage(s3.endpoint, s3.credentials))
    try:
        swarm.start()
        single.start()
        tokens = {h.instance: h.create_user("cy") for h in (swarm, single)}
        times: dict[str, list[float]] = {"worker node (swarm)": [], "single host": []}
        for i in range(args.rounds):
            for label, hub in (("worker node (swarm)", swarm), ("single host", single)):
                times[label].append(time_to_ready(hub, "cy", f"t{i}", tokens[hub.instance]))
                hub.stop_server("cy", f"t{i}")  # and waits until it is stopped
        med = {k: statistics.median(v) for k, v in times.items()}
        for k, v in times.items():
            print(f"{k}: median {med[k]:.2f} s {[round(x, 2) for x in v]}")
        print(f"ratio swarm / single host: {med['worker node (swarm)'] / med['single host']:.2f}")
    finally:
        for hub in (swarm, single):
            hub.stop()
            hub.remove_workloads()
        s3.stop()
        if not up_before:
            subprocess.run([str(SCRIPT), "down"], check=False)


if __name__ == "__main__":
    main()
