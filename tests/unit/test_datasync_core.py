"""Unit tests of the sync engine's pure parts: keys, manifest, digests, credentials, reports."""

from __future__ import annotations

import base64
import hashlib
import json
import os

import pytest

from gpulab.datasync.credentials import Credentials, CredentialsError
from gpulab.datasync.hashing import hash_file
from gpulab.datasync.localtree import LocalRoot, key_to_relpath, normalize_prefix
from gpulab.datasync.manifest import MANIFEST_NAME, Entry, Locked, Manifest, locked
from gpulab.datasync.models import Failure, SyncReport, UnsafeKey


@pytest.mark.parametrize(("raw", "norm"), [("", ""), ("/", ""), ("a", "a/"), ("/a/b/", "a/b/")])
def test_normalize_prefix(raw, norm):
    assert normalize_prefix(raw) == norm


@pytest.mark.parametrize("raw", ["a//b", "a/../b", "./a"])
def test_normalize_prefix_rejects(raw):
    with pytest.raises(ValueError):
        normalize_prefix(raw)


def test_key_to_relpath():
    assert key_to_relpath("p/a/b.txt", "p/") == "a/b.txt"
    for bad in ["p/../x", "p/a//b", "p/", "p/./a", "q/a", "p/.gpulab-sync-manifest.json"]:
        with pytest.raises(UnsafeKey):
            key_to_relpath(bad, "p/")


