"""Training jobs end to end: a real hub, the gpulab service it starts, the Docker engine."""

from __future__ import annotations

import json
import time

import pytest
import requests

from ..conftest import _need, wait_until
from ..support.api import TERMINAL, Api, states
from ..support.ports import free_port
from ..support.receivers import WebhookReceiver
from ..support.registry import PrivateRegistry, push, registry_missing, tiny_image

pytestmark = [pytest.mark.docker, pytest.mark.hub]

CONFIG = """
c.GpulabSettings.gpu_devices = [{"id": "0"}, {"id": "1"}]
c.GpulabSettings.gpu_models = {"0": "A100", "1": "T4"}
c.GpulabSettings.gpu_mode = "env"
c.GpulabSettings.supervisor_interval = 0.2
c.GpulabSettings.fair_share_interval = 1
c.GpulabSettings.preemption_grace = 2
c.GpulabSettings.job_container_retention = 3600
c.GpulabSettings.user_job_quotas = {"qa": {"gpus": 1}, "pre": {"gpus": 0}}
c.GpulabSettings.max_resources = {"cpus": 2, "memory": "4G", "gpus": 2}
c.GpulabSettings.notify_webhook_hosts = ["127.0.0.1:*"]
c.GpulabSettings.notify_webhook_networks = ["127.0.0.1/32"]
"""
#: the private registry's port (test_a_private_image_...): the one registry the site allows
REGISTRY_PORT = free_port()
CONFIG += f'c.GpulabSettings.image_registries = ["127.0.0.1:{REGISTRY_PORT}/team/*"]\n'


@pytest.fixture(scope="module")
def hub(hub_with):
    return hub_with(CONFIG, fresh=True)


@pytest.fixture(scope="module")
def alice(hub):
    return Api(hub, "alice")


@pytest.fixture(scope="module", autouse=True)
def hung_job(alice):
    """A job that hangs (no output, no CPU): restarted in place 3 times, then failed, which
    takes 4 hang periods of at least 10 s (the API's least). Submitted when the module starts,
    so that those 40 s pass while the tests before test_hang_restarted_in_place_then_failed
    run; it asks for no GPU, as alice, whose jobs those tests look up by id. It must end before
    test_service_sigkill_loses_no_job_and_runs_none_twice kills the hub (a restarted
    supervisor counts the hang restarts in a row from 0 again)."""
    return alice.submit(command=["sleep", "600"], hang_restart={"enabled": True, "period": 10})


def test_happy_path_pulls_input_and_pushes_output(hub, alice, docker_client):
    shared = hub.workdir / "data/objects/shared/mnist"
    shared.mkdir(parents=True)
    (shared / "train.csv").write_text("1,2,3\n")
    job = alice.submit(
        name="train",
        command=["sh", "-c", "wc -c < /data/train.csv > /out/result.txt; echo trained"],
        volumes=["shared@local/mnist:/data", "scratch@local/alice/run1:/out:rw"],
        labels={"project": "mnist"},
        env={"EPOCHS": "3"},
    )
    assert job["state"] == "QUEUED" and job["spec"]["resources"]["gpus"] == 0
    done = alice.wait(job["id"])
    assert done["state"] == "DONE", done
    assert states(done) == ["QUEUED", "INITIALIZING", "PENDING", "RUNNING", "FINALIZING", "DONE"]
    assert done["exit_code"] == 0 and done["billed_minutes"] == 1
    # the transfers' progress is in its history: each volume's pull and push, with counts
    progress = [e["message"] for e in done["history"] if e["kind"] == "progress"]
    assert any(m.startswith("pulling ") for m in progress), progress
    assert any(m.startswith("pulled ") and "1 transferred" in m for m in progress), progress
    assert any(m.startswith("pushed ") and "1 transferred" in m for m in progress), progress
    out = hub.workdir / "data/objects/scratch/alice/run1/result.txt"
    assert out.read_text().strip() == "6"
    assert alice.call("GET", f"/jobs/{job['id']}/logs").text == "trained\n"
    # the container carries the gpulab labels and the user's, runs as uid 1000, limited
    c = docker_client.containers.get(done["container"] or f"{hub.instance}-job-{job['id']}")
    assert c.labels["org.gpulab.kind"] == "job" and c.labels["project"] == "mnist"
    assert c.attrs["Config"]["User"] == "1000:100"
    assert c.attrs["HostConfig"]["Memory"] == 512 * 1024**2
    # list with filters
    listed = alice.call("GET", "/jobs", params={"state": "DONE", "label": "project=mnist"})
    assert [j["id"] for j in listed.json()["jobs"]] == [job["id"]]
    assert alice.call("GET", "/jobs", params={"label": "project=other"}).json()["jobs"] == []
    usage = alice.call("GET", "/usage").json()
    assert usage["jobs_billed_minutes"] >= 1
    # this month's report, from the kept totals: a user sees only their own row
    report = alice.call("GET", "/usage/report").json()
    assert [r["user"] for r in report["users"]] == ["alice"], report
    assert report["users"][0]["jobs_billed_minutes"] >= 1
    bad = alice.call("GET", "/usage/report", params={"month": "2026-13"})
    assert bad.status_code == 400 and bad.json()["field"] == "month", bad.text
    other = alice.call("GET", "/usage/report", params={"user": "bob"})
    assert other.status_code == 403
    page = requests.get(
        f"{hub.url}/services/gpulab/admin",
        headers={"Authorization": f"token {hub.admin_token}"},
        timeout=30,
    )
    assert page.status_code == 200 and 'data-month-user="alice"' in page.text, page.text[:300]
    # the OpenAPI document is served and names every route
    doc = alice.call("GET", "/openapi.json").json()
    assert "/api/jobs/{job_id}/logs" in doc["paths"]


