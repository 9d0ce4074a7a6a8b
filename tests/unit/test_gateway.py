"""The notebook gateway's container (runtime/gateway.py), as sent to the engine: pure."""

from __future__ import annotations

from gpulab.runtime.gateway import ENTRY, L_CONFIG, gateway_config


def test_the_gateway_is_published_on_loopback_only_and_runs_unprivileged():
    cfg = gateway_config("t1", "gpulab/proxy:5.3.0", 8002, 8003, "secret-token")
    host = cfg["host_config_kw"]
    assert host["port_bindings"] == {8002: ("127.0.0.1", 8002), 8003: ("127.0.0.1", 8003)}
    assert host["cap_drop"] == ["ALL"] and "no-new-privileges:true" in host["security_opt"]
    assert host["read_only"] is True and host["privileged"] is False
    assert cfg["user"] == "65534:65534"
    assert cfg["name"] == "t1-gateway" and cfg["labels"]["org.gpulab.kind"] == "gateway"
    # both ports bind the container's first (bridge) address, never 0.0.0.0 (the overlays)
    assert "ip=${ip%% *}" in ENTRY and '--ip "$ip"' in ENTRY and '--api-ip "$ip"' in ENTRY
    assert "0.0.0.0" not in ENTRY
    assert cfg["environment"]["CONFIGPROXY_AUTH_TOKEN"] == "secret-token"


def test_the_config_label_follows_the_configuration_not_the_token():
    a = gateway_config("t1", "gpulab/proxy:5.3.0", 8002, 8003, "one")
    b = gateway_config("t1", "gpulab/proxy:5.3.0", 8002, 8003, "two")
    c = gateway_config("t1", "gpulab/proxy:5.3.0", 9002, 8003, "one")
    assert a["labels"][L_CONFIG] == b["labels"][L_CONFIG]  # a kept gateway keeps its token
    assert a["labels"][L_CONFIG] != c["labels"][L_CONFIG]  # a new port: a new gateway


def test_joining_an_overlay_someone_joined_meanwhile_is_fine():
    """A spawn and the reconciler's pass may attach the gateway at once: the engine's refusal
    of the second (Engine 20.10's wording, seen in a full run) is not an error; others are."""
    import pytest
    from docker.errors import APIError

    from gpulab.runtime.gateway import Gateway

    class Engine:
        def __init__(self, why: str):
            self.why = why

        def connect_container_to_network(self, name, network_id):
            raise APIError("403", explanation=self.why)

    gw = Gateway("t1", "gpulab/proxy:5.3.0", 8002, 8003)
    gw._attach(Engine("endpoint with name t1-gateway already exists in network ovl"), "n1")
    gw._attach(Engine("t1-gateway is already attached to network t1-ovl-ana"), "n1")
    with pytest.raises(APIError):
        gw._attach(Engine("network n1 not found"), "n1")
