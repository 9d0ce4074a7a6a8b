"""A helper's secret files on a Swarm (its store credentials, a git token: ``HelperSpec.files``)
are Swarm secrets made for that helper's service. When the process running the helper dies,
they must not stay in the swarm: ``SwarmRuntime.remove`` of the orphaned helper takes the
secrets gpulab made for it, and ``remove_helper_leftovers`` those that no service references
any more (a death between the secrets and the service), never a fresh helper's nor another's.
The choices as data (``swarm_specs``), then the runtime on a manager that records its calls."""

from __future__ import annotations

import pytest
from docker.errors import APIError, NotFound

from gpulab.names import L_INSTANCE, L_KIND, L_WORKLOAD
from gpulab.runtime import swarm
from gpulab.runtime.swarm import SwarmRuntime
from gpulab.runtime.swarm_specs import (
    HELPER_SECRET_GRACE,
    L_SECRET_OF,
    engine_time,
    helper_secret_labels,
    leftover_helper_secrets,
    made_for,
    referenced_secrets,
)

from ..conftest import run_async

NOW = engine_time("2027-01-01T12:00:00Z")
HELPER = {L_INSTANCE: "i", L_KIND: "sync-helper", L_WORKLOAD: "i/job/j1"}


def stamp(ago: float) -> str:
    """The manager's CreatedAt of a secret made ``ago`` seconds before NOW."""
    from datetime import UTC, datetime

    when = datetime.fromtimestamp(NOW - ago, UTC).isoformat(timespec="microseconds")
    return when.replace("+00:00", "123Z")  # nanoseconds, as the manager writes them


def secret(sid: str, labels: dict, ago: float = 600, name: str = "") -> dict:
    return {"ID": sid, "CreatedAt": stamp(ago), "Spec": {"Name": name or sid, "Labels": labels}}


def service(name: str, secret_ids=(), labels: dict | None = None, sid: str = "") -> dict:
    refs = [{"SecretID": s, "SecretName": s, "File": {"Name": s}} for s in secret_ids]
    return {
        "ID": sid or f"id-{name}",
        "Spec": {
            "Name": name,
            "Labels": {**HELPER, **(labels or {})},
            "TaskTemplate": {"ContainerSpec": {"Image": "gpulab/sync", "Secrets": refs}},
        },
    }


def test_a_sweep_takes_the_instances_unused_helper_secrets_old_enough_and_nothing_else():
    mine = helper_secret_labels(HELPER, "i-helper-1")
    secrets = [
        secret("dead", mine),  # its helper died before it made its service
        secret("in-use", helper_secret_labels(HELPER, "i-helper-2")),  # a helper runs with it
        secret("fresh", mine, ago=HELPER_SECRET_GRACE - 5),  # its service is being made now
        secret("at-bound", mine, ago=HELPER_SECRET_GRACE),
        secret("older-gpulab", HELPER),  # made before the secret-of label: the kind says
        secret("other-instance", helper_secret_labels({**HELPER, L_INSTANCE: "j"}, "j-h")),
        secret("not-a-helpers", {L_INSTANCE: "i", L_KIND: "agent"}),  # gpulab's, no helper's
        secret("someone-elses", {"com.example.app": "db"}),
        {**secret("no-time", mine), "CreatedAt": "0001-01-01T00:00:00Z"},
        {**secret("bad-time", mine), "CreatedAt": "yesterday"},
    ]
    services = [service("i-helper-2", ["in-use"]), service("web", ["someone-elses"])]
    gone = leftover_helper_secrets(secrets, services, "i", NOW)
    assert [s["ID"] for s in gone] == ["dead", "at-bound", "older-gpulab"]
    # the same secrets under another instance's sweep: only its own
    other = leftover_helper_secrets(secrets, services, "j", NOW)
    assert [s["ID"] for s in other] == ["other-instance"]
    assert leftover_helper_secrets(secrets, services, "", NOW) == []


def test_the_managers_times_read_with_their_nanoseconds_and_offsets():
    assert engine_time("2027-01-01T12:00:00.123456789Z") == pytest.approx(NOW + 0.123456)
    assert engine_time("2027-01-01T13:00:00.5+01:00") == pytest.approx(NOW + 0.5)
    assert engine_time("0001-01-01T00:00:00Z") is None and engine_time("") is None


def test_a_service_takes_only_the_secrets_made_for_it():
    # labelled as the helper is, and with its service's name
    assert helper_secret_labels(HELPER, "i-helper-1") == {**HELPER, L_SECRET_OF: "i-helper-1"}
    svc = service("i-helper-1", ["s1", "s2", "s3", "s4"])
    assert made_for(secret("s1", helper_secret_labels(HELPER, "i-helper-1")), svc)
    # attached by someone else: another helper's, another instance's, not gpulab's
    assert not made_for(secret("s2", helper_secret_labels(HELPER, "i-helper-9")), svc)
    other = helper_secret_labels({**HELPER, L_INSTANCE: "j"}, "i-helper-1")
    assert not made_for(secret("s3", other), svc)
    assert not made_for(secret("s4", {"com.example.app": "db"}), svc)
    # a service of no instance (not gpulab's) takes nothing
    bare = service("i-helper-1", ["s1"])
    bare["Spec"]["Labels"] = {}
    assert not made_for(secret("s1", helper_secret_labels(HELPER, "i-helper-1")), bare)