def test_a_jobs_webhook_gets_one_notice_when_it_ends(alice):
    """The supervisor's transition to DONE hands the notice to the service's sender, which
    POSTs it to a receiver on this host (allowed by the hub's notify_webhook_* settings)."""
    with WebhookReceiver() as hooks:
        job = alice.submit(
            command=["true"], notify={"on": ["done", "failed"], "webhook": hooks.url("/h/t")}
        )
        assert job["spec"]["notify"]["webhook"] == hooks.url("/h/t")
        assert alice.wait(job["id"])["state"] == "DONE"
        [body] = wait_until(hooks.delivered, timeout=20, what="the job's notice")
        assert (body["id"], body["event"], body["state"]) == (job["id"], "done", "DONE")
        assert body["exit_code"] == 0 and "spec" not in body
        assert [p["path"] for p in hooks.posts] == ["/h/t"]


def test_failure_is_retried_then_failed(alice):
    job = alice.submit(command=["sh", "-c", "echo attempt; exit 3"], retries=2)
    end = alice.wait(job["id"])
    assert end["state"] == "FAILED" and end["exit_code"] == 3 and end["restarts"] == 2
    assert states(end).count("RESTARTING") == 2
    assert "exit code 3 after 2 restarts" in end["message"]
    assert alice.call("GET", f"/jobs/{job['id']}/logs").text.count("attempt") == 3


def test_an_array_runs_its_tasks_two_at_once_each_told_its_index_and_parameters(alice):
    sets = [{"lr": 0.1}, {"lr": 0.01, "model": "vit"}, {"lr": 0.001}]
    job = alice.submit(
        command='echo "task $GPULAB_TASK_INDEX of $GPULAB_TASK_COUNT lr=$GPULAB_PARAM_LR '
        '$GPULAB_TASK_PARAMS"',
        parameters=sets,
        parallelism=2,
    )
    assert job["kind"] == "array" and job["spec"]["completions"] == 3
    end = alice.wait(job["id"])
    assert (end["state"], end["exit_code"], end["task_counts"]) == ("DONE", 0, {"DONE": 3}), end
    tasks = end["tasks"]
    assert [(t["index"], t["state"], t["parameters"]) for t in tasks] == [
        (i, "DONE", sets[i]) for i in range(3)
    ]
    for t in tasks:
        i, params = t["index"], json.dumps(sets[t["index"]], separators=(",", ":"))
        log = alice.call("GET", f"/jobs/{t['id']}/logs").text
        assert log == f"task {i} of 3 lr={sets[i]['lr']} {params}\n", log
    # the third started only once one of the first two had ended (parallelism 2)
    seen = [alice.job(t["id"])["history"] for t in tasks]

    def first(history, state):
        return min(e["at"] for e in history if e["state"] == state)

    assert first(seen[2], "INITIALIZING") >= min(first(h, "FINALIZING") for h in seen[:2])
    # one row in the list, its tasks each a job of their own
    listed = [j["id"] for j in alice.call("GET", "/jobs").json()["jobs"]]
    assert job["id"] in listed and not {t["id"] for t in tasks} & set(listed)
    assert alice.job(tasks[1]["id"])["array"] == job["id"]


def test_timeout_interrupts(alice):
    job = alice.submit(command=["sleep", "600"], timeout="2s")
    end = alice.wait(job["id"])
    assert end["state"] == "INTERRUPTED" and end["reason"] == "TIMEOUT", end
    assert states(end)[-4:] == ["TIMEOUT", "INTERRUPTING", "FINALIZING", "INTERRUPTED"]


