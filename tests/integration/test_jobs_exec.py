"""Exec and shell in a running job, end to end: a real hub, the gpulab service, the Docker
engine; the CLI driven as a user would, its shell through a pseudo-terminal (pexpect)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pexpect
import pytest
import requests
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

from ..conftest import run_async
from ..support.api import Api

pytestmark = [pytest.mark.docker, pytest.mark.hub]

CONFIG = """
c.GpulabSettings.gpu_devices = []
c.GpulabSettings.gpu_mode = "env"
c.GpulabSettings.supervisor_interval = 0.2
c.GpulabSettings.job_container_retention = 3600
"""
GPULAB = str(Path(sys.executable).parent / "gpulab")
#: lists the container's processes (its image has no ps): "PID ARGV" lines
PROCESSES = (
    'for p in /proc/[0-9]*; do printf "%s " "${p#/proc/}"; tr "\\0" " " < "$p/cmdline"; echo; '
    "done 2>/dev/null"
)


@pytest.fixture(scope="module")
def hub(hub_with):
    return hub_with(CONFIG)


@pytest.fixture(scope="module")
def alice(hub):
    return Api(hub, "alice")


@pytest.fixture(scope="module")
def bob(hub):
    return Api(hub, "bob")


@pytest.fixture(scope="module")
def job(hub, alice):
    """A RUNNING job of alice's; it notes its working directory in /tmp/job-pwd."""
    job = alice.submit(command=["sh", "-c", "pwd > /tmp/job-pwd; sleep 900"])
    alice.wait(job["id"], {"RUNNING"})
    yield job
    # hub_with stops a module's hub before the module's fixtures end (hubs go before what
    # they were configured with), and removes its workloads: interrupt only a hub still up
    if hub.proc and hub.proc.poll() is None:
        alice.call("POST", f"/jobs/{job['id']}/interrupt")


