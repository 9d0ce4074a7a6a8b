"""The per-user disk quota on what jobs pull, end to end: a real hub and its gpulab service, the
Docker engine, the sync image, an S3 server (moto) and a git server (``git http-backend``).

The quotas are tiny (KiB) so that the objects and repositories are too: what is checked is
that a pull or a clone that does not fit is refused with a reason that says so, before it
fills a disk, that nothing of it stays on the node, that a user's bookings hold while their
volumes exist and go with them, and that another user is not affected.
"""

from __future__ import annotations

import os
import time

import pytest
import requests

from ..conftest import _need, run_async
from ..support.api import Api
from ..support.git import GitServer, git, git_backend_available

pytestmark = [pytest.mark.docker, pytest.mark.hub]

KiB = 1024
BUCKET = "quota-data"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    import boto3

    from ..support.s3 import TEST_ACCESS_KEY, TEST_SECRET_KEY, MotoS3Server, credentials_file

    server = MotoS3Server().start()
    client = boto3.client(
        "s3",
        endpoint_url=server.endpoint,
        region_name="us-east-1",
        aws_access_key_id=TEST_ACCESS_KEY,
        aws_secret_access_key=TEST_SECRET_KEY,
    )
    client.create_bucket(Bucket=BUCKET)
    # 100 KiB (more than a whole quota of 64 KiB) and two sets of 40 KiB (one fits, not two)
    client.put_object(Bucket=BUCKET, Key="big/blob.bin", Body=os.urandom(100 * KiB))
    for prefix in ("forty-a", "forty-b"):
        for i in range(4):
            client.put_object(Bucket=BUCKET, Key=f"{prefix}/part{i}", Body=os.urandom(10 * KiB))
    server.credentials = credentials_file(tmp_path_factory.mktemp("s3creds"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gitsrv(tmp_path_factory, docker_client):
    """small.git (a few bytes), mid.git (150 KiB that do not compress: within the 256 KiB cap,
    beyond a 64 KiB quota) and huge.git (400 KiB: beyond the cap), served on the default
    bridge's gateway (where the clone helpers reach it)."""
    import ipaddress

    if not git_backend_available():
        _need("git and /usr/lib/git-core/git-http-backend are needed (apt-get install git)")
    root = tmp_path_factory.mktemp("quota-git")
    for name, size in (("small", 0), ("mid", 150 * KiB), ("huge", 400 * KiB)):
        work = root / f"{name}-work"
        work.mkdir()
        git("init", "-q", "-b", "main", cwd=work)
        (work / "README.md").write_text(f"{name}\n")
        if size:
            (work / "weights.bin").write_bytes(os.urandom(size))
        git("add", "-A", cwd=work)
        git("commit", "-q", "-m", name, cwd=work)
        git("clone", "-q", "--bare", str(work), str(root / f"{name}.git"))
    bridge = docker_client.networks.get("bridge")
    config = bridge.attrs["IPAM"]["Config"][0]
    gateway = config.get("Gateway") or str(next(ipaddress.ip_network(config["Subnet"]).hosts()))
    srv = GitServer(root, host=gateway).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def hub(hub_with, sync_image, s3):
    config = f"""
c.GpulabSettings.supervisor_interval = 0.2
c.GpulabSettings.job_container_retention = 3600
c.GpulabSettings.notebook_reconcile_interval = 1
c.GpulabSettings.disk_quota = "64K"
c.GpulabSettings.user_disk_quotas = {{"roomy": "1M"}}
c.GpulabSettings.git_max_bytes = "256K"
# each job's own volumes, which these tests count (the dataset cache books a cached dataset
# the same way: tests/unit/test_supervisor.py::test_a_cached_dataset_counts_against_...)
c.GpulabSettings.dataset_cache_max_bytes = 0
c.GpulabSettings.object_stores["s3"] = {{"endpoint_url": "{s3.endpoint}",
    "credentials": {{"file": "{s3.credentials}"}}}}
c.GpulabSettings.volume_grants.append({{"store": "s3", "bucket": "{BUCKET}"}})
"""
    return hub_with(config)


def volumes_of(docker_client, job: dict) -> list[str]:
    """The Docker volumes of a job (its data volumes and clones are named after its
    container)."""
    name = job["container"]
    assert name, job
    return sorted(v.name for v in docker_client.volumes.list() if v.name.startswith(name + "-"))


def vol(prefix: str) -> str:
    return f"{BUCKET}@s3/{prefix}:/data"


def test_a_volume_larger_than_the_quota_is_not_pulled(hub, docker_client):
    api = Api(hub, "ann")
    job = api.submit(command=["ls", "/data"], volumes=[vol("big")])
    done = api.wait(job["id"], timeout=120)
    assert done["state"] == "FAILED" and done["reason"] == "PULL_FAILED", done
    assert done["message"].startswith(
        f"volume {vol('big')}:ro was not pulled: it holds 100.0 KiB, more than the 64.0 KiB "
        "left of your disk quota of 64.0 KiB (your workloads' volumes and git clones hold 0 B)"
    ), done["message"]
    # refused before any helper ran: nothing of it on the node's disk
    assert volumes_of(docker_client, done) == []
    notes = [e["message"] for e in done["history"] if e["reason"] == "SYNC"]
    assert notes == [f"pulling {vol('big')}:ro", done["message"]], notes
    # the user with a larger quota of their own pulls the same volume
    roomy = Api(hub, "roomy")
    ok = roomy.wait(roomy.submit(command=["ls", "/data"], volumes=[vol("big")])["id"])
    assert ok["state"] == "DONE", ok
    assert roomy.call("GET", f"/jobs/{ok['id']}/logs").text == "blob.bin\n"


def test_two_jobs_of_one_user_share_the_quota_and_bytes_come_back_with_the_volumes(
    hub, docker_client
):
    api = Api(hub, "cleo")
    # submitted together, started together: the second cannot take the bytes the first booked
    first = api.submit(command=["sh", "-c", "ls /data | wc -l"], volumes=[vol("forty-a")])
    second = api.submit(command=["sh", "-c", "ls /data | wc -l"], volumes=[vol("forty-b")])
    ends = [api.wait(j["id"], timeout=120) for j in (first, second)]
    assert sorted(e["state"] for e in ends) == ["DONE", "FAILED"], ends
    done, refused = sorted(ends, key=lambda e: e["state"])
    assert refused["reason"] == "PULL_FAILED", refused
    assert (
        "it holds 40.0 KiB, more than the 24.0 KiB left of your disk quota of 64.0 KiB"
        in (refused["message"])
        and "hold 40.0 KiB" in refused["message"]
    ), refused["message"]
    assert volumes_of(docker_client, refused) == []
    # the finished job keeps its volume (for the retention delay), and with it its bytes
    assert len(volumes_of(docker_client, done)) == 1
    again = api.wait(api.submit(command=["true"], volumes=[vol("forty-b")])["id"], timeout=120)
    assert again["state"] == "FAILED" and "24.0 KiB left" in again["message"], again
    # the admin sees what each user holds, of which quota
    page = requests.get(
        f"{hub.url}/services/gpulab/admin",
        headers={"Authorization": f"token {hub.admin_token}"},  # custom:gpulab:admin
        timeout=30,
    )
    assert page.status_code == 200, page.text[:300]
    row = page.text.split('<tr data-user="cleo">', 1)[1].split("</tr>", 1)[0]
    assert ">40.0 KiB / 64.0 KiB</td>" in row, row
    # another user is not affected
    other = Api(hub, "dora")
    theirs = other.wait(other.submit(command=["true"], volumes=[vol("forty-b")])["id"])
    assert theirs["state"] == "DONE", theirs
    # the first job's volumes removed (DELETE): its bytes are the user's again
    assert api.call("DELETE", f"/jobs/{done['id']}").status_code == 204
    assert [v for v in docker_client.volumes.list() if v.name.startswith(done["container"])] == []
    after = api.wait(api.submit(command=["true"], volumes=[vol("forty-b")])["id"], timeout=120)
    assert after["state"] == "DONE", after


def test_a_repository_over_its_cap_or_the_quota_fails_and_leaves_nothing(
    hub, gitsrv, docker_client
):
    # over the per-repository cap (256 KiB), within the user's quota (1 MiB): the cap, named
    roomy = Api(hub, "roomy")
    job = roomy.submit(command=["true"], git=[{"url": gitsrv.url("huge.git")}])
    done = roomy.wait(job["id"], timeout=120)
    assert done["state"] == "FAILED" and done["reason"] == "GIT_FAILED", done
    assert done["message"] == (
        f"clone of {gitsrv.url('huge.git')} (the default branch) failed: the repository is "
        "larger than the limit of 256.0 KiB"
    ), done["message"]
    assert volumes_of(docker_client, done) == []  # the emptied clone volume is removed too
    # within the cap, beyond what the quota (64 KiB) leaves: refused while it arrived
    api = Api(hub, "eve")
    job = api.submit(command=["true"], git=[{"url": gitsrv.url("mid.git")}])
    done = api.wait(job["id"], timeout=120)
    assert done["state"] == "FAILED" and done["reason"] == "GIT_FAILED", done
    assert done["message"].startswith(
        f"clone of {gitsrv.url('mid.git')} (the default branch) failed: the repository is "
        "larger than the 64.0 KiB left of your disk quota of 64.0 KiB"
    ), done["message"]
    assert volumes_of(docker_client, done) == []
    # a small repository is cloned, and its bytes (not its bound) count while its volume lasts
    job = api.submit(
        command=["cat", "/workspace/small/README.md"], git=[{"url": gitsrv.url("small.git")}]
    )
    done = api.wait(job["id"], timeout=120)
    assert done["state"] == "DONE", done
    assert api.call("GET", f"/jobs/{done['id']}/logs").text == "small\n"
    nxt = api.wait(api.submit(command=["true"], volumes=[vol("forty-a")])["id"], timeout=120)
    assert nxt["state"] == "DONE", nxt  # the clone took a few KiB: 40 KiB still fit
    # with the clone and the volume held, the next 40 KiB do not
    full = api.wait(api.submit(command=["true"], volumes=[vol("forty-b")])["id"], timeout=120)
    assert full["state"] == "FAILED", full
    # 64 KiB less 40 KiB less the clone's pack and files (about a KiB): 2x KiB left
    assert "was not pulled: it holds 40.0 KiB, more than the 2" in full["message"], full
    # the clone's job deleted: its clone volume goes with it (and its bytes): 40 KiB fit again
    assert volumes_of(docker_client, done) == [f"{done['container']}-git-0"]
    assert api.call("DELETE", f"/jobs/{done['id']}").status_code == 204
    assert [v for v in docker_client.volumes.list() if v.name.startswith(done["container"])] == []
    again = api.wait(api.submit(command=["true"], volumes=[vol("forty-b")])["id"], timeout=120)
    assert again["state"] == "FAILED", again  # the 40 KiB volume still holds its bytes
    assert "more than the 24.0 KiB left" in again["message"], again


def test_notebooks_count_against_the_same_quota_until_they_are_deleted(hub, docker_client):
    from ..support.hub import SpawnFailed

    token = hub.create_user("nina")
    api = Api(hub, "nina")
    # a notebook's volume that does not fit: the spawn fails (a 403 with the reason when it
    # fails within the hub's wait, as it does: nothing is fetched), nothing pulled
    r = hub.spawn("nina", "toobig", {"volumes": [vol("big")]}, token=token)
    if r.status_code == 403:
        assert "was not pulled: it holds 100.0 KiB" in r.json()["message"], r.text
    else:
        assert r.status_code in (201, 202), r.text
        with pytest.raises(SpawnFailed):
            hub.wait_ready("nina", "toobig", timeout=120)
    failed = hub.wait_state("nina", "toobig", "FAILED")["history"][-1]
    assert failed["reason"] == "PULL_FAILED", failed
    assert failed["message"].startswith(
        f"volume {vol('big')}:ro was not pulled: it holds 100.0 KiB, more than the 64.0 KiB left"
    ), failed
    # one that fits holds its bytes while it runs, and stopped: a job of the same user's is
    # refused what is left
    r = hub.spawn("nina", "nb", {"volumes": [vol("forty-a")]}, token=token)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("nina", "nb", timeout=120)
    hub.stop_server("nina", "nb")
    job = api.wait(api.submit(command=["true"], volumes=[vol("forty-b")])["id"], timeout=120)
    assert job["state"] == "FAILED" and "24.0 KiB left" in job["message"], job
    # deleted, the notebook's volumes and bytes are gone
    hub.stop_server("nina", "nb", remove=True)
    hub.wait_state("nina", "nb", "DELETED")
    job = api.wait(api.submit(command=["true"], volumes=[vol("forty-b")])["id"], timeout=120)
    assert job["state"] == "DONE", job
    # a delete cut short between the volumes' removal and their release (a hub killed): the
    # hub's reconciler gives the deleted notebook's bytes back on its next pass
    from gpulab.db import Database
    from gpulab.disk_ledger import DiskLedger

    ledger = DiskLedger(
        Database(f"sqlite:///{hub.workdir / 'data' / 'gpulab.sqlite'}"), hub.instance
    )
    ledger.book("nina", f"{hub.instance}/notebook/nina/nb", "left-behind", "", 10 * KiB, None)
    assert ledger.held("nina") == 50 * KiB
    deadline = time.monotonic() + 30
    while ledger.held("nina") != 40 * KiB and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ledger.held("nina") == 40 * KiB  # what the job's volume holds, and nothing else
    assert {b["workload"] for b in ledger.bookings("nina")} == {f"{hub.instance}/job/{job['id']}"}


def test_a_prefix_that_grows_after_its_listing_is_booked_again(
    sync_image,
    tmp_path,
    docker_client,
):
    """The sync helper (real, on the filesystem store) refuses a prefix that weighs more than
    was booked for it; the pull then lists and books once more, and pulls it all."""
    import uuid

    from gpulab.data.sync import DiskAccount, VolumeSync, WorkloadData
    from gpulab.db import Database
    from gpulab.disk_ledger import DiskLedger
    from gpulab.runtime.docker import DockerRuntime
    from gpulab.volumes import ObjectStore, parse_volume

    root = tmp_path / "store"
    (root / "growing" / "set").mkdir(parents=True)
    (root / "growing" / "set" / "a.bin").write_bytes(b"a" * 1000)
    os.chmod(tmp_path, 0o755)
    stores = {"fs": ObjectStore("fs", kind="filesystem", root=str(root))}
    ledger = DiskLedger(Database(f"sqlite:///{tmp_path / 'db.sqlite'}"), "tq")
    calls = []

    def owner_and_quota():
        if not calls:  # between the service's listing and the helper's: a new object
            (root / "growing" / "set" / "b.bin").write_bytes(b"b" * 500)
        calls.append(1)
        return "ann", 10 * KiB

    name = f"gpulab-tq-{uuid.uuid4().hex[:10]}"
    data = WorkloadData(
        DockerRuntime(),
        stores,
        sync_image,
        "tq",
        f"tq/job/{name}",
        DiskAccount(ledger, owner_and_quota),
    )
    spec = parse_volume("growing@fs/set:/data", stores)
    vol = VolumeSync(spec, f"{name}-v-0", str(spec))
    try:
        outcome = run_async(data.run("pull", vol))
        assert outcome.ok, outcome
        assert outcome.report["completed"] == 2 and outcome.report["bytes_transferred"] == 1500
        assert len(calls) == 2 and ledger.held("ann") == 1500
    finally:
        docker_client.volumes.get(vol.docker_volume).remove(force=True)
