"""Who may open a running job's port, and where it answers (gpulab.jobs.ports), on the fake
engine; and which failures of a relay are its ends closing (the ports proxy ends those
quietly)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from tornado.iostream import StreamClosedError
from tornado.simple_httpclient import HTTPStreamClosedError, HTTPTimeoutError

from gpulab.jobs import ports
from gpulab.jobs.refusals import Busy, EngineFailed, NotFound, Unavailable
from gpulab.runtime.base import WorkloadSpec
from gpulab.service.api.ports import CUT_RELAYS, _cut_off
from gpulab.settings import GpulabSettings

from ..conftest import run_async
from ..support.fake_runtime import FakeRuntime, FakeWorkload
from ..support.jobspecs import parse

PORTS = [{"name": "tb", "port": 6006, "users": ["friend"], "groups": ["lab"]}]


class _Records:
    def __init__(self, *jobs: dict):
        self.jobs = {j["id"]: j for j in jobs}

    def get(self, job_id, with_history=True):
        return self.jobs.get(job_id)


def _job(job_id="j1", state="RUNNING", workers=1) -> dict:
    spec = parse({"command": ["serve"], "ports": PORTS, "workers": workers}).to_json()
    return {"id": job_id, "owner": "ann", "state": state, "spec": spec, "container": f"c-{job_id}"}


def _world(*jobs: dict, isolation="user"):
    rt = FakeRuntime()
    for job in jobs:
        w = FakeWorkload(WorkloadSpec(name=job["container"], image="i", command=[]))
        w.addresses = {
            f"net-t-{job['owner']}": "10.0.0.2",
            f"jobnet-t-{job['id']}": "10.1.0.2",
        }
        rt.workloads[job["container"]] = w
    sup = SimpleNamespace(runtime=rt, records=_Records(*jobs))
    return sup, GpulabSettings(instance="t", network_isolation=isolation)


def _open(sup, settings, job_id="j1", name="tb", viewer="ann", groups=(), admin=False):
    ports._targets.clear()
    return run_async(
        ports.open_port(
            sup,
            settings,
            job_id,
            name,
            viewer=viewer,
            groups=list(groups),
            admin=admin,
            path=f"/jobs/{job_id}/ports/{name}/",
        )
    )


def test_the_owner_admins_and_those_it_is_shared_with_open_it():
    sup, s = _world(_job())
    assert _open(sup, s) == ports.PortTarget("10.0.0.2", 6006, owner=True)
    for who in (
        {"viewer": "root", "admin": True},
        {"viewer": "friend"},
        {"viewer": "x", "groups": ["lab"]},
    ):
        assert _open(sup, s, **who) == ports.PortTarget("10.0.0.2", 6006, owner=False)


def test_anyone_else_gets_the_404_of_a_job_that_does_not_exist():
    sup, s = _world(_job())
    with pytest.raises(NotFound) as e:
        _open(sup, s, viewer="eve")
    assert e.value.message == "no job j1"
    with pytest.raises(NotFound, match="no job j2"):
        _open(sup, s, "j2")
    # who may open the job learns which ports it has
    with pytest.raises(NotFound, match=r"has no port 'web' \(its ports: tb\)"):
        _open(sup, s, name="web")
    with pytest.raises(NotFound, match="no job j1"):
        _open(sup, s, name="web", viewer="friend")


def test_a_port_answers_while_its_job_runs_on_rank_0s_network():
    sup, s = _world(_job(state="QUEUED"))
    with pytest.raises(Unavailable) as e:
        _open(sup, s)
    assert e.value.status == 503 and "QUEUED" in e.value.message
    gang, s = _world(_job(workers=2))
    assert _open(gang, s).host == "10.1.0.2"  # the job's own network
    sup, shared = _world(_job(), isolation="none")
    sup.runtime.workloads["c-j1"].addresses[""] = "172.17.0.2"
    assert _open(sup, shared).host == "172.17.0.2"
    sup.runtime.workloads["c-j1"].running = False
    with pytest.raises(EngineFailed, match="cannot be reached now"):
        _open(sup, shared)


def test_relays_are_counted_per_user_and_in_all_and_given_back():
    relays = ports.PortRelays(per_user=2, total=3)
    relays.take("ann")
    relays.take("ann")
    with pytest.raises(Busy, match="at most 2 requests and websockets to job ports at once"):
        relays.take("ann")
    relays.take("bob")
    with pytest.raises(Busy, match="too many requests to job ports at once"):
        relays.take("cy")
    assert relays.open == {"ann": 2, "bob": 1}  # a refused one is not counted
    relays.give("ann")
    relays.take("cy")
    for user in ("ann", "bob", "cy"):
        relays.give(user)
    assert relays.open == {}
    # the service's: the caps as the proxy reads them
    assert (ports.RELAYS.per_user, ports.RELAYS.total) == (32, 256)
    assert ports.MAX_RELAYS_PER_USER < ports.MAX_RELAYS


def test_a_relay_cut_by_either_end_is_its_end_not_an_error():
    assert _cut_off(StreamClosedError())
    assert _cut_off(HTTPStreamClosedError("Connection closed"))
    assert _cut_off(HTTPTimeoutError("Timeout during request"))
    assert not _cut_off(ValueError("a bug"))


def _record(error: Exception) -> logging.LogRecord:
    return logging.LogRecord(
        "tornado.application",
        logging.ERROR,
        __file__,
        1,
        "Uncaught exception",
        (),
        (type(error), error, error.__traceback__),
    )


def test_only_a_cut_relays_stream_error_is_kept_out_of_the_log():
    def _deliver_body():  # where tornado's HTTP client delivers a body to the relay
        raise StreamClosedError()

    def elsewhere():
        raise StreamClosedError()

    for fn, kept in ((_deliver_body, False), (elsewhere, True)):
        try:
            fn()
        except StreamClosedError as e:
            assert CUT_RELAYS.filter(_record(e)) is kept
    try:
        raise ValueError("a bug")
    except ValueError as e:
        assert CUT_RELAYS.filter(_record(e)) is True
