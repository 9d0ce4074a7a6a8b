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