def test_timeout_with_auto_restart_runs_again_then_interrupts(alice):
    job = alice.submit(command=["sh", "-c", "echo go; sleep 600"], timeout="2s", retries=1)
    end = alice.wait(job["id"])
    assert end["state"] == "INTERRUPTED" and end["restarts"] == 1, end
    assert states(end)[3:] == [
        "RUNNING",
        "TIMEOUT",
        "RESTARTING",
        "RUNNING",
        "TIMEOUT",
        "INTERRUPTING",
        "FINALIZING",
        "INTERRUPTED",
    ]
    assert alice.call("GET", f"/jobs/{job['id']}/logs").text.count("go") == 2


def test_interrupt_resume_rerun_delete(alice):
    job = alice.submit(command=["sh", "-c", "echo run; sleep 600"])
    alice.wait(job["id"], {"RUNNING"})
    r = alice.call("POST", f"/jobs/{job['id']}/interrupt")
    assert r.status_code == 202
    end = alice.wait(job["id"])
    assert end["state"] == "INTERRUPTED" and end["reason"] == "USER_INTERRUPT"
    assert alice.call("POST", f"/jobs/{job['id']}/interrupt").status_code == 409
    r = alice.call("POST", f"/jobs/{job['id']}/resume")
    assert r.status_code == 200 and r.json()["state"] == "QUEUED"
    alice.wait(job["id"], {"RUNNING"})
    alice.call("POST", f"/jobs/{job['id']}/interrupt")
    alice.wait(job["id"])
    clone = alice.call("POST", f"/jobs/{job['id']}/rerun")
    assert clone.status_code == 201 and clone.json()["id"] != job["id"]
    assert clone.json()["spec"]["command"] == job["spec"]["command"]
    # at once: the scheduler may be placing it as the request arrives (200 if still QUEUED,
    # 202 if placed meanwhile); either way it must end INTERRUPTED
    r = alice.call("POST", f"/jobs/{clone.json()['id']}/interrupt")
    assert r.status_code in (200, 202), r.text
    assert alice.wait(clone.json()["id"])["state"] == "INTERRUPTED"
    assert alice.call("DELETE", f"/jobs/{job['id']}").status_code == 204
    assert alice.call("GET", f"/jobs/{job['id']}").status_code == 404


def test_interrupt_right_after_submission_is_never_lost(alice):
    """Submitting wakes the scheduler, which may move the job out of QUEUED while the
    interrupt is being handled: the interrupt must still win, never answer 409."""
    jobs = [alice.submit(command=["sh", "-c", "sleep 600"]) for _ in range(4)]
    for job in jobs:
        r = alice.call("POST", f"/jobs/{job['id']}/interrupt")
        assert r.status_code in (200, 202), r.text
    for job in jobs:
        assert alice.wait(job["id"])["state"] == "INTERRUPTED"


def test_users_do_not_see_each_others_jobs(hub, alice):
    bob = Api(hub, "bob")
    job = alice.submit(command=["true"])
    assert bob.call("GET", f"/jobs/{job['id']}").status_code == 404
    assert bob.call("POST", f"/jobs/{job['id']}/interrupt").status_code == 404
    assert bob.call("DELETE", f"/jobs/{job['id']}").status_code == 404
    assert bob.call("GET", f"/jobs/{job['id']}/logs").status_code == 404
    assert all(j["owner"] == "bob" for j in bob.call("GET", "/jobs").json()["jobs"])
    assert bob.call("GET", "/jobs", params={"user": "alice"}).status_code == 403
    assert bob.call("GET", "/jobs", params={"all": "true"}).status_code == 403
    alice.wait(job["id"])


