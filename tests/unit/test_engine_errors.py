"""What leaves runtime/ when the engine fails: gpulab's EngineError and its kinds only, never
an SDK's, requests' or urllib3's class; an engine that gives no answer is EngineUnreachable,
naming the engine's address; and what the service answers for each (503 while the engine
does not answer, 502 when it failed a call), never a 500. The translation is tested as data
(exceptions in, gpulab's out); the runtimes' clients on an address where nothing listens."""

from __future__ import annotations

import ast
import socket
from pathlib import Path

import docker
import pytest
import requests
import urllib3
from docker.errors import APIError, DockerException, NotFound

from gpulab.jobs import exec as jobs_exec
from gpulab.jobs import output
from gpulab.jobs.refusals import EngineFailed, Unavailable, engine_refusal
from gpulab.runtime.base import (
    EngineError,
    EngineUnreachable,
    StillRunning,
    WorkloadRefused,
)
from gpulab.runtime.docker import DockerRuntime
from gpulab.runtime.engine import (
    EngineClient,
    client_url,
    env_url,
    no_answer,
    shown_url,
    translated,
    unreachable,
)
from gpulab.runtime.gateway import Gateway, GatewayError
from gpulab.service.base import ApiError, answer_refusals

from ..conftest import run_async
from ..support.fake_runtime import FakeRuntime
from .test_exec import _job as _exec_job
from .test_exec import _sup
from .test_job_ports import _job as _port_job
from .test_job_ports import _open, _world

RUNTIME = Path(__file__).resolve().parents[2] / "src" / "gpulab" / "runtime"


class _Response:
    def __init__(self, status: int):
        self.status_code = status
        self.reason = "x"
        self.url = "http+docker://localhost/v1.41/x"


def _raised(make):
    """The exception ``make()`` raises, with the causes Python chains to it."""
    try:
        make()
    except Exception as e:  # noqa: BLE001 - whatever it is, it is the datum
        return e
    raise AssertionError("nothing raised")


def _connection_refused() -> requests.ConnectionError:
    """What requests raises for a TCP port where nothing listens, chained as it chains it."""

    def connect():
        try:
            try:
                raise ConnectionRefusedError(111, "Connection refused")
            except OSError as e:
                raise urllib3.exceptions.NewConnectionError(None, f"Failed: {e}") from e
        except urllib3.exceptions.NewConnectionError as e:
            raise requests.ConnectionError(
                urllib3.exceptions.MaxRetryError(None, "/v1.41/containers/json", e)
            ) from e

    return _raised(connect)


def test_no_answer_from_the_engine_comes_up_as_engine_unreachable_naming_it():
    url = "unix:///run/no-engine.sock"
    missing = requests.ConnectionError(
        urllib3.exceptions.ProtocolError(
            "Connection aborted.", FileNotFoundError(2, "No such file or directory")
        )
    )
    for e, why in (
        (missing, "No such file or directory"),
        (_connection_refused(), "Connection refused"),
    ):
        err = translated(e, url)
        assert type(err) is EngineUnreachable and err.url == url
        assert str(err) == f"Docker engine at {url} is unreachable: {why}"
        assert err.status is None and not err.not_found  # no answer: not a refusal
    # the SDK's own wrapping (the version asked when a client is made) is no answer either
    made = _raised(lambda: _wrap(missing, "Error while fetching server API version"))
    assert str(translated(made, url)) == f"Docker engine at {url} is unreachable: " + (
        "No such file or directory"
    )
    late = requests.ReadTimeout(urllib3.exceptions.ReadTimeoutError(None, "/x", "timed out"))
    assert str(translated(late, url)) == f"Docker engine at {url} did not answer in time"
    cut = urllib3.exceptions.ProtocolError("Connection broken: IncompleteRead")
    assert isinstance(translated(cut, url), EngineUnreachable)  # a stream read cut short
    assert str(unreachable(OSError("reset"), url)).endswith("is unreachable: reset")