def test_scan_skips_engine_files_and_symlinks(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d/a.txt").write_bytes(b"abc")
    (tmp_path / MANIFEST_NAME).write_text("{}")
    (tmp_path / "d/.gpulab-sync-tmp-1").write_bytes(b"partial")
    (tmp_path / "link").symlink_to(tmp_path / "d/a.txt")
    with LocalRoot(tmp_path) as root:
        files = list(root.scan("pre/", []))
    assert [(f.key, f.rel, f.size) for f in files] == [("pre/d/a.txt", "d/a.txt", 3)]


def test_hash_file_digests(tmp_path):
    data = os.urandom(3 * 1024 + 5)
    path = tmp_path / "f"
    path.write_bytes(data)
    d = hash_file(path, md5=True, part_size=1024)
    assert d.size == len(data)
    assert d.sha256 == hashlib.sha256(data).hexdigest()
    assert d.md5 == hashlib.md5(data).hexdigest()
    parts = [hashlib.md5(data[i : i + 1024]).digest() for i in range(0, len(data), 1024)]
    assert d.multipart_etag == hashlib.md5(b"".join(parts)).hexdigest() + "-4"


def test_manifest_round_trip_and_identity(tmp_path):
    root = LocalRoot(tmp_path)
    m = Manifest.load(root, "s3://x/b", "p/")
    m.set("p/a", Entry(1, "etag", "sha", 123))
    m.save()
    assert not list(tmp_path.glob(f"{MANIFEST_NAME}.tmp*"))
    again = Manifest.load(root, "s3://x/b", "p/")
    assert again.get("p/a") == Entry(1, "etag", "sha", 123) and again.reset_reason is None
    other = Manifest.load(root, "s3://y/b", "p/")
    assert other.entries == {} and "another remote" in (other.reset_reason or "")
    assert Manifest.load(root, "s3://x/b", "q/").entries == {}
    (tmp_path / MANIFEST_NAME).write_text("{not json")
    broken = Manifest.load(root, "s3://x/b", "p/")
    assert broken.entries == {} and "unreadable" in (broken.reset_reason or "")


def test_lock_is_exclusive(tmp_path):
    root = LocalRoot(tmp_path)
    with locked(root), pytest.raises(Locked), locked(root):
        pass
    with locked(root):  # released again
        pass


def test_credentials_from_env_and_repr():
    c = Credentials.from_env({"AWS_ACCESS_KEY_ID": "AKIAXXX", "AWS_SECRET_ACCESS_KEY": "s3cr3t"})
    assert c is not None and c.secret_access_key == "s3cr3t"
    assert "s3cr3t" not in repr(c) and "AKIAXXX" not in repr(c) and "s3cr3t" not in str(c)
    assert Credentials.from_env({}) is None
    with pytest.raises(CredentialsError) as exc:
        Credentials.from_env({"AWS_SECRET_ACCESS_KEY": "s3cr3t"})
    assert "s3cr3t" not in str(exc.value)


def test_credentials_from_files(tmp_path):
    ini = tmp_path / "creds.ini"
    ini.write_text("[default]\naws_access_key_id = AK1\naws_secret_access_key = SK1\n")
    assert Credentials.from_file(ini) == Credentials("AK1", "SK1")
    env = tmp_path / "creds.env"
    env.write_text("# comment\nAWS_ACCESS_KEY_ID=AK2\nAWS_SECRET_ACCESS_KEY='SK2'\n")
    assert Credentials.from_file(env) == Credentials("AK2", "SK2")
    bad = tmp_path / "bad"
    bad.write_text("AWS_SECRET_ACCESS_KEY=only-secret\n")
    with pytest.raises(CredentialsError) as exc:
        Credentials.from_file(bad)
    assert "only-secret" not in str(exc.value)
    with pytest.raises(CredentialsError, match="cannot read"):
        Credentials.from_file(tmp_path / "missing")


def test_report_json():
    r = SyncReport("push", "b", "p/", "rw", objects_total=2, processed=2, completed=1, failed=1)
    r.failures.append(Failure("p/x", "boom"))
    data = json.loads(r.to_json())
    assert data["event"] == "report" and data["ok"] is False
    assert data["failures"] == [{"key": "p/x", "reason": "boom"}]


def test_stream_hasher_crc32():
    import zlib

    from gpulab.datasync.hashing import StreamHasher

    data = os.urandom(300_000)
    h = StreamHasher(crc32=True)
    for i in range(0, len(data), 65_536):  # any chunking gives the same CRC
        h.update(data[i : i + 65_536])
    d = h.digest()
    assert d.crc32 == zlib.crc32(data)
    assert base64.b64decode(d.crc32_b64) == zlib.crc32(data).to_bytes(4, "big")
    assert d.sha256 == hashlib.sha256(data).hexdigest()
    assert StreamHasher().digest().crc32_b64 is None


def test_sized_body_stops_at_its_size_and_rewinds(tmp_path):
    from gpulab.datasync.s3 import SizedBody

    data = os.urandom(5000)
    (tmp_path / "f").write_bytes(data + b"grown later")
    with open(tmp_path / "f", "rb") as f:
        body = SizedBody(f, 5000)
        assert body.read(3000) == data[:3000] and body.tell() == 3000
        body.seek(0)  # a retry starts again from the start
        assert body.read() == data and body.read() == b""  # never past the size announced
        assert body.tell() == 5000
        with pytest.raises(OSError):
            body.seek(10)


def test_sized_body_refuses_a_file_shorter_than_announced(tmp_path):
    from gpulab.datasync.s3 import ChangedWhileSending, SizedBody

    (tmp_path / "f").write_bytes(b"x" * 100)
    with open(tmp_path / "f", "rb") as f:
        body = SizedBody(f, 1000)
        assert body.read(100) == b"x" * 100
        with pytest.raises(ChangedWhileSending, match="ended after 100 of 1000 bytes"):
            body.read(100)


def test_default_hashers_follow_the_cpus_the_process_may_use():
    """One per CPU of the process's affinity (a container's cpuset), not of the host."""
    import subprocess
    import sys

    code = (
        "import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); "
        "from gpulab.datasync import SyncOptions; print(SyncOptions().hashers)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"
    from gpulab.datasync import SyncOptions

    assert SyncOptions().hashers == len(os.sched_getaffinity(0))
