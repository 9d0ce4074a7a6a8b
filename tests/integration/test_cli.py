"""The ``gpulab`` command line against a real hub, service and Docker engine.

One hub for the module; the CLI runs as a subprocess (``python -m gpulab.cli``) with its
configuration in the environment (GPULAB_URL/GPULAB_TOKEN) or in a config file written by
``gpulab login``. The test host has no GPUs: every job asks for ``--gpu 0``, except the
distributed one, whose workers get one of two fake GPUs each (gpu_mode "env", as in
test_jobs_distributed.py), so that its per-rank devices are real ledger decisions.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.hub]

CONFIG = (
    "c.GpulabSettings.supervisor_interval = 0.2\n"
    'c.GpulabSettings.gpu_devices = [{"id": "0"}, {"id": "1"}]\n'
    'c.GpulabSettings.gpu_mode = "env"\n'
)


@pytest.fixture(scope="module")
def hub(hub_with):
    return hub_with(CONFIG)


@pytest.fixture(scope="module")
def tokens(hub):
    return {"alice": hub.create_user("alice"), "bob": hub.create_user("bob")}


@pytest.fixture(scope="module")
def no_config(tmp_path_factory):
    """A config file path that does not exist, so the developer's own is never read."""
    return str(tmp_path_factory.mktemp("noconfig") / "config.json")


def base_env(config: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GPULAB_", "JUPYTERHUB_")) and k != "XDG_CONFIG_HOME"
    }
    env["GPULAB_CONFIG"] = config
    return env


