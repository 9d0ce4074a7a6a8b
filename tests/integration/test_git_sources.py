"""A job's git sources against a real git server: ``clone_sources`` with the real Docker
runtime and the real sync image (``gpulab-sync git-clone``, dulwich), cloning over git's smart
HTTP (``git http-backend``) from a server this test starts on the Docker bridge's gateway,
where the helper container reaches it.

What the job would see is checked by mounting each clone's volume in a throwaway container,
as the job's container does (:func:`gpulab.jobs.supervisor.git_sources.git_mounts`).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from gpulab.data.sync import WorkloadData
from gpulab.jobs.spec import GitSource
from gpulab.jobs.supervisor.git_sources import clone_sources, git_mounts, git_volume_names
from gpulab.runtime.docker import DockerRuntime

from ..conftest import IN_CI, SYNC_IMAGE, _need, run_async
from ..support.git import GitServer, git, git_backend_available

pytestmark = [pytest.mark.docker]

INSTANCE = "gpulab-test-git"
USER, PASSWORD = "alice", "pw-" + uuid.uuid4().hex
SECRETS = {"right": f"{USER}:{PASSWORD}", "wrong": f"{USER}:not-{PASSWORD}", "token": PASSWORD}


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    """public.git (anonymous) and private.git (basic auth), each with main, dev, an annotated
    tag v1 on the first commit, and a middle commit that no ref points to."""
    if not git_backend_available():
        _need("git and /usr/lib/git-core/git-http-backend are needed (apt-get install git)")
    root = tmp_path_factory.mktemp("git")
    work = root / "work"
    work.mkdir()
    git("init", "-q", "-b", "main", cwd=work)
    (work / "README.md").write_text("hello from main\n")
    (work / "train.sh").write_text("#!/bin/sh\necho training\n")
    os.chmod(work / "train.sh", 0o755)
    os.symlink("README.md", work / "readme-link")
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "first", cwd=work)
    first = git("rev-parse", "HEAD", cwd=work)
    git("tag", "-a", "v1", "-m", "release 1", cwd=work)
    (work / "middle.txt").write_text("middle\n")
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "middle", cwd=work)
    middle = git("rev-parse", "HEAD", cwd=work)
    (work / "last.txt").write_text("last\n")
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "last", cwd=work)
    last = git("rev-parse", "HEAD", cwd=work)
    git("checkout", "-q", "-b", "dev", cwd=work)
    (work / "dev.txt").write_text("dev work\n")
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "dev", cwd=work)
    dev = git("rev-parse", "HEAD", cwd=work)
    git("checkout", "-q", "main", cwd=work)  # the bare copies' default branch
    for name in ("public.git", "private.git"):
        git("clone", "-q", "--bare", str(work), str(root / name))
    return {"root": root, "first": first, "middle": middle, "last": last, "dev": dev}


@pytest.fixture(scope="module")
def server(repos, docker_client):
    """The git server, listening on the default bridge's gateway only (what a helper on that
    bridge reaches; nothing outside this machine)."""
    import ipaddress

    bridge = docker_client.networks.get("bridge")
    config = bridge.attrs["IPAM"]["Config"][0]
    # an engine restarted with its bridge in place may leave the gateway out of IPAM (seen on
    # Engine 20.10 after the swarm lab's down): the bridge's gateway is then its first host
    gateway = config.get("Gateway") or str(next(ipaddress.ip_network(config["Subnet"]).hosts()))
    srv = GitServer(repos["root"], host=gateway, protected={"private.git": (USER, PASSWORD)})
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def job(docker_client, sync_image):
    """A job's container name and workload data; its git volumes are removed afterwards."""
    name = f"{INSTANCE}-job-{uuid.uuid4().hex[:10]}"
    data = WorkloadData(DockerRuntime(), {}, sync_image, INSTANCE, f"{INSTANCE}/job/{name}")
    yield name, data
    for v in docker_client.volumes.list(filters={"name": name}):
        if v.name.startswith(name):
            v.remove(force=True)


async def resolve(name: str) -> str:
    return SECRETS[name]


def git_object(repo: Path, kind: str, data: bytes) -> str:
    """Write a raw object (even one git would call malformed) and return its hash."""
    out = subprocess.run(
        ["git", "hash-object", "--literally", "-t", kind, "-w", "--stdin"],
        cwd=repo,
        input=data,
        capture_output=True,
        check=True,
    )
    return out.stdout.decode().strip()


def git_status(client, volume: str, where: Path) -> str:
    """``git status --porcelain`` of a clone, by the host's git, on a copy of the volume
    (taken as ``docker cp`` does: a log would mangle binary data)."""
    where.mkdir(parents=True, exist_ok=True)
    holder = client.containers.create(
        SYNC_IMAGE, volumes={volume: {"bind": "/repo", "mode": "ro"}}, network_mode="none"
    )
    try:
        stream, _ = holder.get_archive("/repo/.")
        tar = b"".join(stream)
    finally:
        holder.remove(force=True)
    subprocess.run(["tar", "-C", str(where), "--no-same-owner", "-x"], input=tar, check=True)
    return git("status", "--porcelain", cwd=where)