def _wrap(cause: Exception, message: str):
    try:
        raise cause
    except Exception as e:
        raise DockerException(f"{message}: {e}") from e


def test_an_answer_is_never_taken_for_no_answer():
    """An APIError is chained to requests' HTTPError (an OSError): the engine answered."""
    sdk = _raised(lambda: _api_error(404))
    assert isinstance(sdk.__cause__, requests.HTTPError) and not no_answer(sdk)
    err = translated(sdk, "unix:///var/run/docker.sock")
    assert type(err) is EngineError and err.not_found and err.detail == "No such container: c"
    assert translated(DockerException("bad address"), "x").status is None
    # not the engine's: a programming error is let through, and gpulab's own stays as it is
    assert translated(ValueError("bug"), "x") is None
    assert translated(EngineError("mine"), "x") is None


def _api_error(status: int):
    try:
        raise requests.HTTPError("404 Client Error")
    except requests.HTTPError as e:
        raise NotFound("x", _Response(status), explanation="No such container: c") from e


def test_the_engines_address_is_named_as_docker_host_names_it_without_a_password():
    assert env_url({}) == "unix:///var/run/docker.sock"
    assert env_url({"DOCKER_HOST": "tcp://10.0.0.5:2376"}) == "tcp://10.0.0.5:2376"
    assert shown_url("tcp://ann:s3cret@10.0.0.5:2376") == "tcp://ann@10.0.0.5:2376"
    assert shown_url("ssh://ann@node") == "ssh://ann@node"
    unix = docker.APIClient(base_url="unix:///run/x.sock", version="1.41")
    tcp = docker.APIClient(base_url="tcp://127.0.0.1:2375", version="1.41")
    assert client_url(unix) == "unix:///run/x.sock"
    assert client_url(tcp) == "tcp://127.0.0.1:2375"