def cli(*args: str, env: dict[str, str], timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpulab.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def alice(hub, tokens, no_config):
    return {**base_env(no_config), "GPULAB_URL": hub.url, "GPULAB_TOKEN": tokens["alice"]}


@pytest.fixture(scope="module")
def bob(hub, tokens, no_config):
    return {**base_env(no_config), "GPULAB_URL": hub.url, "GPULAB_TOKEN": tokens["bob"]}


def ok(*args: str, env: dict[str, str]) -> str:
    r = cli(*args, env=env)
    assert r.returncode == 0, (args, r.returncode, r.stdout, r.stderr)
    return r.stdout


def get_json(job_id: str, env: dict[str, str]) -> dict:
    return json.loads(ok("job", "get", job_id, "-o", "json", env=env))


def wait_state(job_id: str, env: dict[str, str], states: set[str], timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    job: dict = {}
    while time.monotonic() < deadline:
        job = get_json(job_id, env)
        if job["state"] in states:
            return job
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} never reached {states}: {job.get('state')}")


def header_columns(table: str) -> list[str]:
    return table.splitlines()[0].split()


def test_run_follow_then_list_get_events_logs(alice):
    r = cli(
        "job", "run", "--gpu", "0", "--cpu", "0.5", "--memory", "512M", "--name", "greeter",
        "-l", "suite=cli", "-e", "GREETING=hello", "--timeout", "5m", "--follow",
        "--", "sh", "-c", 'echo "$GREETING from gpulab"; echo to-stderr >&2',
        env=alice,
    )  # fmt: skip
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "hello from gpulab" in r.stdout
    assert "to-stderr" in r.stdout  # the job's output, both streams, on stdout
    assert "DONE" in r.stderr
    job_id = r.stderr.split()[1]
    assert job_id.startswith("j")

    # list: an aligned table by default, the API's JSON with -o json
    table = ok("job", "list", env=alice)
    assert header_columns(table)[:5] == ["ID", "NAME", "STATE", "GPUS", "SUBMITTED"]
    row = next(line for line in table.splitlines() if line.startswith(job_id))
    assert row.split()[1:4] == ["greeter", "DONE", "0"]
    lines = table.splitlines()
    state_col = lines[0].index("STATE")
    assert row[state_col:].startswith("DONE")

    jobs = json.loads(ok("job", "list", "-o", "json", env=alice))["jobs"]
    mine = next(j for j in jobs if j["id"] == job_id)
    assert mine["spec"]["labels"] == {"suite": "cli"}
    assert mine["spec"]["env"] == {"GREETING": "hello"}
    assert mine["spec"]["resources"] == {"cpus": 0.5, "memory": "512M", "gpus": 0}
    assert mine["spec"]["timeout"] == 300
    # filters go to the API
    assert job_id in ok("job", "list", "-l", "suite=cli", "--state", "DONE", env=alice)
    assert job_id not in ok("job", "list", "-l", "suite=other", env=alice)
    assert job_id not in ok("job", "list", "--state", "RUNNING,QUEUED", env=alice)

    details = ok("job", "get", job_id, env=alice)
    assert "State:" in details and "DONE" in details
    assert "greeter" in details and "0 GPU" in details
    job = get_json(job_id, env=alice)
    assert job["state"] == "DONE" and job["exit_code"] == 0
    assert [e["state"] for e in job["history"]][-1] == "DONE"

    events = ok("job", "events", job_id, env=alice)
    assert header_columns(events)[:4] == ["TIME", "KIND", "STATE", "REASON"]
    assert "RUNNING" in events and "DONE" in events
    ev = json.loads(ok("job", "events", job_id, "-o", "json", env=alice))
    assert ev["id"] == job_id and ev["events"][0]["state"] == "QUEUED"

    assert "hello from gpulab" in ok("job", "logs", job_id, env=alice)
    r = cli("job", "logs", "-f", job_id, env=alice)
    assert r.returncode == 0 and "hello from gpulab" in r.stdout


def test_failing_job_follow_exits_1(alice):
    r = cli(
        "job", "run", "--gpu", "0", "--follow", "--", "sh", "-c", "echo about to fail; exit 3",
        env=alice,
    )  # fmt: skip
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "about to fail" in r.stdout
    assert "FAILED" in r.stderr and "exit code 3" in r.stderr
    job = get_json(r.stderr.split()[1], env=alice)
    assert job["state"] == "FAILED" and job["exit_code"] == 3


def test_stop_resume_rerun_delete(alice):
    # follow a long job, then Ctrl-C: the CLI stops following (130), the job keeps running
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpulab.cli", "job", "run", "--gpu", "0", "--name", "sleeper",
         "--follow", "--", "sh", "-c", "echo started; exec sleep 600"],
        env=alice, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout.readline() == "started\n"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    job_id = err.split()[1]
    assert f"stopped following job {job_id}, which keeps running" in err
    assert job_id.startswith("j") and get_json(job_id, alice)["state"] == "RUNNING"

    # a running job cannot be deleted: the API says why
    r = cli("job", "delete", job_id, env=alice)
    assert r.returncode == 1 and "interrupt it first" in r.stderr

    out = ok("job", "stop", "--wait", job_id, env=alice)
    assert out.strip() == f"job {job_id}: INTERRUPTED"
    assert get_json(job_id, alice)["state"] == "INTERRUPTED"
    r = cli("job", "stop", job_id, env=alice)  # nothing left to interrupt: 409
    assert r.returncode == 1 and "nothing to interrupt" in r.stderr

    assert ok("job", "resume", job_id, env=alice).strip() == f"job {job_id}: QUEUED"
    wait_state(job_id, alice, {"RUNNING"})
    ok("job", "stop", job_id, env=alice)  # without --wait: the interruption is under way
    wait_state(job_id, alice, {"INTERRUPTED"})

    copy = ok("job", "rerun", job_id, env=alice).strip()
    assert copy.startswith("j") and copy != job_id
    copy_job = get_json(copy, alice)
    assert copy_job["spec"]["command"] == ["sh", "-c", "echo started; exec sleep 600"]
    assert copy_job["state"] in {"QUEUED", "INITIALIZING", "PENDING", "RUNNING"}
    stopped = json.loads(ok("job", "stop", "--wait", copy, "-o", "json", env=alice))
    assert stopped["state"] == "INTERRUPTED"

    for jid in (job_id, copy):
        assert ok("job", "delete", jid, env=alice).strip() == f"job {jid} deleted"
        r = cli("job", "get", jid, env=alice)
        assert r.returncode == 1 and f"no job {jid}" in r.stderr


