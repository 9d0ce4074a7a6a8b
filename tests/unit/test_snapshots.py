"""Workspace snapshots: the rules as data (gpulab.snapshots), the store's operations on the
embedded filesystem store (gpulab.data.snapshots: shared blobs, the quota, restore, delete),
and which notebooks a snapshot may be restored into (gpulab.notebooks.snapshots)."""

from __future__ import annotations

import hashlib
import json

import pytest

from gpulab import snapshots as rules
from gpulab.data import snapshots as store
from gpulab.datasync.filesystem import FilesystemRemote
from gpulab.datasync.hashing import hash_file
from gpulab.db import Database
from gpulab.lifecycle import NotebookState as S
from gpulab.notebooks import snapshots as domain
from gpulab.notebooks.records import NotebookRecords
from gpulab.volumes import ObjectStore

from ..conftest import run_async
from ..support.fake_runtime import FakeRuntime
from ..support.notebooks import settings_for

BUCKET = "gpulab-workspaces"
WS = "workspaces/ann/nb/"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- the rules --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "A", "-a", "a/b", "a" * 64, None, 3, "a\n"])
def test_names_are_refused_naming_the_field(name):
    with pytest.raises(rules.SnapshotError) as e:
        rules.snapshot_name(name)
    assert e.value.field == "name" and "1 to 63 lowercase" in str(e.value)


def test_keys_stay_under_the_users_own_prefix():
    assert rules.manifest_key("ann", "v1") == "snapshots/ann/manifests/v1.json"
    assert rules.blob_key("ann", "a" * 64) == f"snapshots/ann/blobs/{'a' * 64}"
    for user in ("", ".", "..", "a/b", "a\x00"):
        with pytest.raises(rules.SnapshotError):
            rules.user_root(user)
    with pytest.raises(ValueError):
        rules.blob_key("ann", "../x")


def test_snapshots_are_off_where_a_workspace_could_share_their_keys():
    assert rules.unavailable("workspaces") is None
    assert "workspace store" in rules.unavailable(None)
    for root in ("", "/", "snapshots", "snapshots/x"):
        assert "snapshots are off" in rules.unavailable(root)


def test_a_manifest_read_back_is_checked():
    good = rules.Snapshot("v1", "t", {"kind": "notebook"}, {"a/b.txt": ("0" * 64, 3)})
    assert rules.Snapshot.from_json(json.loads(json.dumps(good.to_json()))) == good
    for key in ("../x", "/x", "a//b", "a/./b", ""):
        bad = {**good.to_json(), "entries": {key: {"sha256": "0" * 64, "size": 1}}}
        with pytest.raises(ValueError, match="bad key"):
            rules.Snapshot.from_json(bad)
    bad = {**good.to_json(), "entries": {"a": {"sha256": "../../x", "size": 1}}}
    with pytest.raises(ValueError, match="bad digest"):
        rules.Snapshot.from_json(bad)
    with pytest.raises(ValueError):
        rules.Snapshot.from_json({"version": 2})


def test_plans():
    snap = rules.Snapshot(
        "v1", "t", {}, {"a": ("1" * 64, 5), "b": ("2" * 64, 7), "c": ("1" * 64, 5)}
    )
    assert rules.new_blobs(snap.objects, {"1" * 64: 5}) == {"2" * 64: 7}
    plan = rules.restore_plan(snap, {"a": ("1" * 64, 0o644), "b": ("9" * 64, None), "d": None})
    assert plan.copy == (("b", "2" * 64), ("c", "1" * 64))
    assert plan.delete == ("d",) and plan.kept == 1
    # a mode the snapshot kept counts: the same content with another mode is copied again
    moded = rules.Snapshot("v1", "t", {}, {"a": ("1" * 64, 5)}, {"a": 0o755})
    assert rules.restore_plan(moded, {"a": ("1" * 64, 0o644)}).copy == (("a", "1" * 64),)
    assert rules.restore_plan(moded, {"a": ("1" * 64, 0o755)}).copy == ()
    other = rules.Snapshot("v2", "t", {}, {"x": ("2" * 64, 7)})
    assert rules.unreferenced({"1" * 64, "2" * 64, "3" * 64}, [other]) == {"1" * 64, "3" * 64}
    assert rules.quota_refusal(10, 5, 15) is None and rules.quota_refusal(10, 5, None) is None
    assert "over your snapshot quota of 14 bytes" in rules.quota_refusal(10, 5, 14)
    assert rules.count_refusal(19, 20) is None
    assert "20 snapshots" in rules.count_refusal(20, 20)


# --- the store (embedded filesystem store) ----------------------------------------------------