def test_a_private_image_from_a_registry_runs_with_the_owner_s_secret_only(
    alice, docker_client, tmp_path
):
    """A registry with TLS from a test CA and htpasswd users: a job of its private image runs
    with alice's secret (pinned to the registry's digest, as uid 1000), fails with the
    registry's words with a wrong secret, and a registry the admin did not allow is a 400."""
    if (missing := registry_missing()) is not None:
        _need(missing)
    registry = PrivateRegistry(tmp_path / "registry", {"bob": "s3cret"}, port=REGISTRY_PORT)
    registry.start()
    image = f"{registry.host}/team/private:1"
    try:
        tiny_image(docker_client, f"{registry.host}/team/private", "1")
        push(docker_client, image, {"username": "bob", "password": "s3cret"})
        docker_client.api.remove_image(image)  # the job's pull is a real one
        for name, value in (("regcred", "bob:s3cret"), ("wrongcred", "bob:guess")):
            r = alice.call("PUT", f"/secrets/{name}", json={"value": value})
            assert r.status_code in (200, 201), r.text
        script = 'echo private-ok; while read k v r; do [ "$k" = Uid: ] && echo "uid=$v"; done'
        ok = alice.submit(
            image=image,
            image_pull_secret="regcred",
            command=["sh", "-c", script + " < /proc/self/status; exit 0"],
        )
        wrong = alice.submit(image=image, image_pull_secret="wrongcred", command=["true"])
        assert ok["spec"]["image_pull_policy"] == "if-not-present"
        done, failed = alice.wait(ok["id"]), alice.wait(wrong["id"])
        assert done["state"] == "DONE", done
        assert alice.call("GET", f"/jobs/{ok['id']}/logs").text == "private-ok\nuid=1000\n"
        events = [e["message"] for e in done["history"] if e["reason"] == "IMAGE"]
        assert events[0] == f"preparing image {image}", events
        assert events[-1].startswith(f"image {registry.host}/team/private@sha256:"), events
        assert "ready (pulled " in events[-1], events
        assert failed["state"] == "FAILED" and failed["reason"] == "IMAGE_PULL_FAILED", failed
        assert "unauthorized" in failed["message"].lower(), failed["message"]
        assert "guess" not in json.dumps(failed) and "s3cret" not in json.dumps(done)
        r = alice.call(
            "POST", "/jobs", json={"image": "127.0.0.1:1/team/private:1", "command": ["true"]}
        )
        assert r.status_code == 400 and r.json()["field"] == "image", r.text
        assert f"127.0.0.1:{REGISTRY_PORT}/team/*" in r.json()["message"]
    finally:
        registry.stop()
        for ref in docker_client.images.list(name=f"{registry.host}/team/private"):
            docker_client.images.remove(ref.id, force=True)


@pytest.mark.parametrize(
    "body, field",
    [
        ({"command": []}, "command"),
        ({"command": "true", "name": "Bad Name"}, "name"),
        ({"command": ["true"], "env": {"1X": "y"}}, "env"),
        ({"command": ["true"], "env": {"AWS_SECRET_ACCESS_KEY": "y"}}, "env"),
        ({"command": ["true"], "labels": {"Bad Key": "v"}}, "labels"),
        ({"command": ["true"], "resources": {"gpus": 3}}, "resources.gpus"),
        ({"command": ["true"], "resources": {"gpus": 0, "memory": "-1G"}}, "resources.memory"),
        ({"command": ["true"], "resources": {"gpus": 0, "cpus": "many"}}, "resources.cpus"),
        ({"command": ["true"], "volumes": ["secret@local:/d"]}, "volumes"),
        ({"command": ["true"], "timeout": "forever"}, "timeout"),
        ({"command": ["true"], "retries": 500}, "retries"),
        (
            {"command": ["true"], "hang_restart": {"enabled": True, "period": 1}},
            "hang_restart.period",
        ),
        ({"command": ["true"], "preemptible": "yes"}, "preemptible"),
        ({"command": ["true"], "priority": 101}, "priority"),
        ({"command": ["true"], "image": "alpine:3"}, "image"),
        ({"command": ["true"], "framework": "caffe"}, "framework"),
        ({"command": ["true"], "surprise": 1}, "surprise"),
        ({"command": ["true"], "gpu_model": "H100"}, "gpu_model"),
        ({"command": ["true"], "node_pool": "big"}, "node_pool"),
        ({"command": ["true"], "notify": {"webhook": "http://169.254.169.254/"}}, "notify.webhook"),
        ({"command": ["true"], "notify": {"email": "alice@example.org"}}, "notify.email"),
        (
            {"command": ["true"], "notify": {"webhook": "http://127.0.0.1/", "on": ["x"]}},
            "notify.on",
        ),
    ],
)
def test_bad_values_are_400_naming_the_field(alice, body, field):
    r = alice.call("POST", "/jobs", json=body)
    assert r.status_code == 400, (r.status_code, r.text)
    assert r.json()["field"].startswith(field), r.json()


def test_a_job_for_a_gpu_model_is_placed_on_that_model(alice):
    r = alice.call("POST", "/jobs", json={"command": ["true"], "gpu_model": "H100"})
    assert r.json()["message"] == "gpu_model: no GPU of model 'H100' here; models: A100, T4"
    job = alice.submit(
        command=["true"], gpu_model="t4", resources={"gpus": 1, "cpus": 0.5, "memory": "256M"}
    )
    done = alice.wait(job["id"])
    assert done["state"] == "DONE" and done["spec"]["gpu_model"] == "t4", done
    history = [e for e in done["history"] if e["kind"] == "transition"]
    placed = [e["message"] for e in history if e["state"] == "INITIALIZING"]
    assert placed and placed[0].startswith("placed: GPUs 1"), placed


