"""Data isolation: a link planted in a volume changes nothing outside that volume's prefix.

Issue 11's attack, played against the real hub, its service, the Docker engine and the
embedded filesystem store: an ordinary user (mallory) plants symbolic links in her job's rw
volume and in her notebook's workspace, aimed at another user's (bob's) workspace in the
store, at the store itself and at the sync's own files. Bob's files must stay byte-identical
and nothing in the store outside mallory's own prefixes may change, on push and on pull.
The sync helpers' binds are watched through the engine's events: none may be the store root.

Against moto's S3 server: the same attack through the hub, aimed at the sync helper's own
credentials, is ``test_notebook_data.py::test_job_links_never_upload_the_helpers_secrets_or_
touch_others``; the engine alone (planted links, and the ``/proc/self/fd`` paths it hands to
boto3 for multipart uploads and ranged downloads) is in ``tests/unit/test_datasync_links.py``.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from ..support.api import Api
from ..support.hub import SpawnFailed

pytestmark = [pytest.mark.docker, pytest.mark.hub]

CONFIG = """
c.GpulabSettings.supervisor_interval = 0.2
"""
SECRET = b"print('bob trains his model')\n"
VICTIM_WS = "gpulab-workspaces/workspaces/bob/_default"
# mallory's own prefixes (objects and their metadata): the only places that may change
MALLORY = (
    "scratch/mallory/run1/",
    ".gpulab-meta/scratch/mallory/run1/",
    "gpulab-workspaces/workspaces/mallory/nb/",
    ".gpulab-meta/gpulab-workspaces/workspaces/mallory/nb/",
)


@pytest.fixture(scope="module")
def hub(hub_with):
    return hub_with(CONFIG)


@pytest.fixture(scope="module")
def store(hub) -> Path:
    """The embedded store, with bob's workspace file and data placed in it directly."""
    root = hub.workdir / "data" / "objects"
    (root / VICTIM_WS).mkdir(parents=True)
    (root / VICTIM_WS / "train.py").write_bytes(SECRET)
    (root / "scratch/bob").mkdir(parents=True)
    (root / "scratch/bob/data.bin").write_bytes(os.urandom(4096))
    if os.geteuid() == 0:  # owned as the sync helpers leave what they write: uid 1000
        for dirpath, dirnames, filenames in os.walk(root):
            for name in [*dirnames, *filenames]:
                os.chown(os.path.join(dirpath, name), 1000, 100)
    return root


@pytest.fixture(scope="module")
def helper_binds(hub, docker_client):
    """The binds of every sync helper this hub creates, read as each one is created (they are
    removed when they end)."""
    seen: list[dict] = []
    events = docker_client.events(
        decode=True,
        filters={
            "type": "container",
            "event": "create",
            "label": ["org.gpulab.kind=sync-helper", f"org.gpulab.instance={hub.instance}"],
        },
    )

    def watch() -> None:
        for event in events:
            try:
                attrs = docker_client.api.inspect_container(event["id"])
            except Exception:  # already gone
                continue
            seen.append(
                {
                    "workload": attrs["Config"]["Labels"].get("org.gpulab.workload", ""),
                    "command": attrs["Config"]["Cmd"],
                    "binds": attrs["HostConfig"]["Binds"] or [],
                }
            )

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    yield seen
    events.close()


@pytest.fixture(scope="module")
def mallory(hub):
    return Api(hub, "mallory")


def snapshot(root: Path) -> dict[str, object]:
    """Every file and link of the store (content or target), mallory's prefixes left out."""
    out: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if rel.startswith(MALLORY):
                continue
            if os.path.islink(path):
                out[rel] = ("link", os.readlink(path))
            else:
                out[rel] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return out


# drops d/train.py from the manifest (the workload owns it too)
FORGET_D = (
    'import json; p = "/w/.gpulab-sync-manifest.json"; m = json.load(open(p)); '
    'm["objects"] = {k: v for k, v in m["objects"].items() if "/d/" not in k}; '
    'open(p, "w").write(json.dumps(m))'
)


def assert_never_the_store_root(helpers: list[dict], store: Path) -> None:
    root = os.path.realpath(store)
    for h in helpers:
        sources = [b.split(":", 1)[0] for b in h["binds"]]
        assert root not in sources and str(store) not in sources, h
        assert not any(b.split(":")[1] == "/store" for b in h["binds"]), h


def plant(where: str) -> str:
    """Shell commands that plant the attack's links in ``where`` (as the workload's user)."""
    target = f"/store/{VICTIM_WS}/train.py"
    links = [
        f"ln -sfn {target} {where}/.gpulab-sync-manifest.json.tmp-{pid}" for pid in range(1, 10)
    ]
    links += [
        f"ln -sfn /store/scratch/bob/made-by-the-lock {where}/.gpulab-sync.lock",
        f"ln -sfn /store {where}/x",
        f"ln -sfn /store/.gpulab-meta {where}/meta",
        f"ln -sfn /store/{VICTIM_WS} {where}/bobs-workspace",
        f"ln -sfn {target} {where}/train.py",
    ]
    return " && ".join(links)


