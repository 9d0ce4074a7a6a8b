"""A user of the gpulab service's REST API (jobs, usage, ...), with their own token."""

from __future__ import annotations

import time

import requests

TERMINAL = {"DONE", "FAILED", "ERROR", "INTERRUPTED", "SYNC_FAILED"}


class Api:
    def __init__(self, hub, user: str):
        self.hub, self.user = hub, user
        self.token = hub.create_user(user)
        self.base = f"{hub.url}/services/gpulab/api"

    def call(self, method: str, path: str, **kw) -> requests.Response:
        headers = {"Authorization": f"token {self.token}"}
        return requests.request(method, self.base + path, headers=headers, timeout=60, **kw)

    def submit(self, **body) -> dict:
        body.setdefault("resources", {"gpus": 0, "cpus": 0.5, "memory": "512M"})
        r = self.call("POST", "/jobs", json=body)
        assert r.status_code == 201, r.text
        return r.json()

    def job(self, job_id: str) -> dict:
        r = self.call("GET", f"/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return r.json()

    def wait(self, job_id: str, states=TERMINAL, timeout: float = 90) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job["state"] in states:
                return job
            time.sleep(0.2)
        raise TimeoutError(f"{job_id} not in {states}: {job['state']}\n{self.hub.tail(40)}")


def states(job: dict) -> list[str]:
    return [e["state"] for e in job["history"] if e["kind"] == "transition"]


def maxima(doc, field: str) -> set:
    """Every ``maximum`` a JSON Schema document (the service's OpenAPI document) gives the
    property ``field``, wherever it appears: what the caller's limits allow of it."""
    found: set = set()
    todo = [doc]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            prop = (node.get("properties") or {}).get(field)
            if isinstance(prop, dict) and "maximum" in prop:
                found.add(prop["maximum"])
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return found