def test_not_json_is_400(alice):
    r = alice.call("POST", "/jobs", data=b"{not json")
    assert r.status_code == 400 and r.json()["field"] == "body"


def test_quota_queues_in_quota_work_and_rejects_what_never_fits(hub):
    qa = Api(hub, "qa")  # quota: 1 GPU
    r = qa.call("POST", "/jobs", json={"command": ["true"], "resources": {"gpus": 2}})
    assert r.status_code == 400 and "quota allows 1" in r.json()["message"]
    one = {"gpus": 1, "cpus": 0.5, "memory": "256M"}
    first = qa.submit(command=["sleep", "3"], resources=one)
    second = qa.submit(command=["true"], resources=one)
    qa.wait(first["id"], {"RUNNING"})
    time.sleep(1)
    assert qa.job(second["id"])["state"] == "QUEUED"  # waits for the quota, not for a GPU
    assert qa.wait(first["id"])["state"] == "DONE"
    done = qa.wait(second["id"])
    assert done["state"] == "DONE" and len(done["devices"]) == 0  # released at the end


def test_preemptible_job_uses_idle_gpus_and_is_preempted_then_resumes(hub):
    pre, qa = Api(hub, "pre"), Api(hub, "qa")  # pre: quota 0 GPUs; qa: 1
    two = {"gpus": 2, "cpus": 0.5, "memory": "256M"}
    borrower = pre.submit(
        command=["sh", "-c", "echo started; trap 'echo checkpoint; exit 0' TERM; sleep 600 & wait"],
        resources=two,
        preemptible=True,
    )
    running = pre.wait(borrower["id"], {"RUNNING"})
    assert running["over_quota"] and sorted(running["devices"]) == ["0", "1"]
    owner = qa.submit(
        command=["sh", "-c", "echo mine; sleep 2"],
        resources={"gpus": 1, "cpus": 0.5, "memory": "256M"},
    )
    requeued = pre.wait(borrower["id"], {"QUEUED"}, timeout=60)
    assert requeued["reason"] == "PREEMPTED"
    assert qa.wait(owner["id"])["state"] == "DONE"
    # the GPUs are idle again: the same command runs again
    again = pre.wait(borrower["id"], {"RUNNING"}, timeout=60)
    assert states(again).count("RUNNING") == 2
    hist = [(e["state"], e["reason"]) for e in again["history"]]
    assert ("INTERRUPTING", "PREEMPTED") in hist and ("QUEUED", "PREEMPTED") in hist
    pre.call("POST", f"/jobs/{borrower['id']}/interrupt")
    assert pre.wait(borrower["id"])["state"] == "INTERRUPTED"


def test_fair_share_lets_the_lighter_user_go_first_and_shows_each_their_place(hub):
    """heavy holds both GPUs for a few seconds (the supervisor adds them to heavy's recent
    usage), then queues a job before light does: when the GPUs come free, light's starts
    first, and the usage API shows each their factor and place in line."""
    heavy, light = Api(hub, "heavy"), Api(hub, "light")
    two = {"gpus": 2, "cpus": 0.5, "memory": "256M"}
    blocker = heavy.submit(command=["sleep", "5"], resources=two)
    heavy.wait(blocker["id"], {"RUNNING"})
    time.sleep(2.5)  # at least two of the supervisor's additions (fair_share_interval 1 s)
    first = heavy.submit(command=["true"], resources=two)
    second = light.submit(command=["true"], resources=two)
    mine, theirs = heavy.call("GET", "/usage").json(), light.call("GET", "/usage").json()
    fh, fl = mine["fair_share"], theirs["fair_share"]
    assert fh["gpu_hours"] > 0 and fh["factor"] < fl["factor"] == 1.0, (fh, fl)
    assert [q["id"] for q in fh["queued"]] == [first["id"]]
    assert [q["id"] for q in fl["queued"]] == [second["id"]]
    assert fl["queued"][0]["place"] < fh["queued"][0]["place"]  # light is ahead
    assert heavy.wait(blocker["id"])["state"] == "DONE"
    done_light, done_heavy = light.wait(second["id"]), heavy.wait(first["id"])
    assert done_light["state"] == done_heavy["state"] == "DONE"

    def started(job):
        return next(e["at"] for e in job["history"] if e["state"] == "INITIALIZING")

    assert started(done_light) < started(done_heavy)