def test_api_errors_name_the_field(alice):
    r = cli("job", "run", "--gpu", "0", "--retries", "500", "--", "true", env=alice)
    assert r.returncode == 1
    assert "retries must be from 0 to 128" in r.stderr and "field: retries" in r.stderr
    assert r.stdout == ""
    r = cli("job", "run", "--gpu", "0", "-e", "GPULAB_SECRET=x", "--", "true", env=alice)
    assert r.returncode == 1 and "field: env.GPULAB_SECRET" in r.stderr
    r = cli("job", "list", "--state", "SLEEPY", env=alice)
    assert r.returncode == 1 and "unknown state SLEEPY" in r.stderr
    # usage errors are the CLI's own: exit 2
    r = cli("job", "run", "--gpu", "0", "-e", "NOVALUE", "--", "true", env=alice)
    assert r.returncode == 2 and "NAME=VALUE" in r.stderr
    r = cli("job", "run", "--gpu", "0", env=alice)
    assert r.returncode == 2 and "needs a command" in r.stderr
    r = cli("job", "run", "--framework", "python", "--image", "x", "--", "true", env=alice)
    assert r.returncode == 2


def test_other_users_job_is_not_found(alice, bob):
    job_id = ok("job", "run", "--gpu", "0", "--", "true", env=alice).strip()
    for args in (("job", "get", job_id), ("job", "logs", job_id), ("job", "stop", job_id)):
        r = cli(*args, env=bob)
        assert r.returncode == 1 and f"no job {job_id}" in r.stderr, (args, r.stderr)
    assert job_id not in ok("job", "list", env=bob)
    # listing everyone's jobs is for admins
    r = cli("job", "list", "--all", env=bob)
    assert r.returncode == 1 and "only admins" in r.stderr


def test_usage_and_notebooks(alice):
    assert header_columns(ok("usage", env=alice)) == ["USER", "BILLED", "MINUTES", "JOBS",
                                                      "NOTEBOOKS"]  # fmt: skip
    usage = json.loads(ok("usage", "-o", "json", env=alice))
    assert usage["user"] == "alice" and usage["billed_minutes"] >= 0
    assert header_columns(ok("notebook", "list", env=alice))[:3] == ["USER", "SERVER", "STATE"]
    assert json.loads(ok("-o", "json", "notebook", "list", env=alice)) == {
        "notebooks": [],
        "total": 0,
    }


def test_notebook_start_list_logs_stop(hub, tokens, no_config):
    """A notebook from the command line: started with the form's options and a label
    (following the hub's progress), listed with its label, its output read, stopped; a label
    the jobs' rules refuse is refused naming the field, and someone else's output is a 404."""
    env = {**base_env(no_config), "GPULAB_URL": hub.url, "GPULAB_TOKEN": hub.create_user("nora")}
    bob = {**env, "GPULAB_TOKEN": tokens["bob"]}
    r = cli("notebook", "start", "lab", "--framework", "python", "--flavor", "cpu-small",
            "-l", "team=a", "--wait", env=env)  # fmt: skip
    assert r.returncode == 0, (r.stdout, r.stderr)
    # the URL of the hub's last progress event (a start this quick has no other: the hub
    # answered the POST once it ran)
    assert r.stdout == f"{hub.url}/user/nora/lab/\n"

    row = ok("notebook", "list", "-l", "team=a", env=env).splitlines()[1]
    assert row.split()[1:3] == ["lab", "RUNNING"] and row.split()[-1] == "team=a"
    listed = json.loads(ok("notebook", "list", "-o", "json", "-l", "team=b", env=env))
    assert listed == {"notebooks": [], "total": 0}

    assert "Jupyter" in ok("notebook", "logs", "lab", "--tail", "500", env=env)
    r = cli("notebook", "logs", "lab", "--user", "nora", env=bob)
    assert r.returncode == 1 and "no notebook lab for nora" in r.stderr

    r = cli("notebook", "start", "other", "-l", "Team=a", env=env)
    assert r.returncode == 1 and "labels.Team: label key 'Team'" in r.stderr, r.stderr

    assert ok("notebook", "stop", "lab", "--wait", env=env) == "notebook lab: STOPPED\n"
    r = cli("notebook", "logs", "lab", env=env)
    assert r.returncode == 1 and "no container now (STOPPED)" in r.stderr


def test_missing_token_and_unreachable_hub(hub, no_config):
    env = {**base_env(no_config), "GPULAB_URL": hub.url}
    r = cli("job", "list", env=env)
    assert r.returncode == 2
    assert "no API token" in r.stderr and "GPULAB_TOKEN" in r.stderr and "gpulab login" in r.stderr

    r = cli("job", "list", env={**env, "GPULAB_TOKEN": "not-a-token"})
    assert r.returncode == 1 and "refused the API token" in r.stderr
    assert "not-a-token" not in r.stderr + r.stdout

    closed = "http://127.0.0.1:9"  # discard port: nothing listens
    r = cli("job", "list", env={**env, "GPULAB_URL": closed, "GPULAB_TOKEN": "x"})
    assert r.returncode == 1
    assert f"cannot reach gpulab at {closed}" in r.stderr and "refused" in r.stderr


