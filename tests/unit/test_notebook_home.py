"""A notebook's home, kept across its stops, as data: where it is stored (per user and server,
inside the user's own prefix), what its sync is told (exclusions, cap), what a push over the
cap says, and its volume's life on a fake engine (mounted, pushed, purged, removed)."""

from __future__ import annotations

import json

import pytest
from traitlets.config import Config

from gpulab.data.sync import HomeSync, SyncOutcome, VolumeSync, notebook_volumes, push_verdict
from gpulab.notebooks import life
from gpulab.notebooks.life import home_not_saved
from gpulab.settings import ConfigError, GpulabSettings
from gpulab.storage import DEFAULT_HOME_EXCLUDE, StorageConfig
from gpulab.volumes import VolumeAccessError, VolumeSpec, check_access

from ..conftest import run_async
from ..support.notebooks import PUSHED, World, editor_answers

STORES = {"s3": {"endpoint_url": "http://s3.test", "credentials": {"file": "/x"}}}


def storage(workspace_store="s3") -> StorageConfig:
    return StorageConfig.from_config(STORES, [], workspace_store, "ws-bucket", "workspaces")


@pytest.mark.parametrize(
    ("user", "server", "prefix"),
    [
        ("alice", "", "workspaces/alice/.home/_default"),
        ("alice", "gpu", "workspaces/alice/.home/gpu"),
        ("bob", "gpu", "workspaces/bob/.home/gpu"),
    ],
)
def test_a_home_is_stored_per_user_and_server_inside_the_user_s_prefix(user, server, prefix):
    spec = storage().home_spec(user, server, "/home/jovyan")
    assert spec == VolumeSpec("ws-bucket", "s3", prefix, "/home/jovyan", "rwd")
    assert storage().workspace_spec(user, server, "/workspace").prefix != prefix
    assert storage("").home_spec(user, server, "/home/jovyan") is None  # no store: local only


def test_a_home_is_its_owner_s_alone():
    """The rules that keep a workspace its owner's keep the home theirs: alice may mount her
    own (to repair it from another notebook), never bob's, nor all homes at once."""
    s = storage()
    mine = s.home_spec("alice", "nb", "/rescue")
    check_access("alice", mine, [], s.workspace)
    for user, prefix in [
        ("mallory", "workspaces/alice/.home/nb"),
        ("mallory", "workspaces/alice/.home"),
        ("mallory", "workspaces/alice"),
        ("mallory", "workspaces"),
        ("mallory", ""),
    ]:
        spec = VolumeSpec("ws-bucket", "s3", prefix, "/x", "ro")
        with pytest.raises(VolumeAccessError):
            check_access(user, spec, [], s.workspace)


def test_the_home_volume_carries_its_exclusions_and_cap():
    home = HomeSync("/home/jovyan", DEFAULT_HOME_EXCLUDE, 1000)
    vols = notebook_volumes(storage(), "c", "alice", "nb", "/workspace", [], "", home)
    assert [(v.label, v.docker_volume, v.spec.mount) for v in vols] == [
        ("workspace", "c-workspace", "/workspace"),
        ("home", "c-home", "/home/jovyan"),
    ]
    assert vols[1].exclude == DEFAULT_HOME_EXCLUDE and vols[1].cap == 1000
    assert vols[0].exclude == () and vols[0].cap is None
    # a home keeps its symbolic links (venvs, conda environments); a workspace does not
    assert (vols[0].links, vols[1].links) == (False, True)
    assert notebook_volumes(storage(), "c", "alice", "nb", "/workspace", [], "", None) == vols[:1]


def _outcome(label: str, ok: bool, report: dict, reason: str = "", cap=None) -> SyncOutcome:
    spec = VolumeSpec("b", "s3", "p", "/m", "rwd")
    return SyncOutcome(VolumeSync(spec, "v", label, cap=cap), ok, report, reason)


CAPPED = {
    "operation": "push",
    "completed": 0,
    "failures": [
        {
            "key": "",
            "reason": "12.0 GiB in 9 files, more than its cap of 10.0 GiB (--max-bytes): "
            "nothing was pushed or deleted",
        }
    ],
}


def test_a_home_over_its_cap_is_said_and_never_loses_the_workspace_s_push():
    ws = _outcome("workspace", True, {"completed": 2, "bytes_transferred": 10})
    home = _outcome("home", False, CAPPED, "(listing): " + CAPPED["failures"][0]["reason"], 10)
    assert home.over_cap
    ok, message = push_verdict([ws, home])
    assert ok, message  # STOPPED, not SYNC_FAILED: nothing was lost, the local copy stays
    assert message.startswith("compute released; pushed workspace: 2 transferred")
    assert (
        "home not saved: it holds 12.0 GiB in 9 files, more than its cap of 10.0 GiB; "
        "its local copy is kept as it is" in message
    )
    assert home_not_saved({"history": [{"message": message}]}).startswith("it holds 12.0 GiB")
    assert home_not_saved({"history": [{"message": "compute released"}]}) == ""
    # a failed workspace push is a failure still, and the home's note is kept
    failed = _outcome("workspace", False, {}, "store is down")
    ok, message = push_verdict([failed, home])
    assert not ok and "push of workspace failed" in message and "home not saved" in message
    # the same refusal of a volume without a cap (none but a home has one) is a failure
    other = _outcome("data", False, CAPPED, "x (--max-bytes)")
    assert not other.over_cap and not push_verdict([other])[0]