class Manager:
    """A manager's low-level client with services and secrets, recording what it is asked."""

    base_url = "http://manager:2375"

    def __init__(self, services: list[dict], secrets: list[dict], refuse: frozenset = frozenset()):
        self.services_ = {s["ID"]: s for s in services}
        self.secrets_ = {s["ID"]: s for s in secrets}
        self.refuse = refuse  # secrets whose removal the manager refuses (in use)
        self.log: list[tuple[str, str]] = []

    def _find(self, name):
        for s in self.services_.values():
            if name in (s["ID"], s["Spec"]["Name"]):
                return s
        raise NotFound(f"service {name} not found")

    def inspect_service(self, name):
        return self._find(name)

    def remove_service(self, name):
        self.log.append(("remove_service", name))
        del self.services_[self._find(name)["ID"]]

    def services(self, filters=None):
        self.log.append(("services", ""))
        return list(self.services_.values())

    def inspect_secret(self, sid):
        if sid not in self.secrets_:
            raise NotFound(f"secret {sid} not found")
        return self.secrets_[sid]

    def secrets(self, filters=None):
        key, _, value = filters["label"].partition("=")
        return [s for s in self.secrets_.values() if s["Spec"]["Labels"].get(key) == value]

    def remove_secret(self, sid):
        self.log.append(("remove_secret", sid))
        if sid in self.refuse:
            raise APIError("in use", explanation=f"secret {sid} is in use by a service")
        if any(sid in referenced_secrets(s) for s in self.services_.values()):
            raise APIError("in use", explanation=f"secret {sid} is in use by a service")
        if self.secrets_.pop(sid, None) is None:
            raise NotFound(f"secret {sid} not found")

    def info(self):
        return {"SystemTime": "2027-01-01T13:00:00.000000001+01:00"}  # NOW, by its clock


def runtime(manager: Manager) -> SwarmRuntime:
    return SwarmRuntime(lambda: manager, node_engine_plain=True)


def test_removing_an_orphaned_helper_removes_its_own_secrets_after_it(monkeypatch):
    monkeypatch.setattr(swarm, "REMOVE_TIMEOUT", 2.0)
    own = helper_secret_labels(HELPER, "i-helper-1")
    manager = Manager(
        [service("i-helper-1", ["c1", "c2", "theirs", "gone"])],
        [
            secret("c1", own),
            secret("c2", own),
            secret("theirs", helper_secret_labels(HELPER, "i-helper-9")),
        ],
    )
    assert run_async(runtime(manager).remove("i-helper-1")) is True
    assert manager.log == [
        ("remove_service", "id-i-helper-1"),  # the service first: then nothing holds them
        ("remove_secret", "c1"),
        ("remove_secret", "c2"),
    ]
    assert set(manager.secrets_) == {"theirs"}
    assert run_async(runtime(manager).remove("i-helper-1")) is False  # none there any more


def test_the_sweep_removes_what_dead_helpers_left_and_leaves_a_starting_helpers_secrets():
    mine = helper_secret_labels(HELPER, "i-helper-1")
    manager = Manager(
        [service("i-helper-2", ["running"])],
        [
            secret("dead-1", mine, name="i-helper-1-store-credentials"),
            secret("dead-2", mine, name="i-helper-1-store-ca.pem"),
            secret("refused", mine),
            secret("running", helper_secret_labels(HELPER, "i-helper-2")),
            secret("starting", helper_secret_labels(HELPER, "i-helper-3"), ago=2),
            secret("other", helper_secret_labels({**HELPER, L_INSTANCE: "j"}, "j-helper")),
        ],
        refuse=frozenset({"refused"}),
    )
    gone = run_async(runtime(manager).remove_helper_leftovers("i"))
    assert gone == ["i-helper-1-store-credentials", "i-helper-1-store-ca.pem"]
    assert set(manager.secrets_) == {"refused", "running", "starting", "other"}
    # no helper secret of the instance: the services are not even listed
    quiet = Manager([service("i-helper-2", ["x"])], [secret("other", {L_INSTANCE: "j"})])
    assert run_async(runtime(quiet).remove_helper_leftovers("i")) == [] and quiet.log == []


def test_one_engine_has_nothing_to_sweep():
    """A helper's files on one engine are in its container: its removal takes them."""
    from gpulab.runtime.docker import DockerRuntime

    rt = DockerRuntime(lambda: pytest.fail("no engine is asked"))
    assert run_async(rt.remove_helper_leftovers("i")) == []
