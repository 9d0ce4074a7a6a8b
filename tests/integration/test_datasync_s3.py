"""The sync engine against a real S3-speaking HTTP server (moto's server on loopback)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from gpulab.datasync import (
    Credentials,
    S3Remote,
    S3Settings,
    SyncOptions,
    SyncProgress,
    pull,
    purge,
    push,
)
from gpulab.datasync.hashing import hash_file
from gpulab.datasync.manifest import MANIFEST_NAME
from gpulab.datasync.models import IntegrityError

from ..support.s3 import TEST_ACCESS_KEY, TEST_SECRET_KEY, FaultyProxy, MotoS3Server, raw_client
from ..support.trees import manifest_keys, read_tree, remote_tree, sample_files, write_tree

MiB = 1024 * 1024
CREDS = Credentials(TEST_ACCESS_KEY, TEST_SECRET_KEY)


@pytest.fixture(scope="module")
def server():
    with MotoS3Server() as srv:
        yield srv


@pytest.fixture
def bucket() -> str:
    return f"t-{uuid.uuid4().hex[:16]}"


def remote_for(endpoint: str, bucket: str, **settings) -> S3Remote:
    # a store name, not the URL, identifies the remote: the same store seen through a proxy
    return S3Remote(
        bucket,
        endpoint_url=endpoint,
        credentials=CREDS,
        settings=S3Settings(**settings),
        store_name="test",
    )


def test_push_then_pull_round_trip(server, bucket, tmp_path):
    files = sample_files()
    write_tree(tmp_path / "a", files)
    remote = remote_for(server.endpoint, bucket)
    pushed = push(tmp_path / "a", remote, "proj/x", "rw")
    assert (pushed.completed, pushed.failed, pushed.skipped) == (20, 0, 0)
    assert pushed.bytes_transferred == sum(len(v) for v in files.values())
    assert remote_tree(server.endpoint, bucket) == {f"proj/x/{k}": v for k, v in files.items()}
    head = raw_client(server.endpoint).head_object(Bucket=bucket, Key="proj/x/dir0/sub/file0.bin")
    assert (
        head["Metadata"]["gpulab-sha256"] == hashlib.sha256(files["dir0/sub/file0.bin"]).hexdigest()
    )

    pulled = pull(remote, tmp_path / "b", "proj/x")
    assert (pulled.objects_total, pulled.completed, pulled.failed) == (20, 20, 0)
    assert read_tree(tmp_path / "b") == files
    assert not list((tmp_path / "b").rglob(".gpulab-sync-tmp-*"))


def test_second_sync_transfers_nothing(server, bucket, tmp_path):
    write_tree(tmp_path / "a", sample_files())
    remote = remote_for(server.endpoint, bucket)
    push(tmp_path / "a", remote, "", "rw")
    pull(remote, tmp_path / "b")
    again_push = push(tmp_path / "a", remote, "", "rw")
    again_pull = pull(remote, tmp_path / "b")
    for rep in (again_push, again_pull):
        assert (rep.objects_total, rep.skipped, rep.completed, rep.bytes_transferred) == (
            20,
            20,
            0,
            0,
        )
        assert rep.ok


def test_push_sends_only_changes(server, bucket, tmp_path):
    files = sample_files()
    write_tree(tmp_path, files)
    remote = remote_for(server.endpoint, bucket)
    push(tmp_path, remote)
    (tmp_path / "dir1/sub/file1.bin").write_bytes(b"changed")
    (tmp_path / "new.txt").write_bytes(b"new file")
    touched = tmp_path / "dir2/sub/file2.bin"
    os.utime(touched, ns=(touched.stat().st_atime_ns, touched.stat().st_mtime_ns + 10**9))
    rep = push(tmp_path, remote)
    assert (rep.completed, rep.skipped, rep.failed) == (2, 19, 0)
    assert rep.bytes_transferred == len(b"changed") + len(b"new file")
    tree = remote_tree(server.endpoint, bucket)
    assert tree["dir1/sub/file1.bin"] == b"changed" and tree["new.txt"] == b"new file"
    # the touched file's new mtime was recorded: the next push hashes nothing
    assert push(tmp_path, remote).skipped == 21


def test_ro_pushes_nothing(server, bucket, tmp_path):
    write_tree(tmp_path, sample_files(3))
    rep = push(tmp_path, remote_for(server.endpoint, bucket), "", "ro")
    assert (rep.objects_total, rep.completed) == (0, 0) and rep.ok
    buckets = [b["Name"] for b in raw_client(server.endpoint).list_buckets()["Buckets"]]
    assert bucket not in buckets


def test_rw_never_deletes_remote(server, bucket, tmp_path):
    write_tree(tmp_path, sample_files(5))
    remote = remote_for(server.endpoint, bucket)
    push(tmp_path, remote, "", "rw")
    (tmp_path / "dir0/sub/file0.bin").unlink()
    rep = push(tmp_path, remote, "", "rw")
    assert rep.deleted == 0 and rep.ok
    assert "dir0/sub/file0.bin" in remote_tree(server.endpoint, bucket)


def test_rwd_deletes_only_what_was_synced(server, bucket, tmp_path):
    write_tree(tmp_path, sample_files(5))
    remote = remote_for(server.endpoint, bucket)
    push(tmp_path, remote, "", "rwd")
    c = raw_client(server.endpoint)
    c.put_object(Bucket=bucket, Key="foreign.txt", Body=b"never seen locally")
    (tmp_path / "dir0/sub/file0.bin").unlink()
    rep = push(tmp_path, remote, "", "rwd")
    assert (rep.objects_total, rep.deleted, rep.skipped, rep.failed) == (5, 1, 4, 0)
    tree = remote_tree(server.endpoint, bucket)
    assert "dir0/sub/file0.bin" not in tree
    assert tree["foreign.txt"] == b"never seen locally"
    assert "dir0/sub/file0.bin" not in manifest_keys(tmp_path)


def test_rwd_keeps_object_changed_remotely(server, bucket, tmp_path):
    write_tree(tmp_path, {"a.txt": b"v1"})
    remote = remote_for(server.endpoint, bucket)
    push(tmp_path, remote, "", "rwd")
    raw_client(server.endpoint).put_object(Bucket=bucket, Key="a.txt", Body=b"v2 by someone")
    (tmp_path / "a.txt").unlink()
    rep = push(tmp_path, remote, "", "rwd")
    assert rep.deleted == 0 and rep.ok and any("changed remotely" in n for n in rep.notes)
    assert remote_tree(server.endpoint, bucket) == {"a.txt": b"v2 by someone"}


def test_pull_keeps_local_changes(server, bucket, tmp_path):
    remote = remote_for(server.endpoint, bucket)
    write_tree(tmp_path / "src", {"a.txt": b"v1", "b.txt": b"b1"})
    push(tmp_path / "src", remote)
    work = tmp_path / "work"
    pull(remote, work)
    (work / "a.txt").write_bytes(b"local edit")
    assert pull(remote, work).skipped == 2
    assert (work / "a.txt").read_bytes() == b"local edit"
    raw_client(server.endpoint).put_object(Bucket=bucket, Key="a.txt", Body=b"remote edit")
    rep = pull(remote, work)
    assert rep.failed == 1 and rep.failures[0].key == "a.txt"
    assert "kept local" in rep.failures[0].reason
    assert (work / "a.txt").read_bytes() == b"local edit"


def test_pull_adopts_identical_unsynced_file(server, bucket, tmp_path):
    remote = remote_for(server.endpoint, bucket)
    write_tree(tmp_path / "src", {"a.txt": b"same", "b.txt": b"remote"})
    push(tmp_path / "src", remote)
    write_tree(tmp_path / "work", {"a.txt": b"same", "b.txt": b"different local"})
    rep = pull(remote, tmp_path / "work")
    assert (rep.skipped, rep.completed, rep.failed) == (1, 0, 1)
    assert rep.failures[0].key == "b.txt"
    assert (tmp_path / "work/b.txt").read_bytes() == b"different local"
    assert manifest_keys(tmp_path / "work") == {"a.txt"}


def test_pull_delete_mirrors_remote_deletions(server, bucket, tmp_path):
    remote = remote_for(server.endpoint, bucket)
    write_tree(tmp_path / "src", {"a.txt": b"a", "b.txt": b"b"})
    push(tmp_path / "src", remote)
    pull(remote, tmp_path / "work")
    raw_client(server.endpoint).delete_object(Bucket=bucket, Key="a.txt")
    kept = pull(remote, tmp_path / "work")
    assert kept.deleted == 0 and (tmp_path / "work/a.txt").exists()
    rep = pull(remote, tmp_path / "work", delete=True)
    assert rep.deleted == 1 and not (tmp_path / "work/a.txt").exists()
    assert read_tree(tmp_path / "work") == {"b.txt": b"b"}


def test_large_object_multipart_round_trip(server, bucket, tmp_path):
    big = os.urandom(20 * MiB + 12345)
    write_tree(tmp_path / "a", {"model/weights.bin": big})
    remote = remote_for(
        server.endpoint, bucket, multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB
    )
    rep = push(tmp_path / "a", remote)
    assert rep.completed == 1 and rep.bytes_transferred == len(big)
    head = raw_client(server.endpoint).head_object(Bucket=bucket, Key="model/weights.bin")
    assert head["ETag"].strip('"').endswith("-5")  # really a multipart upload
    assert head["Metadata"]["gpulab-sha256"] == hashlib.sha256(big).hexdigest()
    rep = pull(remote, tmp_path / "b")
    assert rep.completed == 1 and rep.bytes_transferred == len(big)
    assert (tmp_path / "b/model/weights.bin").read_bytes() == big


def test_foreign_multipart_object_verified_by_etag(server, bucket, tmp_path):
    """An object uploaded by another tool (no gpulab metadata) in parts is verified by its
    multipart ETag, recomputed from the server's part size."""
    data = os.urandom(11 * MiB)
    (tmp_path / "src.bin").write_bytes(data)
    c = raw_client(server.endpoint)
    c.create_bucket(Bucket=bucket)
    from boto3.s3.transfer import TransferConfig

    c.upload_file(
        str(tmp_path / "src.bin"),
        bucket,
        "x.bin",
        Config=TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB),
    )
    remote = remote_for(server.endpoint, bucket, multipart_threshold=8 * MiB)
    rep = pull(remote, tmp_path / "out")
    assert rep.ok and rep.completed == 1
    assert (tmp_path / "out/x.bin").read_bytes() == data