def look(client, volume: str, script: str) -> str:
    """Run ``script`` as uid 1000 in a throwaway container that mounts ``volume`` at /repo, as
    the job's container would."""
    out = client.containers.run(
        SYNC_IMAGE,
        ["-c", script],
        entrypoint="/bin/sh",
        user="1000:100",
        volumes={volume: {"bind": "/repo", "mode": "rw"}},
        network_mode="none",
        remove=True,
        stdout=True,
        stderr=True,
    )
    return out.decode()


def clone(name, data, sources):
    events: list[str] = []
    ok, message = run_async(clone_sources(data, name, "", sources, resolve, events.append))
    return ok, message, events


def test_branch_tag_commit_and_default_branch(server, repos, job, docker_client, tmp_path):
    name, data = job
    url = server.url("public.git")
    sources = [
        GitSource(url, "/workspace/public"),
        GitSource(url, "/workspace/dev", branch="dev"),
        GitSource(url, "/workspace/v1", revision="v1"),
        GitSource(url, "/workspace/middle", revision=repos["middle"]),
        GitSource(url, "/workspace/short", revision=repos["first"][:9]),
    ]
    ok, message, events = clone(name, data, sources)
    assert ok, message
    assert len(events) == 5
    assert events[0] == (
        f"cloned {url} (the default branch) at {repos['last'][:12]} into /workspace/public"
    )
    assert events[1].startswith(f"cloned {url} (branch dev) at {repos['dev'][:12]}")
    assert f"at {repos['first'][:12]}" in events[2] and f"at {repos['middle'][:12]}" in events[3]
    assert f"at {repos['first'][:12]}" in events[4]
    vols = git_volume_names(name, sources)
    assert [m.volume for m in git_mounts(name, sources)] == vols

    # the default branch: files, mode, link, owner; a clean work tree on main tracking origin
    seen = look(
        docker_client,
        vols[0],
        "cd /repo && cat README.md && ls -A && stat -c '%u %a' README.md train.sh && "
        "readlink readme-link && cat .git/HEAD && (grep -c pw- .git/config || true)",
    )
    lines = seen.splitlines()
    assert lines[0] == "hello from main"
    assert set(lines[1:7]) == {
        ".git",
        "README.md",
        "last.txt",
        "middle.txt",
        "readme-link",
        "train.sh",
    }
    assert lines[7:9] == ["1000 644", "1000 755"]  # the job's user owns it, modes as committed
    assert lines[9] == "README.md"  # a link stays a link (inside the clone)
    assert lines[10] == "ref: refs/heads/main"
    assert lines[11] == "0"
    # a branch, a tag (detached), a commit no ref points to, an abbreviated hash
    assert "dev work" in look(docker_client, vols[1], "cat /repo/dev.txt; cat /repo/.git/HEAD")
    assert "ref: refs/heads/dev" in look(docker_client, vols[1], "cat /repo/.git/HEAD")
    for i, commit, absent in ((2, repos["first"], "middle.txt"), (3, repos["middle"], "last.txt")):
        head = look(
            docker_client, vols[i], f"cat /repo/.git/HEAD; ls /repo; test ! -e /repo/{absent}"
        )
        assert head.splitlines()[0] == commit
    assert look(docker_client, vols[4], "cat /repo/.git/HEAD").strip() == repos["first"]
    # git itself finds the checkout clean and complete (the index matches the files)
    assert git_status(docker_client, vols[0], tmp_path) == ""
    assert git_status(docker_client, vols[3], tmp_path / "m") == ""


def test_credentials_right_and_wrong(server, repos, job):
    name, data = job
    url = server.url("private.git")
    ok, message, events = clone(name, data, [GitSource(url, "/w/p", secret="right")])
    assert ok, message
    assert message.startswith(f"cloned {url} (the default branch) at {repos['last'][:12]}")
    # the credential went to the server, and only as basic auth
    assert any(r["authorization"].startswith("Basic ") for r in server.requests)

    server.requests.clear()
    for secret, words in (
        ("wrong", "authentication failed (HTTP 401)"),
        (None, "the server asks for credentials (HTTP 401)"),
    ):
        # a volume of its own: a finished clone in a volume is kept, whatever the secret
        other = f"{name}-{secret}"
        ok, message, events = clone(other, data, [GitSource(url, "/w/p", secret=secret)])
        assert not ok
        assert message.startswith(f"clone of {url} (the default branch) failed: "), message
        assert words in message
        assert PASSWORD not in message and all(PASSWORD not in e for e in events)


def test_token_secret_goes_as_x_access_token(server, job):
    import base64

    name, data = job
    server.requests.clear()
    ok, message, _ = clone(
        name, data, [GitSource(server.url("public.git"), "/w/p", secret="token")]
    )
    assert ok, message
    sent = {r["authorization"] for r in server.requests if r["authorization"]}
    want = "Basic " + base64.b64encode(f"x-access-token:{PASSWORD}".encode()).decode()
    assert sent == {want}