def test_job_links_change_nothing_outside_its_prefix(hub, store, mallory, helper_binds):
    """The attack seen on main: the job's final push wrote its manifest over bob's train.py."""
    before = snapshot(store)
    assert before[f"{VICTIM_WS}/train.py"] == hashlib.sha256(SECRET).hexdigest()
    job = mallory.submit(
        command=["sh", "-c", plant("/data/out") + " && echo trained > /data/out/result.txt"],
        volumes=["scratch@local/mallory/run1:/data/out:rw"],
    )
    done = mallory.wait(job["id"])
    logs = mallory.call("GET", f"/jobs/{job['id']}/logs").text
    assert done["state"] in ("DONE", "SYNC_FAILED"), (done["message"], logs)
    assert (store / VICTIM_WS / "train.py").read_bytes() == SECRET
    assert snapshot(store) == before
    assert not (store / "scratch/bob/made-by-the-lock").exists()
    # what the job made of its own prefix: its one regular file, none of the links
    mine = store / "scratch/mallory/run1"
    assert sorted(p.relative_to(mine).as_posix() for p in mine.rglob("*")) == ["result.txt"]
    assert done["state"] == "DONE", done  # the links were skipped, the file pushed
    assert "1 transferred" in done["message"], done

    pushes = [h for h in helper_binds if job["id"] in h["workload"] and h["command"][0] == "push"]
    assert pushes, helper_binds
    for h in pushes:
        assert sorted(b.rsplit(":", 1)[0].split(":", 1)[1] for b in h["binds"]) == [
            "/data",
            "/store/.gpulab-meta/scratch/mallory/run1",
            "/store/scratch/mallory/run1",
        ], h
    assert_never_the_store_root(helper_binds, store)


def test_notebook_links_change_nothing_outside_its_prefix(
    hub, store, mallory, docker_client, helper_binds
):
    """The same links in a notebook's workspace, pushed on stop; then a pull through a
    directory she replaced by a link to bob's workspace, on the next start."""
    before = snapshot(store)
    r = hub.spawn("mallory", "nb", {}, token=mallory.token)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("mallory", "nb")
    nb = hub.notebook("mallory", "nb").json()
    res = docker_client.containers.get(nb["container"]).exec_run(
        [
            "sh",
            "-c",
            plant("/workspace")
            + " && mkdir /workspace/d && echo mine > /workspace/d/train.py"
            + " && echo notes > /workspace/notes.txt",
        ],
        user="1000",
    )
    assert res.exit_code == 0, res.output
    hub.stop_server("mallory", "nb")
    nb = hub.wait_state("mallory", "nb", "STOPPED")
    assert (store / VICTIM_WS / "train.py").read_bytes() == SECRET
    assert snapshot(store) == before
    mine = store / "gpulab-workspaces/workspaces/mallory/nb"
    assert sorted(p.relative_to(mine).as_posix() for p in mine.rglob("*") if p.is_file()) == [
        "d/train.py",
        "notes.txt",
    ]

    # while it is stopped (she could as well do it in a later session, with a rw volume):
    # d becomes a link to bob's workspace, and the manifest forgets d/train.py, so that
    # the next pull downloads it again, through the link if it followed links
    volume = nb["container"] + "-workspace"
    docker_client.containers.run(
        "gpulab/python:3.11",
        [
            "sh",
            "-c",
            f"rm -rf /w/d && ln -sfn /store/{VICTIM_WS} /w/d && python3 -c '{FORGET_D}'",
        ],
        volumes={volume: {"bind": "/w", "mode": "rw"}},
        user="1000:100",
        remove=True,
    )
    r = hub.spawn("mallory", "nb", {}, token=mallory.token)
    assert r.status_code in (201, 202, 500), r.text
    with pytest.raises(SpawnFailed):
        hub.wait_ready("mallory", "nb", timeout=120)
    nb = hub.wait_state("mallory", "nb", "FAILED")
    assert "d: something other than a directory is in the way" in nb["history"][-1]["message"]
    assert (store / VICTIM_WS / "train.py").read_bytes() == SECRET
    assert snapshot(store) == before

    # deleting the notebook purges its workspace prefix, and only that (its directories go too)
    hub.stop_server("mallory", "nb", remove=True)
    hub.wait_state("mallory", "nb", "DELETED")
    assert not mine.exists() and not (store / ".gpulab-meta" / mine.relative_to(store)).exists()
    assert (store / VICTIM_WS / "train.py").read_bytes() == SECRET
    assert snapshot(store) == before

    helpers = [h for h in helper_binds if "mallory/nb" in h["workload"]]
    assert {h["command"][0] for h in helpers} >= {"push", "pull", "purge"}, helpers
    for h in helpers:
        store_binds = sorted(b for b in h["binds"] if ":/store" in b)
        mode = "ro" if h["command"][0] == "pull" else "rw"
        assert store_binds == [
            f"{store}/.gpulab-meta/gpulab-workspaces/workspaces/mallory/nb:"
            f"/store/.gpulab-meta/gpulab-workspaces/workspaces/mallory/nb:{mode}",
            f"{store}/gpulab-workspaces/workspaces/mallory/nb:"
            f"/store/gpulab-workspaces/workspaces/mallory/nb:{mode}",
        ], h
    assert_never_the_store_root(helper_binds, store)