def test_missing_bucket_created_on_pull(server, bucket, tmp_path):
    rep = pull(remote_for(server.endpoint, bucket), tmp_path / "out", "data")
    assert rep.ok and rep.objects_total == 0
    assert any("created" in n for n in rep.notes)
    raw_client(server.endpoint).head_bucket(Bucket=bucket)  # raises if it does not exist


@pytest.mark.parametrize("fault", ["flip", "cut", "short"])
@pytest.mark.parametrize("origin", ["gpulab", "plain", "crc32"])
def test_damaged_download_detected(server, bucket, tmp_path, fault, origin):
    """A corrupted or truncated body fails the object; the good local copy is kept."""
    remote = remote_for(server.endpoint, bucket)
    write_tree(tmp_path / "src", {"data.bin": b"version one " * 1000})
    push(tmp_path / "src", remote)
    work = tmp_path / "work"
    pull(remote, work)
    v2 = os.urandom(50_000)
    if origin == "gpulab":  # carries gpulab-sha256 metadata
        (tmp_path / "src/data.bin").write_bytes(v2)
        push(tmp_path / "src", remote)
    elif origin == "plain":  # no checksum at all: only the ETag (MD5) can verify it
        c = raw_client(server.endpoint, request_checksum_calculation="when_required")
        c.put_object(Bucket=bucket, Key="data.bin", Body=v2)
        assert "ChecksumCRC32" not in c.head_object(
            Bucket=bucket, Key="data.bin", ChecksumMode="ENABLED"
        )
    else:  # S3 CRC32 checksum, as boto3 adds by default
        raw_client(server.endpoint).put_object(Bucket=bucket, Key="data.bin", Body=v2)
    with FaultyProxy(server.endpoint, fault) as proxy:
        bad = pull(
            remote_for(proxy.endpoint, bucket, max_attempts=2),
            work,
            options=SyncOptions(attempts=2, backoff_s=0.01),
        )
        assert proxy.damaged >= 1
    assert (bad.failed, bad.completed) == (1, 0) and not bad.ok
    assert bad.failures[0].key == "data.bin"
    assert any(w in bad.failures[0].reason.lower() for w in ("checksum", "truncated", "cut short"))
    assert (work / "data.bin").read_bytes() == b"version one " * 1000
    assert not list(work.glob(".gpulab-sync-tmp-*"))
    good = pull(remote, work)
    assert good.completed == 1 and (work / "data.bin").read_bytes() == v2


