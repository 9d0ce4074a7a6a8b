"""tests/support/hub.hub_groups: which test modules run on one pytest-xdist worker."""

from ..support.hub import hub_groups


def test_modules_that_share_a_hub_directly_or_through_another_are_one_group():
    order = {"a": 0, "b": 1, "c": 2, "d": 3, "e": 4}
    wanted = {"X": [0, 2], "Y": [2, 4], "Z": [3]}  # a+c share X, c+e share Y, d alone
    assert hub_groups(order, wanted) == {"a": "a", "b": "b", "c": "a", "d": "d", "e": "a"}


def test_a_group_is_named_after_its_first_module_whatever_the_order_of_the_configs():
    order = {"a": 0, "b": 1, "c": 2}
    wanted = {"late": [1, 2], "early": [0, 2]}
    assert hub_groups(order, wanted) == {"a": "a", "b": "a", "c": "a"}


def test_no_hubs_every_module_alone():
    assert hub_groups({"a": 0, "b": 1}, {}) == {"a": "a", "b": "b"}


# --- ports: each test process draws from a band of its own ---------------------------------


def test_port_bands_are_disjoint_and_below_the_ephemeral_range():
    from ..support import ports

    seen: set[int] = set()
    for n in range(ports.BANDS):
        r = ports.band_range(n)
        assert not seen & set(r), n
        seen |= set(r)
        assert r.stop <= 32768


def test_each_xdist_worker_and_the_swarm_pass_get_their_own_band(monkeypatch):
    from ..support import ports

    monkeypatch.delenv("GPULAB_TEST_PORT_BAND", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    bands = {ports.band()}
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        bands.add(ports.band())
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    monkeypatch.setenv("GPULAB_TEST_PORT_BAND", "7")
    bands.add(ports.band())
    assert len(bands) == 4, bands
    port = ports.free_port()
    assert port in ports.band_range(7)
    assert port not in {ports.free_port() for _ in range(20)}
