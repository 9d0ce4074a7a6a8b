"""Benchmark gpulab-sync against `aws s3 sync` and rclone on moto's S3 server (loopback).

Not part of CI. One run measures, for each tool, on the same endpoint:
  (a) 5,000 files of 1-64 KiB: push, then pull into an empty directory;
  (b) 4 files of 256 MiB (64 MiB with --small): push, then pull;
  (c) (a) again with nothing changed: push and pull;
plus the endpoint's own ceiling: PUT/s and GET/s for small objects, MB/s for large ones, and
the time to list the 5,000 keys, each the best a many-threaded raw boto3 client gets (no
files, no hashing, no manifest). The server (a
ThreadedMotoServer) runs in its own process so that neither side steals the other's GIL;
with ``--pin-server`` it runs on a CPU of its own and the clients (raw or tools) on the
others, as a store and its clients would on separate machines.

Everything is measured ``--repeat`` times (default 3), the tools taking turns in each round
(which goes first rotates), and the medians are printed (the best for the ceiling): single
runs on a small virtual machine vary by a factor of two. bench/README.md says how gpulab's
S3 layer was chosen (engine variants side by side, paired by round).

    .venv/bin/python bench/bench_sync.py [--small] [--files 5000] [--workers 32] [--repeat 3]
                                         [--pin-server] [--tools ...] [--no-ceiling]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import boto3
from botocore.config import Config

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
KEY, SECRET = "AKIABENCHGPULAB00001", "bench-secret-not-real-0123456789"
MiB = 1024 * 1024

SERVER_CODE = """
import sys, time
from moto.server import ThreadedMotoServer
srv = ThreadedMotoServer(ip_address="127.0.0.1", port=int(sys.argv[1]), verbose=False)
srv.start()
print("ready", flush=True)
while True:
    time.sleep(3600)
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def client(endpoint: str, threads: int = 64):
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=KEY,
        aws_secret_access_key=SECRET,
        config=Config(max_pool_connections=threads, s3={"addressing_style": "path"}),
    )


def empty_bucket(c, bucket: str) -> None:
    """Delete a bucket and its objects (frees moto's memory between tools)."""
    try:
        for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                c.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
        c.delete_bucket(Bucket=bucket)
    except c.exceptions.NoSuchBucket:
        pass


# -- data ----------------------------------------------------------------------------------


def make_small_tree(root: Path, n: int) -> int:
    total = 0
    for i, size in enumerate(small_sizes(n)):
        d = root / f"d{i % 100:03d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i:05d}.bin").write_bytes(os.urandom(size))
        total += size
    return total


def make_large_tree(root: Path, count: int, size: int) -> int:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        with open(root / f"big{i}.bin", "wb") as f:
            for _ in range(size // MiB):
                f.write(os.urandom(MiB))
    return count * size


# -- ceiling -------------------------------------------------------------------------------


@dataclass
class Ceiling:
    put_per_s: float  # objects of 1-64 KiB as in (a), the tools' concurrency
    get_per_s: float
    put_mb_s: float  # the scenario's large objects (4 of them, one thread each)
    get_mb_s: float
    put_mb_s_16mib: float  # 32 objects of 16 MiB, same concurrency (moto's best case)
    get_mb_s_16mib: float

    def best(self, other: Ceiling | None) -> Ceiling:
        if other is None:
            return self
        pairs = zip(vars(self).values(), vars(other).values(), strict=True)
        return Ceiling(*(max(a, b) for a, b in pairs))


class RawBoto3:
    """A plain boto3 client, as a user would write it."""

    name = "boto3"

    def __init__(self, endpoint: str, bucket: str, threads: int) -> None:
        self.c, self.bucket = client(endpoint, threads), bucket

    def put(self, key: str, data: bytes) -> None:
        self.c.put_object(Bucket=self.bucket, Key=key, Body=data)

    def get(self, key: str) -> int:
        body = self.c.get_object(Bucket=self.bucket, Key=key)["Body"]
        return sum(len(chunk) for chunk in body.iter_chunks(MiB))

    def list(self) -> int:
        pages = self.c.get_paginator("list_objects_v2").paginate(Bucket=self.bucket)
        return sum(len(p.get("Contents", [])) for p in pages)


RAW_CLIENTS = (RawBoto3,)


def timed(fn, items, threads: int) -> float:
    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(fn, items))
    return time.perf_counter() - start