def test_server_down_during_push_then_resume(tmp_path):
    files = {f"f{i:03d}.bin": os.urandom(2000) for i in range(150)}
    write_tree(tmp_path, files)
    before = read_tree(tmp_path)
    bucket = f"t-{uuid.uuid4().hex[:16]}"
    srv = MotoS3Server().start()
    try:
        remote = remote_for(srv.endpoint, bucket, max_attempts=2, connect_timeout=1, read_timeout=3)
        stopped = []

        def stop_midway(p: SyncProgress) -> None:
            if p.completed >= 30 and not stopped:
                srv.stop()
                stopped.append(p.completed)

        rep = push(
            tmp_path,
            remote,
            "ws",
            "rw",
            progress=stop_midway,
            options=SyncOptions(workers=4, progress_interval_s=0),
        )
        assert stopped, "the server was never stopped"
        assert not rep.ok and rep.failed > 0
        assert rep.completed + rep.failed == 150
        assert rep.completed < 150
        assert any("unreachable" in f.reason or "connect" in f.reason.lower() for f in rep.failures)
        assert rep.elapsed_s < 60
        assert read_tree(tmp_path) == before  # local data untouched
        synced = manifest_keys(tmp_path)
        assert len(synced) == rep.completed
        assert not synced & {f.key for f in rep.failures}

        srv.start()  # same port; moto kept what it had received
        on_server = set(remote_tree(srv.endpoint, bucket))
        assert synced <= on_server  # the manifest only records what the server has
        again = push(tmp_path, remote, "ws", "rw")
        assert again.ok and again.completed == rep.failed and again.skipped == rep.completed
        assert remote_tree(srv.endpoint, bucket) == {f"ws/{k}": v for k, v in files.items()}
        assert len(manifest_keys(tmp_path)) == 150
    finally:
        srv.stop()


