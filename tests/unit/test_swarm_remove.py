"""SwarmRuntime.remove returns only once the manager has forgotten the service: what the
workload held (its GPUs) is released after it. A service still there after REMOVE_TIMEOUT is
an EngineError (the caller keeps the GPUs booked and tries again), never a quiet True."""

from __future__ import annotations

import pytest
from docker.errors import NotFound

from gpulab.runtime import swarm
from gpulab.runtime.base import EngineError
from gpulab.runtime.swarm import SwarmRuntime

from ..conftest import run_async


class Manager:
    """A manager's low-level client that forgets a removed service after ``forget_after``
    inspections (None: never)."""

    base_url = "http://manager:2375"

    def __init__(self, forget_after: int | None):
        self.forget_after = forget_after
        self.removed = False
        self.inspections = 0

    def remove_service(self, name):
        self.removed = True

    def inspect_service(self, name):
        if self.removed:
            self.inspections += 1
            if self.forget_after is not None and self.inspections > self.forget_after:
                raise NotFound("no such service")
        return {"ID": "s1", "Spec": {"Name": name}}


def test_remove_waits_until_the_manager_forgets_the_service(monkeypatch):
    monkeypatch.setattr(swarm, "REMOVE_TIMEOUT", 5.0)
    manager = Manager(forget_after=3)
    assert (
        run_async(SwarmRuntime(lambda: manager, node_engine_plain=True).remove("gl-job-1")) is True
    )
    assert manager.inspections == 4  # asked until it was gone


def test_a_service_that_stays_is_an_engine_error(monkeypatch):
    monkeypatch.setattr(swarm, "REMOVE_TIMEOUT", 0.5)
    manager = Manager(forget_after=None)
    with pytest.raises(EngineError, match="service gl-job-1 is still there 0.5 s after"):
        run_async(SwarmRuntime(lambda: manager, node_engine_plain=True).remove("gl-job-1"))
