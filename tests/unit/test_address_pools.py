"""Room in the engine's address pools for a network per user, as data (runtime/pools.py): the
count, the users counted on, the service's start-up warning, and the engines' words for pools
that are used up. The doctor's check on the same rule is in test_doctor.py; the warning in a
real hub's log and a real engine whose pools run out, in tests/integration/test_address_pools.py.
"""

from __future__ import annotations

import pytest
from traitlets.config import Config

from gpulab.runtime import (
    DEFAULT_USERS,
    DOCKER_DEFAULT_POOLS,
    pool_capacity,
    pool_room,
    pools_warning,
    users_counted,
)
from gpulab.runtime.base import EngineNetwork, EngineSurvey
from gpulab.runtime.pools import pools_exhausted

from ..conftest import run_async

OTHERS = (EngineNetwork("bridge", ("172.17.0.0/16",)), EngineNetwork("host"))
OURS = (EngineNetwork("gpulab-net-a", ("172.18.0.0/16",), ours=True),)
ADDRESS = "unix:///var/run/docker.sock"


def survey(networks=OTHERS + OURS, pools=None, **kw) -> EngineSurvey:
    return EngineSurvey(
        address=ADDRESS,
        version="20.10.24",
        networks=tuple(networks),
        address_pools=pools,
        pools_from="docker info" if pools else "",
        **kw,
    )


def test_pool_capacity():
    # Docker's built-in pools: 15 /16s from 172.17-31 and 16 /20s from 192.168
    assert pool_capacity(DOCKER_DEFAULT_POOLS) == 31
    assert pool_capacity([("10.201.0.0/16", 24)]) == 256
    assert pool_capacity([("10.0.0.0/8", 4), ("junk", 24)]) == 0  # size above the base


def test_room_counts_other_networks_in_the_pools_but_not_gpulabs():
    room = pool_room(survey())
    assert (room.total, room.others, room.ours, room.room) == (31, 1, 1, 30)
    assert room.short_of(31) and not room.short_of(30)
    # a network outside the operator's pools takes nothing from them
    big = pool_room(survey(pools=(("10.201.0.0/16", 24),)))
    assert (big.total, big.others, big.room) == (256, 0, 256)
    assert "10.201.0.0/16 by /24 (docker info)" in big.found()


def test_users_counted():
    assert users_counted(Config()) == (DEFAULT_USERS, "") == (50, "")
    cfg = Config()
    cfg.JupyterHub.active_server_limit = 80
    assert users_counted(cfg) == (80, "JupyterHub.active_server_limit")
    assert users_counted(cfg, 7) == (7, "--users")
    cfg.JupyterHub.active_server_limit = 0  # JupyterHub's "no limit"
    assert users_counted(cfg) == (50, "")


def test_the_start_up_warning_names_the_shortfall_and_the_fix():
    text = pools_warning(survey(), 50, "")
    assert text is not None
    assert f"engine at {ADDRESS}" in text
    assert "for 50 users (active_server_limit unset, so 50)" in text
    assert "room for 30 user networks: 31 in Docker's built-in pools" in text
    assert '"default-address-pools": [{"base": "10.201.0.0/16", "size": 24}]' in text
    assert "/etc/docker/daemon.json" in text and "restart dockerd" in text
    limited = pools_warning(survey(), 40, "JupyterHub.active_server_limit")
    assert limited is not None and "for 40 users (JupyterHub.active_server_limit)" in limited


@pytest.mark.parametrize(
    "engine, users",
    [
        (survey(), 30),  # exactly enough
        (survey(pools=(("10.201.0.0/16", 24),)), 200),
        (EngineSurvey(address=ADDRESS, error="connection refused"), 50),  # said elsewhere
    ],
)
def test_no_warning_where_the_pools_hold_the_users(engine, users):
    assert pools_warning(engine, users, "") is None


@pytest.mark.parametrize(
    "said",
    [
        # Engine 20.10 to 24 (what this machine's 20.10 answers)
        "could not find an available, non-overlapping IPv4 address pool among the defaults "
        "to assign to the network",
        # Engine 25 and later
        "all predefined address pools have been fully subnetted",
        # before 18.06
        'failed to parse pool request for address space "LocalDefault" pool "" subpool "": '
        "could not find an available predefined network",
    ],
)
def test_every_engines_words_for_used_up_pools(said):
    assert pools_exhausted(said)


def test_other_network_errors_are_not_taken_for_used_up_pools():
    assert not pools_exhausted("network with name gpulab-net-a already exists")
    assert not pools_exhausted("Pool overlaps with other one on this address space")


def test_the_service_warns_at_start_up_only_where_users_each_hold_a_network(caplog):
    """The service's start-up check on a runtime whose engine has Docker's built-in pools."""
    import logging

    from gpulab.service.__main__ import warn_of_address_pools
    from gpulab.settings import GpulabSettings

    from ..support.fake_runtime import FakeRuntime

    def warnings(settings, config) -> list[str]:
        caplog.clear()
        rt = FakeRuntime()
        with caplog.at_level(logging.WARNING, logger="gpulab.service"):
            run_async(warn_of_address_pools(rt, settings, config))
        return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]

    (said,) = warnings(GpulabSettings(), Config())
    assert "short of networks for 50 users" in said and "default-address-pools" in said
    few = Config()
    few.JupyterHub.active_server_limit = 20  # 31 built-in networks hold 20 users
    assert warnings(GpulabSettings(), few) == []
    assert warnings(GpulabSettings(network_isolation="none"), Config()) == []