def test_login_writes_a_private_config_that_is_used(hub, tokens, tmp_path):
    config = tmp_path / "cfg" / "config.json"
    env = base_env(str(config))
    token = tokens["alice"]

    r = cli("login", "--url", hub.url, "--token", "wrong", env=env)
    assert r.returncode == 1 and "refused the API token" in r.stderr
    assert not config.exists()

    r = cli("login", "--url", hub.url + "/hub/", "--token", token, env=env)
    assert r.returncode == 0, r.stderr
    assert token not in r.stdout + r.stderr
    assert "alice" in r.stderr
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert json.loads(config.read_text()) == {"url": hub.url, "token": token}

    # no GPULAB_URL/GPULAB_TOKEN: the file is used
    usage = json.loads(ok("usage", "-o", "json", env=env))
    assert usage["user"] == "alice"
    # the environment wins over the file
    r = cli("usage", env={**env, "GPULAB_TOKEN": "not-a-token"})
    assert r.returncode == 1 and "refused the API token" in r.stderr

    # the token can come from stdin, keeping it out of the shell history
    config.unlink()
    r = subprocess.run(
        [sys.executable, "-m", "gpulab.cli", "login", "--url", hub.url, "--token", "-"],
        env=env,
        input=token + "\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert json.loads(config.read_text())["token"] == token


def test_secrets_ports_and_options_from_the_command_line(hub, alice):
    value = "cli-secret-" + "z9" * 12
    digest = hashlib.sha256(value.encode()).hexdigest()[:16]  # the command carries no value
    r = subprocess.run(
        [sys.executable, "-m", "gpulab.cli", "secret", "set", "token"],
        env=alice,
        input=value + "\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and "secret token saved" in r.stdout, (r.stdout, r.stderr)
    assert value not in r.stdout + r.stderr
    listed = ok("secret", "list", env=alice)
    assert header_columns(listed) == ["NAME", "CREATED", "UPDATED"] and "token" in listed
    assert value not in listed
    r = cli(
        "job", "run", "--gpu", "0", "--cpu", "0.5", "--memory", "512M", "--follow",
        "--secret-env", "TOKEN=token", "--port", "web=8080", "--share", "bob",
        "--workdir", "/tmp", "--read-only",
        "--", "sh", "-c",
        'pwd; [ "$(printf %s "$TOKEN" | sha256sum | cut -c1-16)" = ' + digest + " ] && "
        "echo token-ok; echo $GPULAB_PORT_WEB",
        env=alice,
    )  # fmt: skip
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert r.stdout.split() == ["/tmp", "token-ok", "8080"]
    job_id = r.stderr.split()[1]
    details = ok("job", "get", job_id, env=alice)
    assert "TOKEN=<secret token>" in details
    assert f"web {hub.url}/services/gpulab/jobs/{job_id}/ports/web/" in details
    assert value not in details
    spec = get_json(job_id, env=alice)["spec"]
    assert spec["ports"] == [{"port": 8080, "name": "web", "users": ["bob"], "groups": []}]
    assert spec["working_dir"] == "/tmp" and spec["read_only_rootfs"] is True
    bad = cli("job", "run", "--port", "web", "--", "true", env=alice)
    assert bad.returncode == 2 and "NAME=VALUE" in bad.stderr
    assert "deleted" in ok("secret", "delete", "token", env=alice)
    gone = cli("secret", "delete", "token", env=alice)
    assert gone.returncode == 1 and "no secret token" in gone.stderr


def test_distributed_job_workers_ranks_and_their_logs(alice, pytorch_image, docker_client):
    """``--workers 2``: a gloo all_reduce over two containers (the sum, 3, proves both took
    part), followed to DONE; its logs merged (each line once, prefixed) or one rank's; its
    workers in ``job get``; its GPUs in all in ``job list``."""
    from ..support.containers import gpus_of
    from ..support.programs import ALL_REDUCE

    r = cli(
        "job", "run", "--framework", "pytorch", "--workers", "2", "--gpu", "1", "--cpu", "0.5",
        "--memory", "1G", "--name", "ddp", "--timeout", "5m", "--follow",
        "--", "python3", "-c", ALL_REDUCE,
        env=alice, timeout=240,
    )  # fmt: skip
    assert r.returncode == 0, (r.stdout, r.stderr)
    job_id = r.stderr.split()[1]
    assert f"job {job_id} DONE" in r.stderr
    # followed: every rank's lines, each once, prefixed
    assert "[rank 0] rank 0 of 2 on worker-0" in r.stdout, r.stdout
    assert "[rank 1] rank 1 of 2 on worker-1" in r.stdout, r.stdout
    assert r.stdout.count("sum 3") == 2, r.stdout

    merged = ok("job", "logs", job_id, env=alice)
    assert "[rank 0] rank 0 of 2" in merged and "[rank 1] rank 1 of 2" in merged, merged
    one = ok("job", "logs", job_id, "--rank", "1", env=alice)
    assert "rank 1 of 2 on worker-1" in one, one
    assert "rank 0 of 2" not in one and "[rank" not in one, one
    followed = cli("job", "logs", "-f", job_id, "--rank", "0", env=alice)
    assert followed.returncode == 0 and "rank 0 of 2" in followed.stdout, followed
    assert "rank 1 of 2" not in followed.stdout
    bad = cli("job", "logs", job_id, "--rank", "2", env=alice)
    assert bad.returncode == 1 and f"job {job_id} has no rank 2: it has 2 workers" in bad.stderr

    job = get_json(job_id, alice)
    assert job["state"] == "DONE" and job["spec"]["workers"] == 2
    assert [w["rank"] for w in job["workers"]] == [0, 1]
    # one GPU each, different ones (released at the end: the containers say which they had)
    assert sorted(gpus_of(docker_client, job)) == ["0", "1"]
    details = ok("job", "get", job_id, env=alice)
    lines = details.splitlines()
    assert any(line.split()[:2] == ["Workers:", "2"] for line in lines), details
    assert "1 GPU, 0.5 CPU, 1G memory per worker (2 workers: 2 GPU in all)" in details
    head = lines.index(next(ln for ln in lines if ln.split()[:2] == ["RANK", "CONTAINER"]))
    for w, line in zip(job["workers"], lines[head + 1 : head + 3], strict=True):
        shown = [w["node"] or "-", ",".join(w["devices"]) or "-"]
        assert line.split() == [str(w["rank"]), w["container"], *shown], details
    assert job["workers"][1]["container"] == job["workers"][0]["container"] + "-r1"

    table = ok("job", "list", env=alice)
    row = next(line for line in table.splitlines() if line.startswith(job_id))
    assert row[table.splitlines()[0].index("GPUS") :].startswith("2 (2x1) "), table

    # what can never run, or would clash with what gpulab sets, is refused by the API
    r = cli("job", "run", "--workers", "3", "--gpu", "1", "--", "true", env=alice)
    assert r.returncode == 1 and "field: workers" in r.stderr, r.stderr
    r = cli(
        "job", "run", "--workers", "2", "--gpu", "0", "-e", "MASTER_ADDR=x", "--", "true",
        env=alice,
    )  # fmt: skip
    assert r.returncode == 1 and "field: env.MASTER_ADDR" in r.stderr, r.stderr
    r = cli("job", "run", "--workers", "65", "--", "true", env=alice)
    assert r.returncode == 2 and "must be at most 64" in r.stderr, r.stderr


def test_exec_in_one_rank_of_a_running_distributed_job(alice):
    job_id = ok(
        "job", "run", "--workers", "2", "--gpu", "0", "--cpu", "0.5", "--memory", "512M",
        "--", "sh", "-c", "echo up; exec sleep 600",
        env=alice,
    ).strip()  # fmt: skip
    try:
        wait_state(job_id, alice, {"RUNNING"}, timeout=90)
        for rank in ("0", "1"):
            out = ok(
                "job", "exec", "--rank", rank, job_id, "--", "sh", "-c", "echo $RANK", env=alice
            )
            assert out.strip() == rank
        assert ok("job", "exec", job_id, "--", "sh", "-c", "echo $RANK", env=alice).strip() == "0"
        events = ok("job", "events", job_id, env=alice)
        assert "(rank 1)" in events, events
    finally:
        ok("job", "stop", "--wait", job_id, env=alice)
