"""What a registry call sends in ``X-Registry-Auth`` (runtime/pulls.py), read off a real
docker-py client whose engine is a recording transport: the user's credentials, or an
anonymous header; never the credentials the service's own Docker configuration keeps."""

from __future__ import annotations

import base64
import json
from types import SimpleNamespace

import docker
import requests
from requests.adapters import BaseAdapter

from gpulab.runtime.pulls import pull_blocking, registry_digest_blocking

REGISTRY = "reg.example:5000"
DIGEST = "sha256:" + "a" * 64


class Recording(BaseAdapter):
    """An engine that answers the distribution and pull calls, keeping their headers."""

    def __init__(self):
        super().__init__()
        self.headers: list[dict] = []

    def send(self, request, **kwargs):
        self.headers.append(dict(request.headers))
        r = requests.Response()
        r.status_code = 200
        r.request, r.url = request, request.url
        if "/distribution/" in request.url:
            r._content = json.dumps({"Descriptor": {"digest": DIGEST}}).encode()
        else:  # one progress message, not chunked (what docker-py reads whole)
            r.raw = SimpleNamespace(_fp=SimpleNamespace(chunked=False))
            r._content = json.dumps({"status": "Pull complete", "id": "l1"}).encode()
        r.headers["Content-Type"] = "application/json"
        return r

    def close(self):
        pass


def client_with_operator_login(tmp_path, monkeypatch):
    """A client made as the service makes one, in a process whose Docker configuration
    holds an operator's `docker login` to the registry."""
    secret = base64.b64encode(b"operator:hunter2").decode()
    (tmp_path / "config.json").write_text(json.dumps({"auths": {REGISTRY: {"auth": secret}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    client = docker.APIClient(base_url="tcp://127.0.0.1:9", version="1.43")
    engine = Recording()
    client.mount("http://127.0.0.1:9", engine)
    return client, engine


def sent(headers: dict) -> dict:
    value = headers["X-Registry-Auth"]
    value = value.decode() if isinstance(value, bytes) else value
    return json.loads(base64.urlsafe_b64decode(value + "=="))


def test_no_secret_is_anonymous_not_the_operators_login(tmp_path, monkeypatch):
    client, engine = client_with_operator_login(tmp_path, monkeypatch)
    image = f"{REGISTRY}/private/x:1"
    assert registry_digest_blocking(client, image, None) == DIGEST
    pull_blocking(client, f"{REGISTRY}/private/x@{DIGEST}", None, lambda p: None)
    assert len(engine.headers) == 2
    for headers in engine.headers:
        assert sent(headers) == {}  # anonymous
        assert "hunter2" not in str(sent(headers)) and "operator" not in str(sent(headers))


def test_a_users_secret_is_sent_as_theirs(tmp_path, monkeypatch):
    client, engine = client_with_operator_login(tmp_path, monkeypatch)
    mine = {"username": "ann", "password": "s3cret", "serveraddress": REGISTRY}
    registry_digest_blocking(client, f"{REGISTRY}/private/x:1", mine)
    pull_blocking(client, f"{REGISTRY}/private/x@{DIGEST}", mine, lambda p: None)
    for headers in engine.headers:
        assert sent(headers)["username"] == "ann" and sent(headers)["password"] == "s3cret"


class Manager(BaseAdapter):
    """A Swarm manager that makes, shows and updates one service, keeping each request's
    method, path and headers."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, str, dict]] = []
        self.spec: dict | None = None

    def send(self, request, **kwargs):
        path = request.path_url.split("?")[0].split("/", 2)[2]  # without /v1.43
        self.calls.append((request.method, path, dict(request.headers)))
        r = requests.Response()
        r.request, r.url = request, request.url
        r.headers["Content-Type"] = "application/json"
        r.status_code, body = 200, {}
        if path == "services/create":
            self.spec = json.loads(request.body)
            body = {"ID": "s1"}
        elif path.startswith("services/") and not path.endswith("/update"):
            if self.spec is None or request.method == "DELETE":
                r.status_code, body = 404, {"message": "service not found"}
            else:
                body = {"ID": "s1", "Version": {"Index": 7}, "Spec": self.spec}
        r._content = json.dumps(body).encode()
        return r

    def close(self):
        pass


def test_a_service_is_made_and_updated_without_registry_credentials(tmp_path, monkeypatch):
    """Swarm keeps a service call's X-Registry-Auth in its own spec (never shown by an
    inspection) and hands it to every task: gpulab's service create and update calls send
    none, not even the operator's login that docker-py's create_service would send, for a
    user's private image run by its digest."""
    from gpulab.runtime import swarm
    from gpulab.runtime.base import WorkloadSpec
    from gpulab.runtime.swarm import SwarmRuntime

    from ..conftest import run_async

    secret = base64.b64encode(b"operator:hunter2").decode()
    (tmp_path / "config.json").write_text(json.dumps({"auths": {REGISTRY: {"auth": secret}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    monkeypatch.setattr(swarm, "START_TIMEOUT", 0)  # nothing runs: not waited for
    client = docker.APIClient(base_url="tcp://127.0.0.1:9", version="1.43")
    manager = Manager()
    client.mount("http://127.0.0.1:9", manager)
    rt = SwarmRuntime(client, node_engine_plain=True)
    spec = WorkloadSpec(
        name="gl-job-1", image=f"{REGISTRY}/private/x@{DIGEST}", command=["true"], runner=False
    )
    spec.node = "gpu-a"
    run_async(rt.create_and_start(spec))
    run_async(rt.start_again("gl-job-1"))  # a hang restart, a start of an ended job
    run_async(rt.terminate("gl-job-1", 5))
    writes = [(m, p) for m, p, _ in manager.calls if m == "POST"]
    assert writes == [("POST", "services/create"), *[("POST", "services/s1/update")] * 2]
    for _, _, headers in manager.calls:
        assert not any(k.lower() == "x-registry-auth" for k in headers), headers
    assert "hunter2" not in json.dumps(manager.spec) and secret not in json.dumps(manager.spec)
