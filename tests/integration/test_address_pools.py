"""The engine's address pools on real parts (one network per user; runtime/pools.py).

- A real hub whose user limit (JupyterHub's active_server_limit) is above what this machine's
  engine's pools hold: its service says so in a WARNING at start-up, with the daemon.json fix.
- A real engine whose pools run out (a Docker-in-Docker engine with a pool of 4 networks, the
  stand-in GPU host of tests/support/gpu_host.py; never this machine's engine, whose networks
  other tests need): the user past the last network is refused with the cause and the fix,
  not the engine's bare words, and the survey the warning reads counts those 4.
"""

from __future__ import annotations

import re
import secrets

import pytest
from traitlets.config import Config

from gpulab.runtime import make_runtime, pool_room, pools_warning
from gpulab.runtime.base import NetworkUnavailable
from gpulab.settings import GpulabSettings

from ..conftest import run_async
from ..support.gpu_host import GpuHost

pytestmark = [pytest.mark.docker]

#: 10.219.0.0/26 cut in /28s: 4 networks (the engine's own bridge is outside, on --bip)
TINY_POOL = "base=10.219.0.0/26,size=28"


@pytest.mark.hub
def test_the_service_warns_at_start_up_when_the_pools_hold_fewer_networks_than_users(hub_with):
    # far above the 31 networks of Docker's built-in pools (or any pools this machine has)
    hub = hub_with("c.JupyterHub.active_server_limit = 100000\n")
    log = hub.log_file.read_text()
    warning = re.search(
        r"^\[W [^\]]*gpulab.service\] the address pools of the engine.*$", log, re.M
    )
    assert warning, hub.tail(60)
    line = warning.group(0)
    assert "short of networks for 100000 users (JupyterHub.active_server_limit)" in line
    assert "room for " in line and "user networks" in line
    assert '{"default-address-pools": [{"base": "10.201.0.0/16", "size": 24}]}' in line


@pytest.fixture(scope="module")
def tiny_engine(docker_client, tmp_path_factory):
    host = GpuHost(
        tmp_path_factory.mktemp("tinypool"),
        "gpulab-test-tinypool-" + secrets.token_hex(3),
        address_pool=TINY_POOL,
    )
    try:
        yield host.start(docker_client)
    finally:
        host.stop()


def test_a_user_past_the_last_network_is_told_the_cause_and_the_fix(tiny_engine):
    c = Config()
    c.GpulabSettings.instance = "tpool" + secrets.token_hex(3)
    settings = GpulabSettings(config=c)
    runtime = make_runtime(settings, tiny_engine.client())

    async def scenario():
        survey = await runtime.survey((), settings.instance)
        room = pool_room(survey)
        made = [await runtime.ensure_user_network(settings.instance, f"u{i}") for i in range(4)]
        with pytest.raises(NetworkUnavailable) as refused:
            await runtime.ensure_user_network(settings.instance, "u4")
        return survey, room, made, refused.value

    survey, room, made, refused = run_async(scenario())
    assert len(set(made)) == 4
    said = str(refused)
    assert said.startswith(f"no network could be created for your workloads ({settings.instance}")
    assert "address pools are used up" in said
    assert '{"default-address-pools": [{"base": "10.201.0.0/16", "size": 24}]}' in said
    # the engine's own words stay, last (Engine 20.10-24's or a later one's)
    assert "Engine said: " in said and "pool" in said.split("Engine said: ")[1]
    # what the start-up warning reads of this engine: its 4 networks, all free before
    assert survey.address_pools == (("10.219.0.0/26", 28),), survey
    assert (room.total, room.room) == (4, 4)
    assert pools_warning(survey, 5, "JupyterHub.active_server_limit") is not None
    assert pools_warning(survey, 4, "JupyterHub.active_server_limit") is None
