"""A helper's secret files on a real Swarm, when the process running it dies.

A helper's ``HelperSpec.files`` (store credentials, a git token) are Swarm secrets made for
its service and removed when it ends. Here the process running a helper is SIGKILLed for real
(the fault points ``helper:secrets``, after the secrets and before the service, and
``helper:started``, with its service running), as a hub or a service killed mid-helper: then
``SwarmRuntime.remove`` of the orphaned helper (what the sweeps of orphaned helpers call)
takes its secrets too, and ``remove_helper_leftovers`` those that no service holds once they
are old enough, while a running helper's secrets and those of a helper being started stay.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time

import pytest

from gpulab.names import L_INSTANCE, L_KIND, L_WORKLOAD
from gpulab.runtime.swarm import SwarmRuntime
from gpulab.runtime.swarm_specs import L_SECRET_OF, engine_time

from ..conftest import run_async, wait_until
from .conftest import ROOT

#: what the killed process runs: a helper with two secret files on a worker, through the
#: public Runtime call, until the fault point named in GPULAB_FAULT_FILE kills it
HELPER = """
import asyncio, sys
import docker
from gpulab.runtime.base import HelperSpec
from gpulab.runtime.swarm import SwarmRuntime

url, image, node, instance, workload = sys.argv[1:6]
rt = SwarmRuntime(docker.APIClient(base_url=url, version="auto"), node_engine_plain=True)
spec = HelperSpec(
    image=image,
    command=["sh", "-c", "sleep 300"],
    labels={"org.gpulab.instance": instance, "org.gpulab.kind": "sync-helper",
            "org.gpulab.workload": workload},
    files={"store-credentials": b"AKIALAB lab-secret-key", "git-password": b"lab-token"},
)
asyncio.new_event_loop().run_until_complete(rt.run_helper(spec, print, node))
"""

#: seconds a secret held by no service is left alone here (the default is a minute)
GRACE = 15.0


@pytest.fixture
def instance(swarm_lab):
    """An instance of this test's own; every service and secret labelled with it goes after."""
    name = "hsec" + secrets.token_hex(3)
    yield name
    api = swarm_lab.api()
    for svc in api.services(filters={"label": f"{L_INSTANCE}={name}"}):
        api.remove_service(svc["ID"])
    deadline = time.monotonic() + 30
    for s in api.secrets(filters={"label": f"{L_INSTANCE}={name}"}):
        while True:
            try:
                api.remove_secret(s["ID"])
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


def die_at(point: str, swarm_lab, instance: str, workload: str, tmp_path) -> None:
    """Run a helper in a process of its own that SIGKILLs itself at ``point``."""
    fault = tmp_path / f"fault-{workload}"
    fault.write_text(point)
    env = {**os.environ, "GPULAB_FAULT_FILE": str(fault), "PYTHONPATH": str(ROOT / "src")}
    args = [
        swarm_lab.manager.docker_url,
        swarm_lab.image("gpulab/python:3.11"),
        swarm_lab.workers[0].hostname,
        instance,
        f"{instance}/job/{workload}",
    ]
    proc = subprocess.run(
        [sys.executable, "-c", HELPER, *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == -9, (proc.returncode, proc.stdout, proc.stderr)
    assert (tmp_path / f"fault-{workload}.fired").exists()


def test_a_dead_helpers_secrets_go_with_it_or_with_the_sweep_a_live_ones_stay(
    swarm_lab, instance, tmp_path
):
    api = swarm_lab.api()
    rt = SwarmRuntime(api, node_engine_plain=True)
    rt.helper_secret_grace = GRACE

    def secrets_of(workload: str) -> dict[str, dict]:
        found = api.secrets(filters={"label": f"{L_WORKLOAD}={instance}/job/{workload}"})
        return {s["Spec"]["Name"]: s for s in found}

    def helper_of(workload: str):
        helpers = run_async(rt.labelled(instance, "sync-helper"))
        return next(h for h in helpers if h.labels[L_WORKLOAD] == f"{instance}/job/{workload}")

    # "early" dies between its secrets and its service; "dead" and "live" with their services
    # running ("live" is a helper still at work as far as any sweep can tell)
    die_at("helper:secrets", swarm_lab, instance, "early", tmp_path)
    early_made = time.time()
    die_at("helper:started", swarm_lab, instance, "dead", tmp_path)
    die_at("helper:started", swarm_lab, instance, "live", tmp_path)
    dead, live = helper_of("dead"), helper_of("live")
    assert len(secrets_of("early")) == 2
    assert not api.services(filters={"label": f"{L_WORKLOAD}={instance}/job/early"})
    for workload, helper in (("dead", dead), ("live", live)):
        made = secrets_of(workload)
        assert sorted(made) == [f"{helper.name}-git-password", f"{helper.name}-store-credentials"]
        for s in made.values():  # labelled as the helper, and with its service's name
            labels = s["Spec"]["Labels"]
            assert labels[L_SECRET_OF] == helper.name and labels[L_INSTANCE] == instance
            assert labels[L_KIND] == "sync-helper"

    # the sweep of orphaned helpers removes "dead": its secrets go with it, nobody else's
    assert run_async(rt.remove(dead.id)) is True
    assert secrets_of("dead") == {}
    assert len(secrets_of("live")) == 2 and len(secrets_of("early")) == 2
    assert run_async(rt.state(live.id)).running

    # too young: "early" may be a helper whose service is being made
    assert run_async(rt.remove_helper_leftovers(instance)) == []
    assert len(secrets_of("early")) == 2
    time.sleep(max(0.0, early_made + GRACE + 1 - time.time()))
    # "fresh" is being started now: its secrets made a moment ago, no service yet
    die_at("helper:secrets", swarm_lab, instance, "fresh", tmp_path)
    now = engine_time(api.info()["SystemTime"])
    assert all(now - engine_time(s["CreatedAt"]) < GRACE for s in secrets_of("fresh").values())
    early = sorted(secrets_of("early"))
    assert sorted(run_async(rt.remove_helper_leftovers(instance))) == early
    assert secrets_of("early") == {}
    assert len(secrets_of("live")) == 2 and len(secrets_of("fresh")) == 2
    assert run_async(rt.state(live.id)).running

    # nothing of the instance's helpers is left behind once "live" is removed and "fresh"
    # is old enough for a sweep
    assert run_async(rt.remove(live.id)) is True
    rt.helper_secret_grace = 0.0
    assert len(run_async(rt.remove_helper_leftovers(instance))) == 2
    wait_until(
        lambda: not api.services(filters={"label": f"{L_INSTANCE}={instance}"}),
        timeout=30,
        what="the helpers' services gone",
    )
    assert api.secrets(filters={"label": f"{L_INSTANCE}={instance}"}) == []