def test_progress_and_report_are_json(server, bucket, tmp_path):
    write_tree(tmp_path, sample_files(30))
    events: list[SyncProgress] = []
    rep = push(
        tmp_path,
        remote_for(server.endpoint, bucket),
        progress=events.append,
        options=SyncOptions(progress_interval_s=0),
    )
    assert len(events) >= 2
    processed = [e.processed for e in events]
    assert processed == sorted(processed) and events[-1].processed == 30
    assert events[-1].completed == rep.completed == 30
    assert all(e.objects_total == 30 for e in events)
    decoded = json.loads(json.dumps(events[-1].to_dict()))
    assert decoded["event"] == "progress" and decoded["bytes_transferred"] == rep.bytes_transferred
    report = json.loads(rep.to_json())
    assert report["event"] == "report" and report["ok"] is True and report["elapsed_s"] >= 0


def test_unsafe_key_is_reported_not_written(server, bucket, tmp_path):
    c = raw_client(server.endpoint)
    c.create_bucket(Bucket=bucket)
    c.put_object(Bucket=bucket, Key="a//b.txt", Body=b"x")
    c.put_object(Bucket=bucket, Key="ok.txt", Body=b"y")
    rep = pull(remote_for(server.endpoint, bucket), tmp_path)
    assert (rep.completed, rep.failed) == (1, 1)
    assert rep.failures[0].key == "a//b.txt" and "segment" in rep.failures[0].reason
    assert read_tree(tmp_path) == {"ok.txt": b"y"}


