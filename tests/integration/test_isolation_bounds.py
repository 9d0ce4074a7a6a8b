"""Bounds, played as attacks with an ordinary account against one real hub and its gpulab
service: oversized lists, a CPU quota that rounds to "no limit", NaN, an oversized body and a
name with a trailing newline are refused with a 4xx that names the field and the cap, fast,
before any expensive work (the caps: docs/limits.md).
"""

from __future__ import annotations

import json
import time

import pytest
import requests

from ..support.api import Api

pytestmark = [pytest.mark.docker, pytest.mark.hub]

CONFIG = """
c.GpulabSettings.gpu_devices = [{"id": "0"}]
c.GpulabSettings.gpu_mode = "env"
c.GpulabSettings.max_resources = {"cpus": 2, "memory": "4G", "gpus": 1}
"""
SMALL = {"gpus": 0, "cpus": 0.5, "memory": "512M"}
#: what "answered fast" means through the proxy on a loaded 2-core CI machine; the validation
#: itself takes well under a millisecond (tests/unit/test_bounds_timing in test_jobs_spec.py)
FAST = 1.0


@pytest.fixture(scope="module")
def hub(hub_with):
    return hub_with(CONFIG)


@pytest.fixture(scope="module")
def mallory(hub):
    return Api(hub, "mallory")


def _volumes(n: int) -> list[str]:
    return [f"scratch@local/mallory/v{i}:/data/v{i}:rw" for i in range(n)]


def _no_jobs(api: Api) -> None:
    assert api.call("GET", "/jobs").json()["jobs"] == []


def test_job_with_4000_volumes_is_refused_fast_naming_the_cap(mallory):
    body = {"command": ["true"], "resources": SMALL, "volumes": _volumes(4000)}
    start = time.perf_counter()
    r = mallory.call("POST", "/jobs", json=body)
    elapsed = time.perf_counter() - start
    assert r.status_code == 400, r.text[:300]
    err = r.json()
    assert err["field"] == "volumes", err
    assert "at most 32" in err["message"] and "4000" in err["message"], err
    print(f"4000-volume job refused in {elapsed * 1000:.0f} ms (round trip through the proxy)")
    assert elapsed < FAST, f"{elapsed:.3f} s"
    _no_jobs(mallory)


def test_job_cpu_quota_that_rounds_to_no_limit_is_refused(mallory):
    r = mallory.call(
        "POST", "/jobs", json={"command": ["true"], "resources": {**SMALL, "cpus": 1e-6}}
    )
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["field"] == "resources.cpus" and "at least 0.01" in err["message"], err
    _no_jobs(mallory)


def test_job_name_with_a_trailing_newline_is_refused(mallory):
    r = mallory.call("POST", "/jobs", json={"name": "train\n", "command": ["true"]})
    assert r.status_code == 400, r.text
    assert r.json()["field"] == "name", r.text
    _no_jobs(mallory)


def test_oversized_body_is_413_naming_the_limit(mallory):
    body = json.dumps({"command": ["true"], "args": ["a" * (2 * 1024**2)]}).encode()
    headers = {"Authorization": f"token {mallory.token}", "Content-Type": "application/json"}
    url = mallory.base + "/jobs"
    r = requests.post(url, data=body, headers=headers, timeout=60)
    assert r.status_code == 413, r.text[:300]
    err = r.json()
    assert err["field"] == "body" and "at most 1048576 bytes (1 MiB)" in err["message"], err
    # the same without a Content-Length (chunked): the size read is what counts
    chunks = (body[i : i + 65536] for i in range(0, len(body), 65536))
    r = requests.post(url, data=chunks, headers=headers, timeout=60)
    assert r.status_code == 413, r.text[:300]
    assert r.json()["field"] == "body"
    # a declared body is refused unread (discarded as it comes): the same 413 far over the cap
    r = requests.post(url, data=b"x" * (20 * 1024**2), headers=headers, timeout=60)
    assert r.status_code == 413, (r.status_code, r.text[:300])
    assert "the request body is 20971520 bytes" in r.json()["message"], r.text
    _no_jobs(mallory)


def test_notebook_with_4000_volumes_or_nan_cpus_is_refused(hub, mallory):
    start = time.perf_counter()
    r = hub.spawn("mallory", "many", {**SMALL, "volumes": _volumes(4000)}, token=mallory.token)
    elapsed = time.perf_counter() - start
    assert r.status_code == 400, r.text[:300]
    message = r.json()["message"]
    assert "volumes: at most 32 entries (got 4000)" in message, message
    print(f"4000-volume notebook refused in {elapsed * 1000:.0f} ms (round trip)")
    assert elapsed < FAST, f"{elapsed:.3f} s"

    r = hub.spawn("mallory", "nan", {"cpus": "nan", "memory": "1G"}, token=mallory.token)
    assert r.status_code == 400, r.text
    message = r.json()["message"]
    assert "cpus" in message and "number" in message, message
    for server in ("many", "nan"):
        model = hub.server_model("mallory", server)
        assert model is None or not (model.get("ready") or model.get("pending")), model