class Store:
    def __init__(self, tmp_path):
        self.root = tmp_path / "objects"
        self.remote = FilesystemRemote(self.root, BUCKET)
        self.objects = store.objects_of(
            ObjectStore(name="local", kind="filesystem", root=str(self.root)), BUCKET
        )
        self.tmp = tmp_path

    def put(self, key: str, data: bytes, sidecar: bool = True, mode: int | None = None) -> None:
        src = self.tmp / "src"
        src.write_bytes(data)
        self.remote.upload(key, src, hash_file(src), mode)
        if not sidecar:  # an object the sync did not write: its digest is read from it
            (self.root / ".gpulab-meta" / BUCKET / f"{key}.json").unlink()

    def read(self, prefix: str) -> dict[str, bytes]:
        return {
            o.key[len(prefix) :]: (self.root / BUCKET / o.key).read_bytes()
            for o in self.remote.list(prefix)
        }

    def blobs(self, user: str = "ann") -> set[str]:
        return {o.key.rsplit("/", 1)[1] for o in self.remote.list(f"snapshots/{user}/blobs/")}


def take(st, name, prefix=WS, quota=None, cap=20, user="ann"):
    return store.take(st.objects, user, name, prefix, {"kind": "notebook"}, quota, cap)


def test_snapshots_share_blobs_count_restore_and_delete(tmp_path):
    st = Store(tmp_path)
    st.put(WS + "notes.txt", b"v1 notes")
    st.put(WS + "data/big.bin", b"x" * 1000)
    st.put(WS + "copy.bin", b"x" * 1000, sidecar=False)  # same content: one blob
    first = take(st, "v1")
    assert (first["objects"], first["bytes"], first["new_bytes"]) == (3, 2008, 1008)
    assert st.blobs() == {sha(b"v1 notes"), sha(b"x" * 1000)}

    # the next snapshot copies only what changed
    st.put(WS + "notes.txt", b"v2 notes!")
    st.put(WS + "new.txt", b"new")
    second = take(st, "v2")
    assert second["new_bytes"] == len(b"v2 notes!") + 3
    listed = store.listing(st.objects, "ann")
    assert [s["name"] for s in listed["snapshots"]] == ["v1", "v2"]
    assert listed["stored_bytes"] == 1008 + 9 + 3

    # refusals: a name taken, the count, the quota (nothing copied)
    with pytest.raises(store.SnapshotRefused, match="already have a snapshot named v1") as e:
        take(st, "v1")
    assert (e.value.status, e.value.field) == (409, "name")
    with pytest.raises(store.SnapshotRefused, match="2 snapshots"):
        take(st, "v3", cap=2)
    st.put(WS + "huge.bin", b"h" * 5000)
    before = st.blobs()
    with pytest.raises(store.SnapshotRefused, match="over your snapshot quota") as e:
        take(st, "v3", quota=2000)
    assert e.value.status == 409 and st.blobs() == before

    # restore v1 into a workspace that holds other things: exactly v1's files
    other = "workspaces/ann/other/"
    st.put(other + "notes.txt", b"v1 notes")  # already right: kept
    st.put(other + "stray.txt", b"gone after")
    done = store.restore(st.objects, "ann", "v1", other)
    assert (done["copied"], done["deleted"], done["unchanged"]) == (2, 1, 1)
    assert st.read(other) == {
        "notes.txt": b"v1 notes",
        "data/big.bin": b"x" * 1000,
        "copy.bin": b"x" * 1000,
    }
    # a restored object carries its digest for the next pull to verify
    meta = json.loads((st.root / ".gpulab-meta" / BUCKET / (other + "copy.bin.json")).read_text())
    assert meta == {"size": 1000, "sha256": sha(b"x" * 1000)}

    # deleting v1 frees only what v2 does not share
    gone = store.remove(st.objects, "ann", "v1")
    assert gone["freed_bytes"] == len(b"v1 notes")
    assert st.blobs() == {sha(b"x" * 1000), sha(b"v2 notes!"), sha(b"new")}
    with pytest.raises(store.SnapshotRefused, match="no snapshot v1 for ann") as e:
        store.one(st.objects, "ann", "v1")
    assert e.value.status == 404
    assert store.one(st.objects, "ann", "v2")["objects"] == 4