def test_credentials_never_in_reports_or_logs(server, bucket, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    write_tree(tmp_path / "a", sample_files(3))
    remote = remote_for(server.endpoint, bucket)
    reports = [push(tmp_path / "a", remote), pull(remote, tmp_path / "b")]
    # a failing run too: its error messages must not leak anything either
    reports.append(pull(remote_for("http://127.0.0.1:9", bucket, max_attempts=1), tmp_path / "c"))
    assert not reports[-1].ok
    texts = [r.to_json() for r in reports] + [
        caplog.text,
        repr(remote),
        repr(CREDS),
        str(CREDS),
        (tmp_path / "a" / MANIFEST_NAME).read_text(),
    ]
    for text in texts:
        assert TEST_SECRET_KEY not in text
    for text in texts[:3] + texts[4:]:
        assert TEST_ACCESS_KEY not in text


def upload_foreign_multipart(endpoint: str, bucket: str, path: Path, key: str) -> None:
    """Upload as another tool would: in 5 MiB parts, without gpulab's SHA-256 metadata."""
    from boto3.s3.transfer import TransferConfig

    c = raw_client(endpoint)
    c.create_bucket(Bucket=bucket)
    cfg = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    c.upload_file(str(path), bucket, key, Config=cfg)


def test_foreign_multipart_object_in_one_get_verified_by_etag(server, bucket, tmp_path):
    """Below the multipart threshold a foreign multipart object comes in one GET; its part
    MD5s are computed as it streams (part size from the server) and checked against the ETag."""
    data = os.urandom(11 * MiB + 7)
    (tmp_path / "src.bin").write_bytes(data)
    upload_foreign_multipart(server.endpoint, bucket, tmp_path / "src.bin", "x.bin")
    rep = pull(remote_for(server.endpoint, bucket), tmp_path / "out")
    assert rep.ok and rep.completed == 1
    assert (tmp_path / "out/x.bin").read_bytes() == data
    with FaultyProxy(server.endpoint, "flip") as proxy:
        bad = pull(
            remote_for(proxy.endpoint, bucket, max_attempts=1),
            tmp_path / "other",
            options=SyncOptions(attempts=1),
        )
        assert proxy.damaged >= 1
    assert (bad.failed, bad.completed) == (1, 0)
    assert "multipart etag" in bad.failures[0].reason.lower()
    assert not (tmp_path / "other/x.bin").exists()


@pytest.mark.parametrize("origin", ["gpulab", "foreign"])
def test_damaged_ranged_download_detected(server, bucket, tmp_path, origin):
    """Ranged downloads (above the threshold) are verified too: a flipped byte in one part
    fails the object."""
    data = os.urandom(12 * MiB)
    settings = {"multipart_threshold": 5 * MiB, "multipart_chunksize": 5 * MiB}
    if origin == "gpulab":
        write_tree(tmp_path / "src", {"big.bin": data})
        assert push(tmp_path / "src", remote_for(server.endpoint, bucket, **settings)).ok
    else:
        (tmp_path / "big.bin").write_bytes(data)
        upload_foreign_multipart(server.endpoint, bucket, tmp_path / "big.bin", "big.bin")
    with FaultyProxy(server.endpoint, "flip") as proxy:
        bad = pull(
            remote_for(proxy.endpoint, bucket, max_attempts=1, **settings),
            tmp_path / "out",
            options=SyncOptions(attempts=1),
        )
        assert proxy.damaged >= 1
    assert (bad.failed, bad.completed) == (1, 0) and "checksum" in bad.failures[0].reason
    assert not list((tmp_path / "out").glob("*.bin"))
    good = pull(remote_for(server.endpoint, bucket, **settings), tmp_path / "out")
    assert good.completed == 1 and (tmp_path / "out/big.bin").read_bytes() == data


@pytest.mark.parametrize("size", [1000, 6 * MiB])
def test_upload_of_changed_content_detected(server, bucket, tmp_path, size):
    """If the file is not what was hashed (it changed in between), the upload fails."""
    remote = remote_for(
        server.endpoint, bucket, multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB
    )
    remote.ensure_bucket()
    src = tmp_path / "f.bin"
    src.write_bytes(os.urandom(size))
    part_size = remote.part_size_for(size)
    digest = hash_file(src, md5=part_size is None, part_size=part_size)
    with open(src, "r+b") as f:  # same size, one byte different
        f.seek(size // 2)
        byte = f.read(1)
        f.seek(size // 2)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(IntegrityError, match="changed during the upload"):
        remote.upload("f.bin", src, digest)


def put_many(endpoint: str, bucket: str, keys: list[str]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    c = raw_client(endpoint, max_pool_connections=16)
    c.create_bucket(Bucket=bucket)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: c.put_object(Bucket=bucket, Key=k, Body=b"x"), keys))


def test_purge_deletes_everything_under_the_prefix(server, bucket, monkeypatch):
    inside = [f"data/run{i % 3}/f{i}.bin" for i in range(40)] + ["data/marker/"]
    outside = ["data-old/keep.bin", "datax", "other/data/keep.bin", "data"]
    put_many(server.endpoint, bucket, inside + outside)
    remote = remote_for(server.endpoint, bucket)
    sizes: list[int] = []
    real = remote.client.delete_objects

    def spy(**kwargs):
        sizes.append(len(kwargs["Delete"]["Objects"]))
        return real(**kwargs)

    monkeypatch.setattr(remote.client, "delete_objects", spy)
    monkeypatch.setattr("gpulab.datasync.purging.DELETE_BATCH", 7)
    events: list[SyncProgress] = []
    rep = purge(
        remote, "/data/", progress=events.append, options=SyncOptions(progress_interval_s=0)
    )
    assert rep.ok and (rep.objects_total, rep.deleted, rep.failed) == (41, 41, 0)
    assert rep.operation == "purge" and rep.prefix == "data/"
    assert sorted(sizes) == [6] + [7] * 5  # batched DeleteObjects calls
    assert events[-1].deleted == 41 == events[-1].processed
    assert set(remote_tree(server.endpoint, bucket)) == set(outside)
    again = purge(remote, "data")
    assert again.ok and (again.objects_total, again.deleted) == (0, 0)


def test_purge_batches_of_at_most_1000_keys(server, bucket, monkeypatch):
    keys = [f"p/{i:04d}" for i in range(1003)]
    put_many(server.endpoint, bucket, keys)
    remote = remote_for(server.endpoint, bucket)
    sizes: list[int] = []
    real = remote.client.delete_objects

    def spy(**kwargs):
        sizes.append(len(kwargs["Delete"]["Objects"]))
        return real(**kwargs)

    monkeypatch.setattr(remote.client, "delete_objects", spy)
    rep = purge(remote, "p")
    assert rep.ok and rep.deleted == 1003 and sorted(sizes) == [3, 1000]
    assert remote_tree(server.endpoint, bucket) == {}
    with pytest.raises(ValueError, match="at most 1000"):
        remote.delete_many([f"k{i}" for i in range(1001)])


@pytest.mark.parametrize("prefix", ["", "/", "//"])
def test_purge_refuses_an_empty_prefix(server, bucket, prefix):
    put_many(server.endpoint, bucket, ["a.txt"])
    with pytest.raises(ValueError, match="empty prefix"):
        purge(remote_for(server.endpoint, bucket), prefix)
    assert set(remote_tree(server.endpoint, bucket)) == {"a.txt"}


def test_purge_reports_unreachable_store(bucket):
    remote = remote_for("http://127.0.0.1:9", bucket, max_attempts=1)
    rep = purge(remote, "data")
    assert not rep.ok and rep.failed == 1 and "cannot list" in rep.failures[0].reason


AWKWARD = {
    "with space/a b.txt": b"space",
    "plus+sign/x+y.bin": b"plus",
    "percent%20literal/100%.txt": b"percent",
    "unicode/\u00e9t\u00e9 \u65e5\u672c.txt": b"unicode",
    "query?hash#amp&eq=/f.txt": b"query",
    "tilde~/semi;colon,comma'quote.txt": b"punct",
}


def test_awkward_key_names_round_trip(server, bucket, tmp_path):
    """Keys needing URL and XML escaping survive push, listing and pull, and the store holds
    exactly those keys (as boto3 itself lists them)."""
    write_tree(tmp_path / "a", AWKWARD)
    remote = remote_for(server.endpoint, bucket)
    pushed = push(tmp_path / "a", remote, "p", "rw")
    assert (pushed.completed, pushed.failed) == (len(AWKWARD), 0), pushed.failures
    assert remote_tree(server.endpoint, bucket) == {f"p/{k}": v for k, v in AWKWARD.items()}
    listed = {o.key: o.size for o in remote.list("p/")}
    assert listed == {f"p/{k}": len(v) for k, v in AWKWARD.items()}
    pulled = pull(remote_for(server.endpoint, bucket), tmp_path / "b", "p")
    assert (pulled.completed, pulled.failed) == (len(AWKWARD), 0), pulled.failures
    assert read_tree(tmp_path / "b") == AWKWARD


def test_pull_keeps_the_stored_bytes_of_a_content_encoded_object(server, bucket, tmp_path):
    """An object stored gzip-compressed with ``Content-Encoding: gzip`` is pulled as stored
    (an HTTP client that decodes it would fail the size and checksum checks)."""
    import gzip

    stored = gzip.compress(b"col1,col2\n" * 5000)
    c = raw_client(server.endpoint)
    c.create_bucket(Bucket=bucket)
    c.put_object(Bucket=bucket, Key="data.csv.gz", Body=stored, ContentEncoding="gzip")
    rep = pull(remote_for(server.endpoint, bucket), tmp_path / "w")
    assert (rep.completed, rep.failed) == (1, 0), rep.failures
    assert (tmp_path / "w/data.csv.gz").read_bytes() == stored


def test_put_of_a_file_that_shrinks_is_refused(server, bucket, tmp_path):
    """The size announced is the size hashed: a file cut short meanwhile fails the object
    at once (no request left hanging for the missing bytes)."""
    remote = remote_for(server.endpoint, bucket)
    remote.ensure_bucket()
    src = tmp_path / "f.bin"
    src.write_bytes(os.urandom(4000))
    digest = remote.digest(src, 4000)
    src.write_bytes(src.read_bytes()[:1000])
    with pytest.raises(IntegrityError, match="changed during the upload"):
        remote.upload("f.bin", src, digest)
    with pytest.raises(Exception, match="NoSuchKey|Not Found|404"):
        raw_client(server.endpoint).head_object(Bucket=bucket, Key="f.bin")


def test_errors_are_reported_with_the_servers_code(server, tmp_path):
    """A GET of a missing object and a listing of a missing bucket come back as the S3
    error code, not as a crash."""
    missing = f"t-{uuid.uuid4().hex[:16]}"
    remote = remote_for(server.endpoint, missing)
    with pytest.raises(Exception) as info:
        list(remote.list(""))
    assert "NoSuchBucket" in str(info.value)
    raw_client(server.endpoint).create_bucket(Bucket=missing)
    from gpulab.datasync.models import RemoteObject

    with pytest.raises(Exception) as info:
        remote.download(RemoteObject("nope.bin", 10, "0" * 32), tmp_path / "x")
    assert "NoSuchKey" in str(info.value)


def test_uploads_skip_md5_once_the_server_returns_the_sha256_it_verified(server, bucket, tmp_path):
    """S3 (here: a proxy doing what S3 does) checks the SHA-256 sent with a PUT and returns
    it; after the first such answer the MD5, needed only to check moto's ETag, is skipped."""
    files = sample_files(12)
    write_tree(tmp_path / "a", files)
    probe = tmp_path / "a" / "dir0/sub/file0.bin"
    with FaultyProxy(server.endpoint, verify_sha256=True) as proxy:
        remote = remote_for(proxy.endpoint, bucket)
        assert remote.digest(probe, probe.stat().st_size).md5 is not None  # nothing known yet
        rep = push(tmp_path / "a", remote, options=SyncOptions(workers=1))
        assert rep.ok and rep.completed == 12 and proxy.bad_digests == 0
        assert remote.server_verifies_sha256
        assert remote.digest(probe, probe.stat().st_size).md5 is None
        (tmp_path / "a/late.bin").write_bytes(b"late" * 1000)
        assert push(tmp_path / "a", remote).completed == 1
    assert remote_tree(server.endpoint, bucket) == {**files, "late.bin": b"late" * 1000}
    # moto alone returns no checksum: a new remote keeps hashing the MD5
    plain = remote_for(server.endpoint, bucket)
    push(tmp_path / "a", plain, options=SyncOptions(workers=1))
    assert not plain.server_verifies_sha256
    assert plain.digest(probe, probe.stat().st_size).md5 is not None


def test_a_server_refusing_the_sha256_fails_the_object(server, bucket, tmp_path):
    """A body that does not match the SHA-256 sent is refused by the server (BadDigest)."""
    write_tree(tmp_path / "a", {"f.bin": b"original"})
    with FaultyProxy(server.endpoint, verify_sha256=True) as proxy:
        remote = remote_for(proxy.endpoint, bucket)
        remote.ensure_bucket()
        src = tmp_path / "a/f.bin"
        digest = remote.digest(src, src.stat().st_size)
        src.write_bytes(b"changed!")  # same size, other content, after hashing
        with pytest.raises(ClientError, match="BadDigest"):
            remote.upload("f.bin", src, digest)
        assert proxy.bad_digests == 1
    assert "Contents" not in raw_client(server.endpoint).list_objects_v2(Bucket=bucket)


def test_upload_without_md5_to_a_server_returning_no_checksum_reads_again(server, bucket, tmp_path):
    """A digest without MD5 (the server returned a checksum before, not now): the file is
    read again to check the ETag, and a change since it was hashed fails the object."""
    remote = remote_for(server.endpoint, bucket)
    remote.ensure_bucket()
    src = tmp_path / "f.bin"
    src.write_bytes(b"content")
    got = remote.upload("f.bin", src, hash_file(src))
    assert got.etag == hashlib.md5(b"content").hexdigest()
    stale = hash_file(src)
    src.write_bytes(b"CONTENT")  # same size, changed after hashing
    with pytest.raises(IntegrityError, match="changed during the upload"):
        remote.upload("f.bin", src, stale)