def _exec(api: Api, job_id: str, **body) -> dict:
    r = api.call("POST", f"/jobs/{job_id}/exec", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _ws(hub, job_id: str, token: str | None, headers: dict | None = None, query: str = ""):
    """Open the job's shell WebSocket and close it: (True, None) if it opened, else
    (False, the refusal)."""
    url = f"ws://127.0.0.1:{hub.port}/services/gpulab/api/jobs/{job_id}/shell{query}"
    all_headers = {**({"Authorization": f"token {token}"} if token else {}), **(headers or {})}

    async def connect():
        try:
            conn = await websocket_connect(HTTPRequest(url, headers=all_headers))
        except HTTPClientError as e:
            return False, e
        conn.close()
        return True, None

    return run_async(connect())


def _refused(hub, job_id: str, token: str | None, **kw) -> tuple[int, dict]:
    opened, err = _ws(hub, job_id, token, **kw)
    assert not opened, "the handshake was accepted"
    return err.code, json.loads(err.response.body)


def test_exec_answers_output_and_exit_code_and_is_recorded(alice, job):
    found = _exec(alice, job["id"], command=["sh", "-c", "echo hi; echo oops >&2; exit 3"])
    assert sorted(found["output"].splitlines()) == ["hi", "oops"]  # two pipes: either order
    assert (found["exit_code"], found["truncated"], found["timed_out"]) == (3, False, False)
    # a string is a shell line; it runs as the job's user, in the container's working directory
    found = _exec(alice, job["id"], command="echo $((6*7)); id -u; id -g; pwd; cat /tmp/job-pwd")
    assert found["exit_code"] == 0, found
    answer, uid, gid, here, the_jobs = found["output"].split()
    assert (answer, uid, gid, here) == ("42", "1000", "100", the_jobs)
    events = alice.call("GET", f"/jobs/{job['id']}/events").json()["events"]
    execs = [e for e in events if e["kind"] == "exec"]
    assert [e["message"] for e in execs][:2] == [
        "exec by alice: sh -c 'echo hi; echo oops >&2; exit 3'",
        "exec by alice: echo $((6*7)); id -u; id -g; pwd; cat /tmp/job-pwd",
    ]
    assert all(e["state"] == "RUNNING" and e["reason"] == "EXEC" for e in execs)


def test_admin_may_exec_into_anyones_job(hub, alice, job):
    r = requests.post(
        f"{hub.url}/services/gpulab/api/jobs/{job['id']}/exec",
        headers={"Authorization": f"token {hub.admin_token}"},
        json={"command": ["true"]},
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text


def test_a_time_out_kills_the_command_and_what_it_started(alice, job):
    found = _exec(alice, job["id"], command="sleep 301 & sleep 302", timeout=1.5)
    assert found == {"exit_code": None, "output": "", "truncated": False, "timed_out": True}
    left = _exec(alice, job["id"], command=PROCESSES)["output"]
    assert "sleep 301" not in left and "sleep 302" not in left, left


def test_output_is_capped(alice, job):
    found = _exec(alice, job["id"], command="head -c 3000000 /dev/zero | tr '\\0' x; exit 5")
    assert found["exit_code"] == 5 and found["truncated"] is True
    assert found["output"] == "x" * 1024 * 1024


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "command"),
        ({"command": []}, "command"),
        ({"command": "   "}, "command"),
        ({"command": ["ls", 3]}, "command"),
        ({"command": ["ls", "a\0b"]}, "command"),
        ({"command": 42}, "command"),
        ({"command": ["x"] * 257}, "command"),
        ({"command": ["true"], "timeout": 0}, "timeout"),
        ({"command": ["true"], "timeout": 601}, "timeout"),
        ({"command": ["true"], "timeout": True}, "timeout"),
        ({"command": ["true"], "timeout": "10"}, "timeout"),
        ({"command": ["true"], "user": "root"}, "user"),
    ],
)
def test_bad_requests_are_clear_400s(alice, job, body, field):
    r = alice.call("POST", f"/jobs/{job['id']}/exec", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["field"] == field and r.json()["message"], r.text


def test_others_get_the_404_of_a_missing_job(hub, alice, bob, job):
    missing = bob.call("POST", "/jobs/j000000000000/exec", json={"command": ["id"]})
    theirs = bob.call("POST", f"/jobs/{job['id']}/exec", json={"command": ["id"]})
    assert missing.status_code == theirs.status_code == 404
    assert theirs.json()["message"] == missing.json()["message"].replace("j000000000000", job["id"])
    assert _refused(hub, job["id"], bob.token) == (
        404,
        {"status": 404, "message": theirs.json()["message"]},
    )
    assert _refused(hub, job["id"], None)[0] == 401
    events = alice.call("GET", f"/jobs/{job['id']}/events").json()["events"]
    assert not [e for e in events if "bob" in e["message"]]


def test_a_foreign_origin_is_refused(hub, alice, job):
    code, body = _refused(hub, job["id"], alice.token, headers={"Origin": "http://evil.example"})
    assert code == 403 and "cross-origin" in body["message"]
    code, _ = _refused(
        hub,
        job["id"],
        alice.token,
        headers={"Origin": f"http://127.0.0.1:{hub.port}.evil.example"},
    )
    assert code == 403
    # the same origin is let through
    assert _ws(hub, job["id"], alice.token, headers={"Origin": f"http://127.0.0.1:{hub.port}"})[0]


def test_a_job_not_running_is_a_409(hub, alice):
    done = alice.submit(command=["true"])
    alice.wait(done["id"])
    r = alice.call("POST", f"/jobs/{done['id']}/exec", json={"command": ["id"]})
    assert r.status_code == 409 and "is DONE" in r.json()["message"], r.text
    code, body = _refused(hub, done["id"], alice.token)
    assert code == 409 and "is DONE" in body["message"]


def _cli_env(hub, token: str) -> dict[str, str]:
    return {**os.environ, "GPULAB_URL": hub.url, "GPULAB_TOKEN": token, "TERM": "xterm"}


def test_cli_exec_passes_the_exit_code_through(hub, alice, job):
    run = subprocess.run(
        [GPULAB, "job", "exec", job["id"], "--", "sh", "-c", "echo out; echo err >&2; exit 7"],
        env=_cli_env(hub, alice.token),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 7, run.stderr
    assert sorted(run.stdout.splitlines()) == ["err", "out"]
    run = subprocess.run(
        [GPULAB, "job", "exec", "--timeout", "1", job["id"], "--", "sleep", "30"],
        env=_cli_env(hub, alice.token),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 124 and "time-out" in run.stderr, run.stderr


def test_cli_shell_through_a_pseudo_terminal(hub, alice, job):
    shell = pexpect.spawn(
        GPULAB,
        ["job", "shell", job["id"]],
        env=_cli_env(hub, alice.token),
        dimensions=(30, 100),
        timeout=30,
    )
    try:
        shell.expect(r"\$ ")  # the prompt
        shell.sendline("echo $((6*7))")
        shell.expect("42\r\n")  # the typed line holds $((6*7)), not 42
        shell.sendline("stty size")
        shell.expect("30 100\r\n")
        shell.setwinsize(40, 120)  # SIGWINCH: the CLI tells the service
        shell.sendline("sleep 1; stty size")
        shell.expect("40 120\r\n")
        shell.sendline("exit 3")
        shell.expect(pexpect.EOF)
    finally:
        shell.close()
    assert shell.exitstatus == 3, shell.before
    events = alice.call("GET", f"/jobs/{job['id']}/events").json()["events"]
    assert "shell opened by alice" in [e["message"] for e in events if e["kind"] == "shell"]


#: frames a flooding client sends at most, and for how long (the old unbounded queue took all
#: of them: +315 MiB for one shell, issue 26), and how long the unread shell is then held
FLOOD_FRAMES, FLOOD_SECONDS, HOLD_SECONDS = 256, 20.0, 8.0
#: how much the service may grow for one shell whose client sends 1 MiB frames and reads
#: nothing: the frame tornado is reading, the one being queued and the bounded input queue
#: (runtime.execution.MAX_PENDING_INPUT), with room for the allocator's slack
SHELL_RSS_BOUND = 32 * 2**20


def test_an_unread_shell_holds_its_input_back_without_growing_the_service(hub, alice, job):
    """``cat`` echoes the input back; the client sends 1 MiB frames and reads none of the
    output: once the pipes are full the service stops reading the client (back-pressure)
    instead of queueing its frames. Then every byte sent comes back, in order."""
    url = f"ws://127.0.0.1:{hub.port}/services/gpulab/api/jobs/{job['id']}/shell"
    auth = {"Authorization": f"token {alice.token}"}
    letters = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

    def frame(i: int) -> bytes:  # 1 MiB of letters (no terminal control key), each its own
        return (letters[i % 61 :] + letters[: i % 61]) * (2**20 // 62) + b"%06d" % i + b"\n" * 2

    async def flood() -> tuple[int, int, str, list[int], bytes]:
        conn = await websocket_connect(HTTPRequest(url, headers=auth))
        try:
            # a raw terminal (no echo, no line editing): cat's output is exactly its input
            await conn.write_message(b"stty raw -echo; echo RE''ADY; exec cat\r", binary=True)
            seen = b""
            while b"READY\n" not in seen:
                seen += await asyncio.wait_for(conn.read_message(), 30)
            assert seen.endswith(b"READY\n"), seen
            before = hub.service_rss()
            samples, sent, stalled = [], 0, None
            deadline = time.monotonic() + FLOOD_SECONDS
            while sent < FLOOD_FRAMES and time.monotonic() < deadline:
                pending = conn.write_message(frame(sent), binary=True)
                done, _ = await asyncio.wait([pending], timeout=3)
                samples.append(hub.service_rss())
                sent += 1
                if not done:  # the service no longer reads this client
                    stalled = pending
                    break
            if stalled is None:  # all of it was taken: no back-pressure (checked below)
                return before, sent, "", samples, b""
            for _ in range(int(HOLD_SECONDS / 0.5)):  # held unread: the service stays flat
                await asyncio.sleep(0.5)
                samples.append(hub.service_rss())
            assert not stalled.done(), "the service read on while the shell's input was full"
            # read now: everything sent comes back, in order (no input was dropped)
            want = b"".join(frame(i) for i in range(sent))
            got = bytearray()
            end = time.monotonic() + 60
            while len(got) < len(want) and time.monotonic() < end:
                message = await asyncio.wait_for(conn.read_message(), 30)
                if not isinstance(message, bytes):
                    break  # closed, or the shell ended
                got += message
            await stalled
            return before, sent, hashlib.sha256(want).hexdigest(), samples, bytes(got)
        finally:
            conn.close()

    before, sent, want_hash, samples, got = run_async(flood())
    grew = max(samples) - before
    print(
        f"service RSS {before / 2**20:.0f} MiB before; {sent} frames of 1 MiB taken (the "
        f"rest held back); +{grew / 2**20:.1f} MiB at most over {len(samples)} samples"
    )
    assert grew < SHELL_RSS_BOUND, [s // 2**20 for s in samples]
    assert want_hash, f"all {sent} frames were taken: no back-pressure"
    assert hashlib.sha256(got).hexdigest() == want_hash, f"{len(got)} bytes came back"