def test_modes_are_kept_per_file_and_links_left_out(tmp_path):
    st = Store(tmp_path)
    st.put(WS + "run.sh", b"#!/bin/sh\n", mode=0o755)
    st.put(WS + "notes.sh", b"#!/bin/sh\n", mode=0o644)  # the same content: one blob
    st.remote.upload_link(WS + "link", b"run.sh")  # a home's kind of object: not taken
    taken = take(st, "v1")
    assert taken["objects"] == 2 and len(st.blobs()) == 1
    other = "workspaces/ann/other/"
    st.put(other + "run.sh", b"#!/bin/sh\n", mode=0o644)  # its content, not its mode
    st.put(other + "notes.sh", b"#!/bin/sh\n", mode=0o644)  # already as it was
    done = store.restore(st.objects, "ann", "v1", other)
    assert (done["copied"], done["unchanged"]) == (1, 1)

    def mode(key):
        return json.loads((st.root / ".gpulab-meta" / BUCKET / f"{key}.json").read_text())["mode"]

    assert (mode(other + "run.sh"), mode(other + "notes.sh")) == (0o755, 0o644)


def test_users_are_isolated(tmp_path):
    st = Store(tmp_path)
    st.put(WS + "a.txt", b"ann's")
    take(st, "v1")
    assert store.listing(st.objects, "bob") == {"snapshots": [], "stored_bytes": 0}
    with pytest.raises(store.SnapshotRefused) as e:
        store.restore(st.objects, "bob", "v1", "workspaces/bob/nb/")
    assert e.value.status == 404
    with pytest.raises(store.SnapshotRefused) as e:
        store.listing(st.objects, "..")
    assert (e.value.status, e.value.field) == (400, "user")


def test_a_workspace_that_changes_while_copied_is_refused(tmp_path, monkeypatch):
    st = Store(tmp_path)
    st.put(WS + "a.txt", b"before")
    real = store.FilesystemObjects.describe
    monkeypatch.setattr(
        store.FilesystemObjects, "describe", lambda self, k, e: (sha(b"other"), None, False)
    )
    with pytest.raises(store.SnapshotRefused, match="changed while it was read") as e:
        take(st, "v1")
    assert e.value.status == 409
    monkeypatch.setattr(store.FilesystemObjects, "describe", real)
    assert store.listing(st.objects, "ann")["snapshots"] == []


# --- which notebooks ------------------------------------------------------------------------


def test_restore_goes_into_a_new_stopped_or_deleted_notebook_only(tmp_path):
    settings = settings_for(tmp_path, workspace=True)
    records = NotebookRecords(Database(settings.database_url), "t")
    rt = FakeRuntime()
    root = tmp_path / "objects"
    src = tmp_path / "f"
    src.write_bytes(b"hello")
    FilesystemRemote(root, settings.workspace_bucket).upload(
        "workspaces/alice/nb/f.txt", src, hash_file(src)
    )
    records.transition("alice", "nb", S.STARTING)
    records.transition("alice", "nb", S.RUNNING)

    async def go(fn, *args):
        return await fn(settings, *args)

    taken = run_async(go(domain.take, records, "alice", {"name": "v1", "notebook": "nb"}))
    assert taken["source"] == {"kind": "notebook", "notebook": "nb", "state": "RUNNING"}
    with pytest.raises(domain.SnapshotRefused) as e:
        run_async(go(domain.take, records, "alice", {"name": "v2", "notebook": "none"}))
    assert (e.value.status, e.value.field) == (404, "notebook")
    with pytest.raises(domain.SnapshotRefused) as e:
        run_async(go(domain.take, records, "alice", {"name": "v2", "other": 1}))
    assert e.value.status == 400
    for server in (".home", "..", "a/b", 3):  # homes live at <root>/<user>/.home/
        with pytest.raises(domain.SnapshotRefused) as e:
            run_async(go(domain.restore, records, rt, "alice", "v1", {"notebook": server}))
        assert (e.value.status, e.value.field) == (400, "notebook")

    with pytest.raises(domain.SnapshotRefused, match="nb is RUNNING") as e:
        run_async(go(domain.restore, records, rt, "alice", "v1", {"notebook": "nb"}))
    assert e.value.status == 409
    # a new notebook: its stored workspace only
    done = run_async(go(domain.restore, records, rt, "alice", "v1", {"notebook": "fresh"}))
    assert done["copied"] == 1 and not rt.called("remove_volume")
    # a STOPPED one: its local copy goes, so that its start pulls the restored workspace
    records.transition("alice", "nb", S.STOPPING)
    records.transition("alice", "nb", S.STOPPED)
    run_async(go(domain.restore, records, rt, "alice", "v1", {"notebook": "nb"}))
    assert [c.args[0] for c in rt.called("remove_volume")] == ["t-nb-alice--nb-workspace"]


# --- a job's output volume --------------------------------------------------------------------


class JobsOf:
    """The one read the jobs' snapshot makes of the job records."""

    def __init__(self, **jobs):
        self.jobs = jobs

    def get(self, job_id, history=True):
        return self.jobs.get(job_id)