def test_api_errors_are_json_for_api_clients(hub):
    base = f"{hub.url}/services/gpulab/api"
    r = requests.get(
        f"{base}/jobs", headers={"Authorization": "token nope"}, timeout=30, allow_redirects=False
    )
    assert r.status_code == 401 and "invalid or expired token" in r.json()["message"]
    r = requests.post(f"{base}/jobs", json={"command": ["true"]}, timeout=30)
    assert r.status_code == 401 and "hub API token" in r.json()["message"]
    r = requests.get(f"{base}/jobs/NOT-AN-ID", timeout=30)
    assert r.status_code == 404 and r.json()["message"].startswith("no such path")


def test_finished_containers_are_removed_after_the_delay_records_and_logs_stay(
    hub_with, docker_client
):
    hub = hub_with(
        "c.GpulabSettings.supervisor_interval = 0.2\nc.GpulabSettings.job_container_retention = 2\n",
        fresh=True,
    )
    api = Api(hub, "carl")
    job = api.submit(command=["sh", "-c", "echo kept-output"])
    done = api.wait(job["id"])
    assert done["state"] == "DONE" and done["container"]
    name = done["container"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and api.job(job["id"])["container"]:
        time.sleep(0.5)
    assert api.job(job["id"])["container"] == ""
    with pytest.raises(Exception, match="No such container|Not Found|404"):
        docker_client.containers.get(name)
    # the record and the output stay
    assert api.job(job["id"])["state"] == "DONE"
    assert api.call("GET", f"/jobs/{job['id']}/logs").text == "kept-output\n"


def test_job_data_pulled_from_and_pushed_to_s3(hub_with, tmp_path, docker_client, sync_image):
    import boto3

    from ..support.s3 import TEST_ACCESS_KEY, TEST_SECRET_KEY, MotoS3Server, credentials_file

    # moto keeps one state per process: buckets of their own keep this test apart from others
    s3 = MotoS3Server().start()
    try:
        client = boto3.client(
            "s3",
            endpoint_url=s3.endpoint,
            region_name="us-east-1",
            aws_access_key_id=TEST_ACCESS_KEY,
            aws_secret_access_key=TEST_SECRET_KEY,
        )
        client.create_bucket(Bucket="job-inputs")
        client.put_object(Bucket="job-inputs", Key="cifar/labels.txt", Body=b"cat\ndog\n")
        credentials = credentials_file(tmp_path)
        hub = hub_with(
            "c.GpulabSettings.supervisor_interval = 0.2\n"
            f'c.GpulabSettings.object_stores["s3"] = {{"endpoint_url": "{s3.endpoint}", '
            f'"credentials": {{"file": "{credentials}"}}}}\n'
            'c.GpulabSettings.volume_grants.append({"store": "s3", "bucket": "job-inputs", '
            '"modes": ["ro"]})\n'
            'c.GpulabSettings.volume_grants.append({"store": "s3", "bucket": "job-outputs"})\n'
            # live pushes: a floor and a settle time that a test can wait for
            "c.GpulabSettings.sync_interval_floor = 1\n"
            "c.GpulabSettings.sync_settle = 0.5\n",
            fresh=True,
        )
        api = Api(hub, "sam")
        job = api.submit(
            command=["sh", "-c", "sort -r /data/labels.txt > /out/sorted.txt"],
            volumes=["job-inputs@s3/cifar:/data", "job-outputs@s3/sam/run1:/out:rw"],
        )
        done = api.wait(job["id"])
        assert done["state"] == "DONE", done
        assert "pushed job-outputs@s3/sam/run1:/out:rw: 1 transferred" in done["message"], done
        body = client.get_object(Bucket="job-outputs", Key="sam/run1/sorted.txt")["Body"].read()
        assert body == b"dog\ncat\n"
        # the credentials went to the sync helper only: not the job's container, API or logs
        container = docker_client.containers.get(done["container"])
        seen = json_dump(container.attrs["Config"]["Env"]) + json_dump(done)
        seen += hub.log_file.read_text()
        assert TEST_SECRET_KEY not in seen and TEST_ACCESS_KEY not in seen
        live_push_survives_a_sigkill(api, client, docker_client)
    finally:
        s3.stop()


def live_push_survives_a_sigkill(api: Api, client, docker_client) -> None:
    """A job whose volume is pushed every 2 s writes a checkpoint; once a live push sent it,
    its container is SIGKILLed: the checkpoint is in the store (what it lost: at most the
    interval since), and the job's history says each live push."""
    began = time.monotonic()
    job = api.submit(
        command=["sh", "-c", "echo epoch-1 > /out/ckpt.txt && sleep 600"],
        volumes=["job-outputs@s3/sam/run2:/out:rw"],
        sync_interval=2,
    )
    sent = wait_until(
        lambda: (api.job(job["id"])["live_push"] or {}).get("files") and api.job(job["id"]),
        timeout=60,
        what="a live push that sent the checkpoint",
    )
    assert sent["state"] == "RUNNING" and sent["live_push"]["ok"], sent["live_push"]
    # on demand: its owner's (another user's job is a 404), one at a time
    assert Api(api.hub, "eve").call("POST", f"/jobs/{job['id']}/push").status_code == 404
    # a periodic push (every 2 s) may hold the job's one push slot: asked again until free
    refusals: list[str] = []

    def ask():
        answer = api.call("POST", f"/jobs/{job['id']}/push")
        if answer.status_code == 409:
            refusals.append(answer.text)
            return None
        return [answer]  # a Response is falsy when not ok: wrapped

    [asked] = wait_until(ask, timeout=30, what="a free push slot")
    assert all("already under way" in text for text in refusals), refusals
    assert asked.status_code == 202 and asked.json()["push_requested"], asked.text
    again = api.call("POST", f"/jobs/{job['id']}/push")
    assert again.status_code == 409 and "already under way" in again.text, again.text
    docker_client.containers.get(sent["container"]).kill()  # SIGKILL: no stop push of its own
    body = client.get_object(Bucket="job-outputs", Key="sam/run2/ckpt.txt")["Body"].read()
    assert body == b"epoch-1\n"
    ended = api.wait(job["id"])
    assert ended["state"] == "FAILED" and ended["exit_code"] == 137, ended
    pushes = [e for e in ended["history"] if e["reason"] == "LIVE_PUSH"]
    assert pushes and "job-outputs@s3/sam/run2:/out:rw: 1 transferred" in pushes[0]["message"]
    print(f"live push and SIGKILL: {time.monotonic() - began:.1f} s")


def json_dump(obj) -> str:
    import json

    return json.dumps(obj)


def test_storm_of_concurrent_actions_keeps_every_invariant(hub, docker_client):
    """Interrupt, resume, rerun, delete and push fired at the same jobs from 6 threads: no
    answer outside the contract, every job ends, no GPU stays booked or is booked twice, no
    container is left without a record."""
    import random
    import threading

    from gpulab.db import Database
    from gpulab.gpus.inventory import load_inventory
    from gpulab.gpus.ledger import GpuLedger

    storm = Api(hub, "storm")
    gpu = {"gpus": 1, "cpus": 0.5, "memory": "256M"}
    ids = [storm.submit(command=["sh", "-c", "sleep 1"], resources=gpu)["id"] for _ in range(3)]
    lock, codes, seen = threading.Lock(), [], set(ids)
    rng = random.Random(12)
    begin = time.monotonic()
    stop = begin + 8
    actions = ["interrupt", "resume", "rerun", "delete", "push", "get"]

    def worker(seed: int) -> None:
        r = random.Random(seed)
        while time.monotonic() < stop:
            with lock:
                job_id = r.choice(sorted(seen))
                # reruns at about 2 a second, all through the storm: each answered 201 adds a
                # job ("sleep 1" on one of the 2 GPUs) that the storm acts on too, and the ones
                # left queued run after it, 2 at a time. Unbounded, the storm made 130 jobs
                # and then waited a minute for them to run; ~20 race as well
                rerun = len(seen) - len(ids) < 2 + 2 * (time.monotonic() - begin)
            action = r.choice(actions if rerun else [a for a in actions if a != "rerun"])
            if action == "delete":
                resp = storm.call("DELETE", f"/jobs/{job_id}")
            elif action == "get":
                resp = storm.call("GET", f"/jobs/{job_id}")
            else:
                resp = storm.call("POST", f"/jobs/{job_id}/{action}")
            with lock:
                codes.append((action, resp.status_code, resp.text[:200]))
                if action == "rerun" and resp.status_code == 201:
                    seen.add(resp.json()["id"])

    threads = [threading.Thread(target=worker, args=(rng.random(),)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    allowed = {200, 201, 202, 204, 404, 409}
    bad = [c for c in codes if c[1] not in allowed]
    assert not bad, bad[:5]
    assert len(codes) > 50 and {c[1] for c in codes} >= {202, 409}, sorted({c[1] for c in codes})
    # every job that still exists ends; nothing is left booked or orphaned
    remaining = storm.call("GET", "/jobs", params={"limit": 500}).json()["jobs"]
    for job in remaining:
        end = storm.wait(job["id"], timeout=120)
        assert end["state"] in TERMINAL, end
        assert states(end).count(end["state"]) >= 1
    db = Database(f"sqlite:///{hub.workdir / 'data' / 'gpulab.sqlite'}")
    ledger = GpuLedger(db, hub.instance, load_inventory([{"id": "0"}, {"id": "1"}], False))
    deadline = time.monotonic() + 10
    while ledger.allocations() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ledger.allocations() == [], ledger.allocations()
    known = {j["id"] for j in storm.call("GET", "/jobs", params={"limit": 500}).json()["jobs"]}
    for c in docker_client.containers.list(
        all=True,
        filters={"label": [f"org.gpulab.instance={hub.instance}", "org.gpulab.user=storm"]},
    ):
        assert c.labels.get("org.gpulab.job") in known, (c.name, "has no record")


def test_hang_restarted_in_place_then_failed(alice, hung_job):
    """(Submitted when the module started: see ``hung_job``.)"""
    end = alice.wait(hung_job["id"], timeout=120)
    assert end["state"] == "FAILED" and end["reason"] == "HANG", end
    recoveries = [e for e in end["history"] if e["kind"] == "fault-recovery"]
    assert len(recoveries) == 3 and end["hang_restarts"] == 3
    # in place: one container, never re-queued
    assert states(end).count("QUEUED") == 1 and states(end).count("PENDING") == 1
    logs = alice.call("GET", f"/jobs/{hung_job['id']}/logs").text
    assert logs.count("restarted in place") == 3


def test_service_sigkill_loses_no_job_and_runs_none_twice(hub, alice):
    running = [alice.submit(command=["sh", "-c", "echo once; sleep 6; echo end"]) for _ in range(2)]
    for job in running:
        alice.wait(job["id"], {"RUNNING"})
    hub.kill()  # SIGKILL: hub, proxy and the gpulab service with its supervisor
    hub.start()
    for job in running:
        end = alice.wait(job["id"], timeout=120)
        assert end["state"] == "DONE", end
        logs = alice.call("GET", f"/jobs/{job['id']}/logs").text
        assert logs.count("once") == 1 and "end" in logs, logs
        assert states(end).count("RUNNING") == 1


def test_metrics_move_with_a_job_and_need_their_scope(hub, alice):
    """Prometheus metrics of the service, scraped before and after a job with data; only a
    token with custom:gpulab:metrics (or the admin scope) may read them."""
    from prometheus_client.parser import text_string_to_metric_families

    url = f"{hub.url}/services/gpulab/metrics"

    def scrape() -> dict[tuple, float]:
        r = requests.get(url, headers={"Authorization": f"token {hub.admin_token}"}, timeout=30)
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain"), r.text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.text)
            for s in family.samples
        }

    def value(m: dict, name: str, **labels) -> float:
        return m.get((name, tuple(sorted(labels.items()))), 0.0)

    # an invented method must not become a series of its own (the memory of the service)
    odd = requests.request("PROPFIND", f"{hub.url}/services/gpulab/api/jobs", timeout=30)
    assert odd.status_code in (400, 401, 405), odd.text
    before = scrape()
    assert not [k for k in before if ("method", "PROPFIND") in k[1]], (
        "an invented method is a label"
    )
    job = alice.submit(
        command=["sh", "-c", "head -c 3000 /dev/zero > /out/weights.bin"],
        volumes=["scratch@local/alice/metrics:/out:rw"],
    )
    assert alice.wait(job["id"])["state"] == "DONE"
    alice.call("GET", f"/jobs/{job['id']}")
    after = scrape()
    assert (
        value(after, "gpulab_jobs", state="DONE") == value(before, "gpulab_jobs", state="DONE") + 1
    )
    for name in ("gpulab_job_queue_wait_seconds_count", "gpulab_job_start_duration_seconds_count"):
        assert value(after, name) >= value(before, name) + 1, name
    pushed = value(after, "gpulab_sync_bytes_total", direction="push")
    assert pushed >= value(before, "gpulab_sync_bytes_total", direction="push") + 3000
    assert value(after, "gpulab_gpus") == 2
    assert ("gpulab_gpus_held", (("device", "0"), ("kind", "job"))) in after
    reads = [
        v
        for (name, labels), v in after.items()
        if name == "gpulab_api_request_duration_seconds_count"
        and dict(labels) == {"method": "GET", "handler": "JobHandler", "code": "200"}
    ]
    assert reads and reads[0] >= 1
    # the scope decides: none -> 401, a user's token without it -> 403
    assert requests.get(url, timeout=30).status_code == 401
    r = requests.get(url, headers={"Authorization": f"token {alice.token}"}, timeout=30)
    assert r.status_code == 403 and "custom:gpulab:metrics" in r.json()["message"]