def test_failures_name_the_repository(server, job, docker_client):
    name, data = job
    public = server.url("public.git")
    cases = [
        (GitSource(server.url("missing.git"), "/w/a"), "no git repository at this URL"),
        (GitSource(public, "/w/a", revision="v9"), "revision 'v9' not found"),
        (GitSource(public, "/w/a", branch="nope"), "branch 'nope' not found (branches: dev, main)"),
        (GitSource(public, "/w/a", revision="f" * 40), "not found"),
        (
            GitSource(f"http://{server.host}:1/x.git", "/w/a"),
            f"cannot connect to {server.host}: connection refused",
        ),
    ]
    for src, words in cases:
        # a failure stops the clones: the repository after it is not tried
        ok, message, events = clone(name, data, [src, GitSource(public, "/w/b")])
        assert not ok
        assert message.startswith(f"clone of {src.url} ({src.ref_text}) failed: "), message
        assert words in message, message
        assert events == [message]
        # nothing half-cloned is left for the job
        assert look(docker_client, git_volume_names(name, [src])[0], "ls -A /repo") == ""


def test_a_clone_is_kept_when_the_job_starts_again(server, job, docker_client):
    name, data = job
    src = GitSource(server.url("public.git"), "/w/a", branch="dev")
    ok, first, _ = clone(name, data, [src])
    assert ok, first
    volume = git_volume_names(name, [src])[0]
    look(docker_client, volume, "echo changed > /repo/dev.txt")
    ok, again, _ = clone(name, data, [src])
    assert ok and again.endswith("(kept from an earlier start of this job)"), again
    assert look(docker_client, volume, "cat /repo/dev.txt") == "changed\n"


def test_unsafe_tree_writes_nothing_outside(server, repos, job, docker_client):
    """A tree whose path leads through a symbolic link (CVE-2021-21300's shape) is refused."""
    bare = repos["root"] / "evil.git"
    if not bare.exists():
        git("init", "-q", "--bare", "-b", "main", str(bare))
        link = git_object(bare, "blob", b"/tmp")
        payload = git_object(bare, "blob", b"pwned\n")
        # a link "escape" and a file "escape/pwned" in one tree: git's own tools refuse to
        # write such a tree, so it is written as a raw object
        tree = git_object(
            bare,
            "tree",
            b"120000 escape\0"
            + bytes.fromhex(link)
            + b"100644 escape/pwned\0"
            + bytes.fromhex(payload),
        )
        commit = git("commit-tree", tree, "-m", "evil", cwd=bare)
        git("update-ref", "refs/heads/main", commit, cwd=bare)
    name, data = job
    ok, message, _ = clone(name, data, [GitSource(server.url("evil.git"), "/w/e")])
    assert not ok
    assert "unsafe path" in message and "escape/pwned" in message, message


def test_ci_has_git_http_backend():
    """In CI the git server's parts are there (a skip would prove nothing)."""
    assert git_backend_available() or not IN_CI


@pytest.fixture(scope="module")
def hub(hub_with, sync_image):
    config = 'c.GpulabSettings.gpu_devices = [{"id": "0"}]\nc.GpulabSettings.gpu_mode = "env"\n'
    config += "c.GpulabSettings.supervisor_interval = 0.2\n"
    return hub_with(config)


def test_a_job_runs_on_its_clones_and_a_bad_revision_fails_it(hub, server, repos):
    from ..support.api import Api

    api = Api(hub, "alice")
    r = api.call("PUT", "/secrets/gitcred", json={"value": f"{USER}:{PASSWORD}"})
    assert r.status_code == 201, r.text
    job = api.submit(
        command=["sh", "-c", "cat /workspace/private/dev.txt; cat public/README.md; pwd"],
        working_dir="/workspace",
        git=[
            {"url": server.url("private.git"), "branch": "dev", "secret": "gitcred"},
            {"url": server.url("public.git"), "revision": "v1"},
        ],
    )
    done = api.wait(job["id"], timeout=120)
    assert done["state"] == "DONE", done
    logs = api.call("GET", f"/jobs/{job['id']}/logs").text
    assert logs.split("\n")[:3] == ["dev work", "hello from main", "/workspace"]
    cloned = [e["message"] for e in done["history"] if e["reason"] == "GIT"]
    assert cloned[0].startswith(f"cloned {server.url('private.git')} (branch dev) at ")
    assert cloned[1].startswith(f"cloned {server.url('public.git')} (revision v1) at ")
    bad = api.submit(command=["true"], git=[{"url": server.url("public.git"), "revision": "v9"}])
    failed = api.wait(bad["id"], timeout=120)
    assert failed["state"] == "FAILED" and failed["reason"] == "GIT_FAILED", failed
    assert server.url("public.git") in failed["message"] and "v9" in failed["message"]
    for answer in (api.call("GET", f"/jobs/{job['id']}").text, api.call("GET", "/jobs").text):
        assert PASSWORD not in answer
    assert PASSWORD not in hub.log_file.read_text(errors="replace")
