"""Dataset cache benchmark: ten jobs on one node reading one read-only dataset, with the cache
off (each job pulls its own copy: what gpulab did before) and on, side by side in one run.

    .venv/bin/python bench/bench_datasets.py [--jobs 10] [--files 64] [--mb 256] [--concurrency 10]

A real hub and the gpulab service it starts, the local Docker engine and the sync helper; the
dataset lives in the hub's filesystem store (``shared@local/DATASET``), so the figures are the
sync's own cost, not a network's. Each round starts a fresh hub (same configuration but
``dataset_cache_max_bytes``), submits the jobs at once and waits until all are DONE. Each job
reads every byte of the dataset (``cat /data/* | wc -c``) and must see all of them.

Reported per round: the pulls the sync helper ran for the dataset (the jobs' history says
"pulled" or "the node's copy in the dataset cache"), the bytes those pulls wrote to disk (the
Docker volumes' sizes), and the wall time from the first submission to the last DONE; then the
ratios (off / on).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.hub import Hub  # noqa: E402

SMALL = {"gpus": 0, "cpus": 0.25, "memory": "256M"}


def volume_bytes(prefix: str) -> int:
    """Bytes held by the Docker volumes whose name starts with ``prefix`` (du on their
    mount points: this host's engine)."""
    out = subprocess.run(
        ["docker", "volume", "ls", "-q", "--filter", f"name={prefix}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    total = 0
    for name in out:
        if not name.startswith(prefix):
            continue
        where = subprocess.run(
            ["docker", "volume", "inspect", "-f", "{{.Mountpoint}}", name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        du = subprocess.run(["du", "-sb", where], capture_output=True, text=True, check=True)
        total += int(du.stdout.split()[0])
    return total


def one_round(args, cache: str) -> dict:
    config = (
        "c.GpulabSettings.supervisor_interval = 0.1\n"
        "c.GpulabSettings.job_container_retention = 3600\n"  # volumes kept: measured after
        'c.GpulabSettings.job_quota = {"gpus": None, "jobs": None}\n'
        f"c.GpulabSettings.max_job_workers = {args.concurrency}\n"
        f"c.GpulabSettings.dataset_cache_max_bytes = {cache!r}\n"
        'c.GpulabSettings.disk_quota = "100G"\n'
    )
    hub = Hub(workdir=Path(tempfile.mkdtemp(prefix="gpulab-bench-data-")), extra_config=config)
    try:
        hub.start()
        data = hub.workdir / "data/objects/shared/corpus"
        data.mkdir(parents=True)
        size = args.mb * 1024 * 1024 // args.files
        for i in range(args.files):
            (data / f"part-{i:04d}.bin").write_bytes(os.urandom(size))
        expected = size * args.files
        token = hub.create_user("bench")
        s = requests.Session()
        s.headers["Authorization"] = f"token {token}"
        api = f"{hub.url}/services/gpulab/api"
        body = {
            "command": ["sh", "-c", "cat /data/* | wc -c"],
            "volumes": ["shared@local/corpus:/data"],
            "resources": SMALL,
        }

        def submit(_: int) -> str:
            r = s.post(f"{api}/jobs", json=body, timeout=60)
            r.raise_for_status()
            return r.json()["id"]

        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            ids = list(pool.map(submit, range(args.jobs)))
        jobs = {}
        while len(jobs) < len(ids):
            for job_id in set(ids) - set(jobs):
                job = s.get(f"{api}/jobs/{job_id}", timeout=60).json()
                if job["state"] in ("DONE", "FAILED", "ERROR", "INTERRUPTED"):
                    jobs[job_id] = job
            time.sleep(0.2)
        wall = time.perf_counter() - t0
        bad = [j for j in jobs.values() if j["state"] != "DONE"]
        if bad:
            raise SystemExit(f"{len(bad)} jobs did not end DONE: {bad[0]['message']}")
        for job_id in ids:
            out = s.get(f"{api}/jobs/{job_id}/logs", timeout=60).text.strip()
            if out != str(expected):
                raise SystemExit(f"job {job_id} read {out} bytes, not {expected}")
        events = [e["message"] for j in jobs.values() for e in j["history"]]
        pulls = sum(1 for m in events if m.startswith("pulled "))
        hits = sum(1 for m in events if "the node's copy in the dataset cache" in m)
        disk = volume_bytes(f"{hub.instance}-")
        return {"wall": wall, "pulls": pulls, "hits": hits, "disk": disk, "dataset": expected}
    finally:
        hub.stop()
        subprocess.run(
            f"docker ps -aq --filter label=org.gpulab.instance={hub.instance} "
            "| xargs -r docker rm -f; "
            f"docker volume ls -q --filter name={hub.instance}- | xargs -r docker volume rm -f",
            shell=True,
            check=False,
            capture_output=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10, help="jobs reading the dataset")
    ap.add_argument("--files", type=int, default=64, help="files in the dataset")
    ap.add_argument("--mb", type=int, default=256, help="the dataset's size, MiB")
    ap.add_argument("--concurrency", type=int, default=10, help="the user's jobs at once")
    args = ap.parse_args()
    rounds = {
        "off (each job pulls)": one_round(args, "0"),
        "on (dataset cache)": one_round(args, "100G"),
    }
    print(f"\n{args.jobs} jobs, one node, a {args.mb} MiB dataset of {args.files} files")
    print(f"{'cache':<22} {'pulls':>5} {'cache hits':>10} {'disk (MiB)':>11} {'wall (s)':>9}")
    for name, r in rounds.items():
        print(
            f"{name:<22} {r['pulls']:>5} {r['hits']:>10} {r['disk'] / 2**20:>11.1f} "
            f"{r['wall']:>9.1f}"
        )
    off, on = rounds.values()
    print(
        f"ratios off/on: pulls {off['pulls'] / max(1, on['pulls']):.1f}x, "
        f"disk {off['disk'] / max(1, on['disk']):.1f}x, wall {off['wall'] / on['wall']:.2f}x"
    )


if __name__ == "__main__":
    main()