def _settings(**values) -> GpulabSettings:
    c = Config()
    for name, value in values.items():
        setattr(c.GpulabSettings, name, value)
    return GpulabSettings(config=c)


def test_home_settings_are_checked_naming_the_setting():
    s = _settings()
    assert s.home_sync and s.home_dir == "/home/jovyan" and s.home_max_bytes_value == 10 * 2**30
    assert tuple(s.home_exclude) == DEFAULT_HOME_EXCLUDE
    assert _settings(home_max_bytes=None).home_max_bytes_value is None
    for bad in ({"home_dir": "relative"}, {"home_dir": "/"}, {"home_dir": "/a/../b"}):
        with pytest.raises(Exception, match="c.GpulabSettings.home_dir"):
            _settings(**bad)
    with pytest.raises(ConfigError, match="home_dir: '/workspace/home' is the workspace_dir"):
        _settings(home_dir="/workspace/home")
    with pytest.raises(Exception, match="c.GpulabSettings.home_exclude: exclude pattern '/abs'"):
        _settings(home_exclude=["/abs"])
    with pytest.raises(Exception, match="c.GpulabSettings.home_max_bytes"):
        _settings(home_max_bytes="lots")


@pytest.fixture
def answers(monkeypatch):
    editor_answers(monkeypatch)


def test_a_home_is_mounted_pushed_with_its_rules_purged_and_removed(tmp_path, answers):
    w = World(tmp_path, workspace=True, home=True)
    w.start()  # nothing stored: both pulls skipped, the image fills the new volumes
    spec = w.rt.workloads[w.nb.container].spec
    home = w.nb.container + "-home"
    assert [(m.volume, m.target) for m in spec.mounts] == [
        (w.nb.volume, "/workspace"),
        (home, "/home/jovyan"),
    ]
    w.rt.script_helper(0, [PUSHED])
    w.rt.script_helper(0, [PUSHED])
    run_async(life.stop(w.nb))
    assert w.record()["state"] == "STOPPED"
    assert "pushed workspace: 1 transferred" in w.last()["message"]
    assert "home: 1 transferred" in w.last()["message"]
    ws_push, home_push = (c.command for c in w.rt.helper_configs[-2:])
    assert "--exclude" not in ws_push and "--max-bytes" not in ws_push
    assert "--links" in home_push and "--links" not in ws_push
    assert ws_push[ws_push.index("--prefix") + 1] == "workspaces/alice/nb"
    assert home_push[home_push.index("--prefix") + 1] == "workspaces/alice/.home/nb"
    assert home_push[home_push.index("--max-bytes") + 1] == str(10 * 2**30)
    excluded = [home_push[i + 1] for i, a in enumerate(home_push) if a == "--exclude"]
    assert tuple(excluded) == DEFAULT_HOME_EXCLUDE
    assert w.rt.helper_configs[-1].mounts[0].volume == home

    # deleted for good: the remote workspace and home purged, both volumes removed
    w.rt.volumes.add((home, ""))
    w.rt.script_helper(0, [json.dumps({"event": "report", "ok": True})])
    w.rt.script_helper(0, [json.dumps({"event": "report", "ok": True})])
    assert run_async(life.delete(w.nb)) is True
    purges = [c.command for c in w.rt.helper_configs[-2:]]
    assert [p[0] for p in purges] == ["purge", "purge"]
    assert purges[1][purges[1].index("--prefix") + 1] == "workspaces/alice/.home/nb"
    assert home in w.rt.names("remove_volume") and (home, "") not in w.rt.volumes


def test_a_home_over_its_cap_says_so_at_the_stop_and_at_the_next_start(tmp_path, answers):
    w = World(tmp_path, workspace=True, home=True)
    w.start()
    w.rt.script_helper(0, [PUSHED])
    w.rt.script_helper(1, [json.dumps({"event": "report", "ok": False, **CAPPED})])
    run_async(life.stop(w.nb))
    assert w.record()["state"] == "STOPPED", w.last()
    assert "home not saved: it holds 12.0 GiB" in w.last()["message"]
    assert w.rt.names("remove_volume") == []
    w.events.clear()
    w.start()
    said = [m for _, m in w.events if "not saved" in m]
    assert said and said[0].startswith("Your home was not saved at the last stop: it holds")