def test_a_jobs_output_volume_on_the_workspace_store(tmp_path):
    from traitlets.config import Config

    from gpulab.jobs import snapshots as job_snapshots
    from gpulab.settings import GpulabSettings

    root = tmp_path / "objects"
    root.mkdir()
    c = Config()
    c.GpulabSettings.database_url = f"sqlite:///{tmp_path / 'g.sqlite'}"
    c.GpulabSettings.object_stores = {
        "local": {"kind": "filesystem", "root": str(root)},
        "other": {"kind": "filesystem", "root": str(tmp_path / "other")},
    }
    c.GpulabSettings.workspace_store = "local"
    c.GpulabSettings.volume_grants = [
        {"store": "local", "bucket": "results", "prefix": "alice"},
        {"store": "other", "bucket": "results"},
    ]
    settings = GpulabSettings(config=c)
    src = tmp_path / "f"
    src.write_bytes(b"checkpoint")
    FilesystemRemote(root, "results").upload("alice/run1/ckpt.pt", src, hash_file(src))
    volumes = [
        "results@local/alice/run1:/out:rw",
        "datasets@local/alice:/data:ro",
        "results@other/x:/elsewhere:rw",
        "results@local/bob:/bobs:rw",  # a grant that no longer covers it
    ]
    records = JobsOf(
        j1={"owner": "alice", "spec": {"volumes": volumes}},
        j2={"owner": "bob", "spec": {"volumes": volumes}},
    )

    def take(body, user="alice"):
        return run_async(job_snapshots.take(settings, records, user, body))

    taken = take({"name": "run1", "job": "j1", "volume": "/out"})
    assert (taken["objects"], taken["bytes"]) == (1, 10)
    assert taken["source"] == {"kind": "job", "job": "j1", "volume": "/out"}
    # its blobs are in the workspace bucket, beside the workspaces' snapshots: a notebook
    # can be given the job's output
    objects = store.objects_of(settings.storage.stores["local"], settings.workspace_bucket)
    store.restore(objects, "alice", "run1", "workspaces/alice/nb/")
    out = FilesystemRemote(root, settings.workspace_bucket).list("workspaces/alice/nb/")
    assert [o.key for o in out] == ["workspaces/alice/nb/ckpt.pt"]

    for body, status, field in (
        ({"name": "x", "job": "j2", "volume": "/out"}, 404, "job"),  # bob's
        ({"name": "x", "job": "j9", "volume": "/out"}, 404, "job"),
        ({"name": "x", "job": "j1", "volume": "/none"}, 404, "volume"),
        ({"name": "x", "job": "j1", "volume": "/data"}, 409, "volume"),
        ({"name": "x", "job": "j1", "volume": "/elsewhere"}, 409, "volume"),
        ({"name": "x", "job": "j1", "volume": "/bobs"}, 403, "volume"),
        ({"name": "x", "job": "J1", "volume": "/out"}, 400, "job"),
        ({"name": "x", "job": "j1"}, 400, "volume"),
        ({"name": "x", "job": "j1", "volume": "/out", "notebook": ""}, 400, "notebook"),
    ):
        with pytest.raises(job_snapshots.SnapshotRefused) as e:
            take(body)
        assert (e.value.status, e.value.field) == (status, field), (body, e.value.message)


def test_a_restore_names_only_a_notebook_of_the_user_s_own_prefix():
    from gpulab.notebooks.snapshots import SnapshotRefused, _server

    assert [_server(n) for n in ("", "train-1", "a.b_c")] == ["", "train-1", "a.b_c"]
    for bad in ("_default", "Foo Bar", ".home", "a/b", "..", "x" * 64, "-x", 3, None):
        with pytest.raises(SnapshotRefused) as e:
            _server(bad)
        assert e.value.status == 400, bad


def test_no_grant_reaches_another_user_s_snapshots():
    from gpulab.volumes import Grant, VolumeAccessError, VolumeSpec, WorkspaceLocation, check_access

    ws = WorkspaceLocation("s3", "ws")
    grants = [Grant("s3", "ws", ""), Grant("s3", "ws", "snapshots")]  # an operator's slip
    for prefix in ("snapshots/alice", "snapshots/alice/blobs", "snapshots"):
        with pytest.raises(VolumeAccessError, match="only the snapshots API"):
            check_access("bob", VolumeSpec("ws", "s3", prefix, "/d", "rw"), grants, ws)
    check_access("bob", VolumeSpec("ws", "s3", "workspaces/bob", "/d", "rw"), grants, ws)
    check_access("bob", VolumeSpec("ws", "s3", "shared", "/d", "ro"), grants, ws)
