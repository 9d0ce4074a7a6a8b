"""``gpulab-sync`` end to end, as a subprocess against a real S3 server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from ..support.ports import free_port
from ..support.s3 import TEST_ACCESS_KEY, TEST_SECRET_KEY, FaultyProxy, MotoS3Server
from ..support.trees import read_tree, remote_tree, sample_files, write_tree

CLI = str(Path(sys.executable).parent / "gpulab-sync")


@pytest.fixture(scope="module")
def server():
    with MotoS3Server() as srv:
        yield srv


@pytest.fixture
def bucket() -> str:
    return f"cli-{uuid.uuid4().hex[:12]}"


def env(with_creds: bool = True) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    if with_creds:
        e.update(AWS_ACCESS_KEY_ID=TEST_ACCESS_KEY, AWS_SECRET_ACCESS_KEY=TEST_SECRET_KEY)
    return e


def run(*args: str, environ: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [CLI, *args], capture_output=True, text=True, timeout=120, env=environ or env()
    )
    for secret in (TEST_SECRET_KEY, TEST_ACCESS_KEY):
        assert secret not in proc.stdout and secret not in proc.stderr
    return proc


def json_lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_push_pull_with_json_progress(server, bucket, tmp_path):
    files = sample_files(40)
    write_tree(tmp_path / "a", files)
    common = ["--store-endpoint", server.endpoint, "--bucket", bucket, "--prefix", "ws/bob"]
    proc = run("push", *common, "--mode", "rw", "--local", str(tmp_path / "a"), "--json-progress")
    assert proc.returncode == 0, proc.stderr
    events = json_lines(proc.stdout)
    assert {e["event"] for e in events[:-1]} == {"progress"} and len(events) >= 2
    report = events[-1]
    assert report["event"] == "report" and report["ok"] and report["completed"] == 40
    assert report["bytes_transferred"] == sum(map(len, files.values()))
    assert set(remote_tree(server.endpoint, bucket)) == {f"ws/bob/{k}" for k in files}

    proc = run("pull", *common, "--local", str(tmp_path / "b"), "--json-progress")
    assert proc.returncode == 0, proc.stderr
    assert json_lines(proc.stdout)[-1]["completed"] == 40
    assert read_tree(tmp_path / "b") == files
    proc = run("pull", *common, "--local", str(tmp_path / "b"))
    assert proc.returncode == 0 and "0 transferred, 40 unchanged" in proc.stdout


def test_credentials_file(server, bucket, tmp_path):
    creds = tmp_path / "creds"
    creds.write_text(
        f"[default]\naws_access_key_id={TEST_ACCESS_KEY}\naws_secret_access_key={TEST_SECRET_KEY}\n"
    )
    write_tree(tmp_path / "a", {"x.txt": b"x"})
    proc = run(
        "push",
        "--store-endpoint",
        server.endpoint,
        "--bucket",
        bucket,
        "--local",
        str(tmp_path / "a"),
        "--credentials-file",
        str(creds),
        environ=env(with_creds=False),
    )
    assert proc.returncode == 0, proc.stderr
    assert remote_tree(server.endpoint, bucket) == {"x.txt": b"x"}


def test_filesystem_store(tmp_path):
    write_tree(tmp_path / "a", {"x.txt": b"x"})
    store = f"file://{tmp_path / 'store'}"
    proc = run(
        "push",
        "--store-endpoint",
        store,
        "--bucket",
        "bkt",
        "--local",
        str(tmp_path / "a"),
        environ=env(with_creds=False),
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "store/bkt/x.txt").read_bytes() == b"x"


@pytest.mark.parametrize(
    ("args", "with_creds", "message"),
    [
        (["--bucket", "Bad_Bucket"], True, "invalid bucket name"),
        (["--bucket", "good-bucket"], False, "no credentials"),
        (["--bucket", "good-bucket", "--store-endpoint", "http://u:p@h:1"], True, "store-endpoint"),
        (["--bucket", "good-bucket", "--secret", "x"], True, "unrecognized arguments"),
    ],
)
def test_bad_usage_exits_2(tmp_path, args, with_creds, message):
    proc = run("pull", "--local", str(tmp_path), *args, environ=env(with_creds))
    assert proc.returncode == 2 and message in proc.stderr


def test_unreachable_store_exits_1(bucket, tmp_path):
    write_tree(tmp_path / "a", {"x.txt": b"x"})
    proc = run(
        "push",
        "--store-endpoint",
        f"http://127.0.0.1:{free_port()}",
        "--bucket",
        bucket,
        "--local",
        str(tmp_path / "a"),
        "--max-attempts",
        "1",
        "--json-progress",
    )
    assert proc.returncode == 1
    report = json_lines(proc.stdout)[-1]
    assert report["failed"] == 1 and not report["ok"] and report["failures"][0]["key"] == "x.txt"
    assert (tmp_path / "a/x.txt").read_bytes() == b"x"


def test_purge(server, bucket, tmp_path):
    files = sample_files(12)
    write_tree(tmp_path / "a", files)
    common = ["--store-endpoint", server.endpoint, "--bucket", bucket]
    assert run("push", *common, "--prefix", "ws/a", "--local", str(tmp_path / "a")).returncode == 0
    assert run("push", *common, "--prefix", "ws/b", "--local", str(tmp_path / "a")).returncode == 0
    proc = run("purge", *common, "--prefix", "ws/a", "--json-progress")
    assert proc.returncode == 0, proc.stderr
    events = json_lines(proc.stdout)
    assert events[-1]["event"] == "report" and events[-1]["operation"] == "purge"
    assert (events[-1]["deleted"], events[-1]["objects_total"], events[-1]["ok"]) == (12, 12, True)
    assert {k.split("/")[1] for k in remote_tree(server.endpoint, bucket)} == {"b"}
    proc = run("purge", *common, "--prefix", "ws/b")
    assert proc.returncode == 0 and "12 deleted, 0 failed of 12" in proc.stdout
    assert remote_tree(server.endpoint, bucket) == {}


@pytest.mark.parametrize("prefix", [[], ["--prefix", ""], ["--prefix", "/"]])
def test_purge_refuses_empty_prefix(tmp_path, prefix):
    store = f"file://{tmp_path / 'store'}"
    write_tree(tmp_path / "store/bkt", {"x.txt": b"x"})
    proc = run("purge", "--store-endpoint", store, "--bucket", "bkt", *prefix, environ=env(False))
    assert proc.returncode == 2 and "non-empty --prefix" in proc.stderr
    assert (tmp_path / "store/bkt/x.txt").exists()


def test_pull_and_push_need_local(tmp_path):
    proc = run("pull", "--store-endpoint", f"file://{tmp_path}", "--bucket", "bkt")
    assert proc.returncode == 2 and "needs --local" in proc.stderr


def test_json_lines_are_flushed_as_they_happen(server, bucket, tmp_path):
    """A reader following stdout (a pipe, as with `docker logs --follow`) gets each JSON line
    while the sync is still running, not when the process exits."""
    write_tree(tmp_path / "a", sample_files(5))
    with FaultyProxy(server.endpoint) as proxy:
        proxy.gate.clear()  # every request to the store waits
        proc = subprocess.Popen(
            [CLI, "push", "--store-endpoint", proxy.endpoint, "--bucket", bucket]
            + ["--local", str(tmp_path / "a"), "--json-progress"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env(),
        )
        try:
            assert proc.stdout is not None
            first = json.loads(proc.stdout.readline())  # blocks until a line is flushed
            assert first["event"] == "progress" and first["objects_total"] == 5
            assert proc.poll() is None  # still waiting on the store
        finally:
            proxy.gate.set()
        rest = proc.stdout.read()
        assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    assert json_lines(rest)[-1]["completed"] == 5


def test_pull_lists_once(server, bucket, tmp_path):
    """A pull checks the bucket, lists the prefix once, then GETs what changed."""
    files = sample_files(12)
    write_tree(tmp_path / "a", files)
    common = ["--bucket", bucket, "--prefix", "/ws/ann/"]  # normalized as the engine does
    assert (
        run(
            "push", "--store-endpoint", server.endpoint, *common, "--local", str(tmp_path / "a")
        ).returncode
        == 0
    )
    with FaultyProxy(server.endpoint) as proxy:
        for expected in (12, 0):  # a first pull, then one with nothing changed
            proxy.requests.clear()
            proc = run(
                "pull",
                "--store-endpoint",
                proxy.endpoint,
                *common,
                "--local",
                str(tmp_path / "b"),
                "--json-progress",
            )
            assert proc.returncode == 0, proc.stderr
            assert json_lines(proc.stdout)[-1]["completed"] == expected
            listings = [r for r in proxy.requests if "list-type=2" in r]
            assert len(listings) == 1 and "prefix=ws%2Fann%2F" in listings[0]
            assert len([r for r in proxy.requests if r.startswith("HEAD")]) == 1
            assert len(proxy.requests) == 2 + expected  # HEAD, listing, one GET per object
    assert read_tree(tmp_path / "b") == files


def test_pull_of_a_missing_bucket(server, bucket, tmp_path):
    """A missing bucket is created, then listed."""
    with FaultyProxy(server.endpoint) as proxy:
        proc = run(
            "pull",
            "--store-endpoint",
            proxy.endpoint,
            "--bucket",
            bucket,
            "--local",
            str(tmp_path),
            "--json-progress",
        )
        assert proc.returncode == 0, proc.stderr
        report = json_lines(proc.stdout)[-1]
        assert report["ok"] and any("created" in n for n in report["notes"])
        methods = [r.split()[0] for r in proxy.requests]
        assert methods == ["HEAD", "PUT", "GET"]  # check, create, listing


def test_pull_from_an_unreachable_store_exits_1(bucket, tmp_path):
    """The engine's listing fails and says so."""
    proc = run(
        "pull",
        "--store-endpoint",
        f"http://127.0.0.1:{free_port()}",
        "--bucket",
        bucket,
        "--local",
        str(tmp_path),
        "--max-attempts",
        "1",
        "--json-progress",
    )
    assert proc.returncode == 1
    report = json_lines(proc.stdout)[-1]
    assert report["failed"] == 1 and not report["ok"]
    assert "cannot list" in report["failures"][0]["reason"]