def test_every_failure_a_backend_raises_is_an_engine_error():
    """The Swarm's kinds are EngineErrors (a caller tells them apart by class), and no module
    of runtime/ raises a builtin failure class (TimeoutError, RuntimeError, OSError, ...)."""
    assert issubclass(GatewayError, EngineError) and issubclass(StillRunning, EngineError)
    assert issubclass(EngineUnreachable, EngineError)
    builtin = {"TimeoutError", "RuntimeError", "OSError", "Exception", "ConnectionError"}
    found = []
    for path in sorted(RUNTIME.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                name = getattr(node.exc.func, "id", None)
                if name in builtin:
                    found.append(f"{path.name}:{node.lineno} {name}")
    assert found == []


def test_the_gateway_that_does_not_answer_is_a_gateway_error():
    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gateway = Gateway("t", "proxy", port, port)
    gateway._token = "x"
    for call in (gateway.routes, lambda: gateway.add_route("/user/a/", "http://10.0.0.2:8888")):
        with pytest.raises(GatewayError, match=f"did not answer on 127.0.0.1:{port}"):
            call()


def test_a_runtime_on_an_address_where_no_engine_listens_says_so(monkeypatch, tmp_path):
    """DOCKER_HOST is read (as docker.from_env reads it); a socket nobody made, or a TCP port
    nobody listens on, is EngineUnreachable naming that address, from every kind of call."""
    sock = f"unix://{tmp_path}/no-engine.sock"
    monkeypatch.setenv("DOCKER_HOST", sock)
    runtime = DockerRuntime()
    assert runtime.engine.url == sock
    for call in (lambda: runtime.state("c"), lambda: runtime.image_exists("i")):
        with pytest.raises(EngineUnreachable) as e:
            run_async(call())
        assert str(e.value) == f"Docker engine at {sock} is unreachable: No such file or directory"
    with pytest.raises(EngineUnreachable, match="no-engine.sock"):
        runtime.log_stream("c", follow=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    given = DockerRuntime(docker.APIClient(base_url=f"tcp://127.0.0.1:{port}", version="1.41"))
    with pytest.raises(EngineUnreachable) as e:
        run_async(given.remove("c"))
    assert str(e.value) == f"Docker engine at tcp://127.0.0.1:{port} is unreachable: " + (
        "Connection refused"
    )


def test_a_client_made_on_first_use_fails_as_gpulabs_error_and_is_made_again(tmp_path):
    made = []

    def make():
        made.append(1)
        return docker.APIClient(base_url=f"unix://{tmp_path}/none.sock", version="auto")

    async def pool(fn, *args, **kwargs):
        return fn(*args, **kwargs)

    engine = EngineClient(pool, pool, make)
    for _ in range(2):  # not kept: the engine may be up next time
        with pytest.raises(EngineUnreachable):
            _ = engine.client
    assert len(made) == 2


def test_engine_refusal_is_503_while_the_engine_does_not_answer_else_502():
    down = EngineUnreachable("Docker engine at unix:///x.sock is unreachable: Connection refused")
    refused = engine_refusal(down, "the container engine could not run the command")
    assert type(refused) is Unavailable and refused.status == 503
    assert refused.message == str(down)
    failed = engine_refusal(EngineError("500 Server Error", status=500, detail="disk full"))
    assert type(failed) is EngineFailed and failed.status == 502
    assert failed.message == "the container engine failed: disk full"
    said = engine_refusal(WorkloadRefused("x", status=400), "could not open a shell")
    assert said.status == 502 and said.message == "could not open a shell"


def test_an_engine_error_through_an_adapter_is_answered_never_a_500():
    down = EngineUnreachable("Docker engine at unix:///x.sock is unreachable: Connection refused")
    for error, status, message in (
        (down, 503, str(down)),
        (EngineError("x", status=500, detail="boom"), 502, "the container engine failed: boom"),
    ):
        with pytest.raises(ApiError) as e, answer_refusals():
            raise error
        assert (e.value.status_code, e.value.message) == (status, message)


def test_exec_shell_and_ports_answer_an_engine_that_does_not_answer_with_503():
    down = EngineUnreachable("Docker engine at tcp://10.0.0.9:2376 is unreachable: x")
    sup = _sup("c-j1")
    sup.runtime.fail("exec_run", down)
    with pytest.raises(Unavailable) as e:
        run_async(jobs_exec.run(sup, _exec_job(), "0", b'{"command": "id"}', "ann"))
    assert e.value.message == str(down)
    sup.runtime.fail("exec_run", EngineError("boom", status=500))
    with pytest.raises(EngineFailed, match="could not run the command"):
        run_async(jobs_exec.run(sup, _exec_job(), "0", b'{"command": "id"}', "ann"))
    sup.runtime.fail("exec_session", down)

    async def shell():
        async with jobs_exec.shell(sup, _exec_job(), "0", "ann", lambda: (80, 24)):
            pass

    with pytest.raises(Unavailable, match="10.0.0.9"):
        run_async(shell())
    sup, s = _world(_port_job())
    sup.runtime.fail("ensure_user_network", down)  # before the reach: the same answer
    with pytest.raises(Unavailable, match="10.0.0.9"):
        _open(sup, s)
    sup.runtime.fail("reach", EngineError("boom", status=500))
    with pytest.raises(EngineFailed, match="cannot be reached now"):
        _open(sup, s)


def test_a_jobs_output_read_while_the_engine_does_not_answer_is_a_503():
    rt = FakeRuntime()
    down = EngineUnreachable("Docker engine at unix:///x.sock is unreachable: Connection refused")
    rt.fail("state", down, times=0)
    sup = type("Sup", (), {"runtime": rt, "container_name": staticmethod(lambda i: f"c-{i}")})

    async def read():
        return await output.find(sup, "j1", 1, None, False, lambda: False, None)

    with pytest.raises(ApiError) as e, answer_refusals():
        run_async(read())
    assert e.value.status_code == 503 and e.value.message == str(down)


def test_an_engine_error_is_gpulabs_class_only():
    assert not issubclass(EngineError, DockerException | OSError | APIError)