def small_sizes(n: int) -> list[int]:
    """The sizes of the small scenario's files (1-64 KiB, the same draw)."""
    rng = random.Random(42)
    return [rng.randint(1024, 64 * 1024) for _ in range(n)]


def measure_ceiling(endpoint: str, big_size: int, threads: int) -> Ceiling:
    """The best rates of the raw clients (objects in memory, nothing hashed or written) at
    ``threads`` requests in flight, the tools' concurrency: 1,500 PUTs and GETs of the small
    scenario's sizes; 4 objects of the large scenario's size; 32 of 16 MiB."""
    bucket = "bench-ceiling"
    n, nmid = 1500, 32
    pool = os.urandom(64 * 1024)
    smalls = [pool[:size] for size in small_sizes(n)]
    big, mid = os.urandom(big_size), os.urandom(16 * MiB)
    best: Ceiling | None = None
    for raw_cls in RAW_CLIENTS:
        client(endpoint).create_bucket(Bucket=bucket)
        raw = raw_cls(endpoint, bucket, threads)
        rates = [
            n / timed(lambda i, r=raw: r.put(f"s/{i}", smalls[i]), range(n), threads),
            n / timed(lambda i, r=raw: r.get(f"s/{i}"), range(n), threads),
        ]
        mb = 4 * big_size / 1e6
        rates.append(mb / timed(lambda i, r=raw: r.put(f"b/{i}", big), range(4), 4))
        rates.append(mb / timed(lambda i, r=raw: r.get(f"b/{i}"), range(4), 4))
        mb = nmid * len(mid) / 1e6
        rates.append(mb / timed(lambda i, r=raw: r.put(f"m/{i}", mid), range(nmid), threads))
        rates.append(mb / timed(lambda i, r=raw: r.get(f"m/{i}"), range(nmid), threads))
        best = Ceiling(*rates).best(best)
        empty_bucket(client(endpoint), bucket)  # frees moto's memory
    assert best is not None
    return best


def measure_listing(endpoint: str, bucket: str) -> float:
    """The fastest a raw client lists ``bucket`` (what an unchanged pull cannot avoid)."""
    times = []
    for raw_cls in RAW_CLIENTS:
        raw = raw_cls(endpoint, bucket, 4)
        start = time.perf_counter()
        raw.list()
        times.append(time.perf_counter() - start)
    return min(times)


def measure_raw_download(endpoint: str, bucket: str, keys: list[str], dest: Path) -> float:
    """Raw boto3 GETs of ``keys`` written to files (nothing hashed), one thread each: the
    disk's share."""
    raw = RawBoto3(endpoint, bucket, len(keys))
    dest.mkdir(parents=True, exist_ok=True)

    def fetch(key: str) -> None:
        body = raw.c.get_object(Bucket=bucket, Key=key)["Body"]
        with open(dest / key, "wb") as f:
            for chunk in body.iter_chunks(MiB):
                f.write(chunk)

    elapsed = timed(fetch, keys, len(keys))
    shutil.rmtree(dest)
    return elapsed


# -- tools ---------------------------------------------------------------------------------


#: CPU seconds (user + system) of the last command :func:`run` ran
last_cpu_s = 0.0


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(cmd: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    global last_cpu_s
    cpu_before = _children_cpu()
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    last_cpu_s = _children_cpu() - cpu_before
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return elapsed, proc


class Tool:
    name = ""

    def __init__(self, endpoint: str, workers: int, tmp: Path) -> None:
        self.endpoint, self.workers, self.tmp = endpoint, workers, tmp
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RCLONE_"))}
        self.env.update(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET)

    def push(self, local: Path, bucket: str) -> float: ...
    def pull(self, bucket: str, local: Path) -> float: ...


class Gpulab(Tool):
    name = "gpulab-sync"
    extra_args: tuple[str, ...] = ()
    last_engine_s = 0.0

    def _run(self, op: str, local: Path, bucket: str) -> float:
        cmd = [str(BIN / "gpulab-sync"), op, "--store-endpoint", self.endpoint]
        cmd += ["--bucket", bucket, "--local", str(local), "--workers", str(self.workers)]
        cmd += ["--json-progress", "--mode", "rw"]
        cmd += self.extra_args
        elapsed, proc = run(cmd, self.env)
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        assert report["ok"], report
        self.last_engine_s = report["elapsed_s"]
        return elapsed

    def push(self, local: Path, bucket: str) -> float:
        return self._run("push", local, bucket)

    def pull(self, bucket: str, local: Path) -> float:
        return self._run("pull", local, bucket)


class AwsCli(Tool):
    name = "aws s3 sync"

    def __init__(self, *args) -> None:
        super().__init__(*args)
        cfg = self.tmp / "aws-config"
        cfg.write_text(
            f"[default]\nregion = us-east-1\ns3 =\n  max_concurrent_requests = {self.workers}\n"
        )
        self.env["AWS_CONFIG_FILE"] = str(cfg)
        self.env["AWS_SHARED_CREDENTIALS_FILE"] = str(self.tmp / "none")

    def _sync(self, src: str, dst: str) -> float:
        cmd = [str(BIN / "aws"), "--endpoint-url", self.endpoint, "s3", "sync", src, dst]
        return run(cmd + ["--only-show-errors"], self.env)[0]

    def push(self, local: Path, bucket: str) -> float:
        c = client(self.endpoint)
        if bucket not in [b["Name"] for b in c.list_buckets()["Buckets"]]:
            c.create_bucket(Bucket=bucket)
        return self._sync(str(local), f"s3://{bucket}")

    def pull(self, bucket: str, local: Path) -> float:
        return self._sync(f"s3://{bucket}", str(local))


class Rclone(Tool):
    name = "rclone copy"

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.env.update(
            RCLONE_CONFIG_BENCH_TYPE="s3",
            RCLONE_CONFIG_BENCH_PROVIDER="Other",
            RCLONE_CONFIG_BENCH_ENDPOINT=self.endpoint,
            RCLONE_CONFIG_BENCH_ACCESS_KEY_ID=KEY,
            RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY=SECRET,
            RCLONE_CONFIG_BENCH_REGION="us-east-1",
            RCLONE_CONFIG_BENCH_FORCE_PATH_STYLE="true",
            RCLONE_CONFIG="/dev/null",
        )
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_CA_BUNDLE"):
            self.env.pop(k, None)  # AWS_CA_BUNDLE makes rclone's S3 backend fail at once

    def _copy(self, src: str, dst: str) -> float:
        n = str(self.workers)
        cmd = ["rclone", "copy", src, dst, "--transfers", n, "--checkers", n]
        return run(cmd, self.env)[0]

    def push(self, local: Path, bucket: str) -> float:
        return self._copy(str(local), f"bench:{bucket}")

    def pull(self, bucket: str, local: Path) -> float:
        return self._copy(f"bench:{bucket}", str(local))


# -- main ----------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="4 x 64 MiB instead of 4 x 256 MiB")
    ap.add_argument("--files", type=int, default=5000)
    ap.add_argument(
        "--workers",
        type=int,
        default=32,
        help="requests in flight, the same for every tool and for the ceiling's raw clients",
    )
    ap.add_argument("--repeat", type=int, default=3, help="rounds; medians are printed")
    ap.add_argument(
        "--pin-server",
        action="store_true",
        help="run the server on CPU 0 and the clients on the others, as on separate machines "
        "(default: they share every CPU)",
    )
    ap.add_argument(
        "--tools",
        default="gpulab,aws,rclone",
        help="comma-separated tools to run, among gpulab (the engine as shipped), aws, rclone",
    )
    ap.add_argument("--no-ceiling", action="store_true", help="skip the raw clients' ceiling")
    args = ap.parse_args()
    by_name: dict[str, type[Tool]] = {
        "gpulab": Gpulab,
        "aws": AwsCli,
        "rclone": Rclone,
    }
    wanted = [t.strip() for t in args.tools.split(",") if t.strip()]
    if "gpulab" not in wanted or any(t not in by_name for t in wanted):
        ap.error(f"--tools: gpulab and any of {sorted(by_name)}")
    cpus = sorted(os.sched_getaffinity(0))
    pin = args.pin_server and len(cpus) >= 2
    server_cpus, client_cpus = ({cpus[0]}, set(cpus[1:])) if pin else (set(cpus), set(cpus))
    big_size = (64 if args.small else 256) * MiB

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER_CODE, str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        preexec_fn=lambda: os.sched_setaffinity(0, server_cpus),
    )
    os.sched_setaffinity(0, client_cpus)  # this process, its raw clients and every tool
    tmp = Path(tempfile.mkdtemp(prefix="gpulab-bench-"))
    try:
        assert server.stdout and server.stdout.readline().strip() == "ready"
        print(f"moto server pid {server.pid} on {endpoint}; scratch {tmp}", flush=True)
        print(f"CPUs: server {sorted(server_cpus)}, clients {sorted(client_cpus)}", flush=True)
        small_bytes = make_small_tree(tmp / "small", args.files)
        large_bytes = make_large_tree(tmp / "large", 4, big_size)
        print(
            f"data: {args.files} files / {small_bytes / MiB:.0f} MiB; "
            f"4 files / {large_bytes / MiB:.0f} MiB",
            flush=True,
        )
        tools: list[type[Tool]] = [by_name[t] for t in wanted]
        if Rclone in tools and not shutil.which("rclone"):
            tools.remove(Rclone)
            print("rclone not installed: skipped")
        times: dict[str, dict[str, list[float]]] = {}
        cpu: dict[str, dict[str, list[float]]] = {}
        engine_s: dict[str, list[float]] = {"unchanged push": [], "unchanged pull": []}
        listing_s: list[float] = []
        raw_to_disk_s: list[float] = []
        ceiling: Ceiling | None = None
        raw = client(endpoint)
        for rnd in range(1, args.repeat + 1):
            if not args.no_ceiling:
                ceiling = measure_ceiling(endpoint, big_size, args.workers).best(ceiling)
            # the tools take turns, and which goes first changes from round to round
            shift = (rnd - 1) % len(tools)
            for tool_cls in tools[shift:] + tools[:shift]:
                tool = tool_cls(endpoint, args.workers, tmp)
                r = times.setdefault(tool.name, {})
                b_small = f"bench-{tool_cls.__name__.lower()}-s{rnd}"
                b_large = f"bench-{tool_cls.__name__.lower()}-l{rnd}"
                out_small, out_large = tmp / f"out-{b_small}", tmp / f"out-{b_large}"
                runs = [
                    ("small push", tool.push, (tmp / "small", b_small)),
                    ("small pull", tool.pull, (b_small, out_small)),
                    ("unchanged push", tool.push, (tmp / "small", b_small)),
                    ("unchanged pull", tool.pull, (b_small, out_small)),
                    ("large push", tool.push, (tmp / "large", b_large)),
                    ("large pull", tool.pull, (b_large, out_large)),
                ]
                for scenario, fn, fn_args in runs:
                    r.setdefault(scenario, []).append(fn(*fn_args))
                    cpu.setdefault(tool.name, {}).setdefault(scenario, []).append(last_cpu_s)
                    if type(tool) is Gpulab and scenario in engine_s:
                        engine_s[scenario].append(tool.last_engine_s)
                n_out = sum(1 for p in out_small.rglob("*.bin"))
                assert n_out == args.files, (tool.name, n_out)
                for i in range(4):
                    assert (out_large / f"big{i}.bin").stat().st_size == big_size
                listing_s.append(measure_listing(endpoint, b_small))
                if type(tool) is Gpulab and not args.no_ceiling:
                    keys = [f"big{i}.bin" for i in range(4)]
                    raw_to_disk_s.append(
                        measure_raw_download(endpoint, b_large, keys, tmp / "raw-to-disk")
                    )
                empty_bucket(raw, b_small)
                empty_bucket(raw, b_large)
                shutil.rmtree(out_small)
                shutil.rmtree(out_large)
                print(
                    f"round {rnd} {tool.name}: "
                    + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in r.items()),
                    flush=True,
                )
        print(f"listing {args.files} keys, best raw client: {min(listing_s):.2f}s", flush=True)
        ideal: dict[str, float] = {"unchanged pull": min(listing_s)}
        if ceiling is not None:
            print(
                f"ceiling (raw boto3, best of {args.repeat} "
                f"rounds): {ceiling.put_per_s:.0f} PUT/s, {ceiling.get_per_s:.0f} GET/s (1-64 "
                f"KiB, {args.workers} in flight); "
                f"{ceiling.put_mb_s:.0f} MB/s PUT, {ceiling.get_mb_s:.0f} MB/s GET (4 x "
                f"{big_size // MiB} MiB, as the large scenario); {ceiling.put_mb_s_16mib:.0f} "
                f"MB/s PUT, {ceiling.get_mb_s_16mib:.0f} MB/s GET (32 x 16 MiB)",
                flush=True,
            )
            ideal |= {
                "small push": args.files / ceiling.put_per_s,
                "small pull": args.files / ceiling.get_per_s,
                "large push": large_bytes / 1e6 / ceiling.put_mb_s,
                "large pull": large_bytes / 1e6 / ceiling.get_mb_s,
            }
        results = {t: {k: statistics.median(v) for k, v in r.items()} for t, r in times.items()}
        bests = {t: {k: min(v) for k, v in r.items()} for t, r in times.items()}

        print()
        others = [t for t in results if t != "gpulab-sync"]
        width = {t: max(14, len(t) + 2) for t in results}
        head = f"{'scenario':<16}{'ceiling':>9}"
        for t in results:
            head += f"{t:>{width[t]}}"
        head += f"{'gpulab share':>14}{'best share':>12}"
        head += "".join(f"{'x vs ' + t:>{width[t] + 5}}" for t in others)
        print(head)
        for scenario in results["gpulab-sync"]:
            line = f"{scenario:<16}"
            line += f"{ideal[scenario]:>8.2f}s" if scenario in ideal else f"{'-':>9}"
            for t in results:
                line += f"{results[t][scenario]:>{width[t] - 1}.2f}s"
            g = results["gpulab-sync"][scenario]
            share = f"{ideal[scenario] / g:.0%}" if scenario in ideal else "-"
            gb = bests["gpulab-sync"][scenario]
            best_share = f"{ideal[scenario] / gb:.0%}" if scenario in ideal else "-"
            line += f"{share:>14}{best_share:>12}"
            for t in others:
                line += f"{results[t][scenario] / g:>{width[t] + 4}.2f}x"
            print(line)
        print()
        print(
            f"medians of {args.repeat} rounds, {args.workers} requests in flight for every "
            "client. ceiling = the time the raw clients need for the same objects/bytes (for "
            "the unchanged pull: to list the keys), best of the rounds; share = ceiling / "
            "gpulab's median time; best share = ceiling / gpulab's best time; 'x vs T' = T's "
            "time / gpulab's (>1: gpulab faster). Times are wall clock of each CLI process "
            "(interpreter start-up included)."
        )
        hand = times["gpulab-sync"]
        for variant in tools:
            if not issubclass(variant, Gpulab) or variant is Gpulab:
                continue
            other = times[variant.name]
            print(
                f"gpulab-sync against {variant.name}: {variant.name}'s time / "
                "gpulab-sync's, paired by round (median, then each round)"
            )
            for scenario in hand:
                per_round = [b / a for a, b in zip(hand[scenario], other[scenario], strict=True)]
                print(
                    f"  {scenario:<16} {statistics.median(per_round):.2f}x  rounds "
                    + " ".join(f"{r:.2f}" for r in per_round)
                )
        print(
            "gpulab engine time (from its report, without process start-up): "
            + ", ".join(f"{k} {statistics.median(v):.3f}s" for k, v in engine_s.items())
        )
        if raw_to_disk_s:
            print(
                "raw boto3 GETs of the 4 large objects written to files, nothing hashed: "
                f"{statistics.median(raw_to_disk_s):.2f}s (the ceiling keeps them in memory)"
            )
        print("client CPU (user + system, median), per object for (a), per GiB for (b):")
        for t, per in cpu.items():
            med = {k: statistics.median(v) for k, v in per.items()}
            gib = large_bytes / 2**30
            print(
                f"  {t:<12} small push {med['small push'] / args.files * 1000:.2f} ms, "
                f"small pull {med['small pull'] / args.files * 1000:.2f} ms, "
                f"large push {med['large push'] / gib:.2f} s, "
                f"large pull {med['large pull'] / gib:.2f} s"
            )
        if ceiling is not None:
            g = results["gpulab-sync"]
            mb = large_bytes / 1e6
            print(
                "large scenario against the 16 MiB-object ceiling instead: push "
                f"{mb / ceiling.put_mb_s_16mib / g['large push']:.0%}, pull "
                f"{mb / ceiling.get_mb_s_16mib / g['large pull']:.0%}"
            )
    finally:
        server.terminate()
        server.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
