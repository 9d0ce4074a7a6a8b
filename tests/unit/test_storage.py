"""Storage configuration, volume options and the sync helper's container (pure)."""

from __future__ import annotations

import pytest

from gpulab.data.helper import sync_helper_spec
from gpulab.data.sync import (
    StorageCredentialsError,
    SyncOutcome,
    VolumeSync,
    notebook_volumes,
    push_verdict,
    store_credentials,
)
from gpulab.notebooks.options import OptionsError, form_to_options, parse_notebook_options
from gpulab.runtime.objects import helper_container_config
from gpulab.storage import StorageConfig

from ..support.options import CATALOG, FLAVORS, LIMITS

STORAGE = StorageConfig.from_config(
    {
        "local": {"kind": "filesystem", "root": "/srv/objects"},
        "s3": {
            "endpoint_url": "http://127.0.0.1:9000",
            "credentials": {"access_key_env": "K", "secret_key_env": "S"},
        },
    },
    [
        {"store": "s3", "bucket": "datasets", "modes": ["ro"]},
        {"store": "s3", "bucket": "team", "prefix": "vision", "users": ["ann"]},
    ],
    "local",
)


def opts(raw, user="ann"):
    return parse_notebook_options(
        raw, CATALOG, FLAVORS, LIMITS, "cpu-small", storage=STORAGE, user=user
    )


def test_workspace_is_the_users_own_prefix_and_propagates_deletions():
    ws = STORAGE.workspace_spec("ann", "", "/workspace")
    assert (ws.store, ws.bucket, ws.prefix, ws.mode) == (
        "local",
        "gpulab-workspaces",
        "workspaces/ann/_default",
        "rwd",
    )


def test_volume_options_are_parsed_and_authorised():
    got = opts({"volumes": ["datasets@s3/mnist:/data", "team@s3/vision/x:/team:rw"]})
    assert [str(v) for v in got.volumes] == [
        "datasets@s3/mnist:/data:ro",
        "team@s3/vision/x:/team:rw",
    ]
    assert got.to_json()["volumes"] == ["datasets@s3/mnist:/data:ro", "team@s3/vision/x:/team:rw"]
    # one per line from the form
    form = form_to_options({"volumes": ["datasets@s3:/a\n\n datasets@s3/b:/b \n"]})
    assert len(opts(form).volumes) == 2


@pytest.mark.parametrize(
    "volumes, words",
    [
        (["team@s3/vision:/t"], "user 'bob' may not use"),
        (["datasets@s3:/d:rw"], "mode 'rw'"),
        ("not a list", "store"),
        ([1], "list of strings"),
        (["gpulab-workspaces@local/workspaces/ann:/w"], "another user's workspace"),
    ],
)
def test_volume_refusals(volumes, words):
    with pytest.raises(OptionsError, match=words) as e:
        opts({"volumes": volumes}, user="bob")
    assert e.value.field == "volumes"


def test_no_store_configured():
    with pytest.raises(OptionsError, match="no object store"):
        parse_notebook_options({"volumes": ["a@b:/c"]}, CATALOG, FLAVORS, LIMITS, "cpu-small")


def test_storage_config_refuses_keys_it_does_not_know():
    with pytest.raises(ValueError) as e:
        StorageConfig.from_config({"lab": {"kind": "s3", "endpoint": "https://s3.lab"}}, [])
    assert str(e.value) == (
        "object store 'lab': unknown key(s) ['endpoint']; it takes kind, endpoint_url, region, "
        "credentials, root, ca_bundle, verify"
    )
    grant = {"store": "lab", "bucket": "b", "mode": ["ro"]}
    with pytest.raises(ValueError, match=r"volume grant 1 \(of store 'lab'\): unknown key"):
        StorageConfig.from_config({"lab": {"kind": "s3"}}, [grant])
    ok = {"store": "lab", "bucket": "b", "prefix": "p", "modes": ["ro"], "users": ["a"]}
    assert StorageConfig.from_config({"lab": {"kind": "s3"}}, [ok]).grants[0].prefix == "p"


def test_storage_config_rejects_credential_values():
    with pytest.raises(ValueError, match="names, never values"):
        StorageConfig.from_config({"s3": {"credentials": {"secret": "x"}}}, [])
    with pytest.raises(ValueError, match="not an object store"):
        StorageConfig.from_config({}, [], "missing")


def sync_helper_config(**kw) -> dict:
    """The sync helper's spec as the one engine's container config (what it is sent)."""
    return helper_container_config(sync_helper_spec(**kw))


def test_sync_helper_config_filesystem_and_s3():
    fs = sync_helper_config(
        image="gpulab/sync:1",
        operation="pull",
        bucket="b",
        prefix="p/q",
        mode="rwd",
        docker_volume="vol",
        store_kind="filesystem",
        store_root="/srv/objects",
        endpoint_url=None,
        region="us-east-1",
        labels={"l": "1"},
        environment={},
    )
    assert fs["command"] == [
        "pull",
        "--bucket",
        "b",
        "--prefix",
        "p/q",
        "--json-progress",
        "--local",
        "/data",
        "--mode",
        "rwd",
        "--store-endpoint",
        "file:///store",
    ]
    # only the volume's own directories of the store, read-only for a pull (see
    # tests/unit/test_datasync_links.py for every operation)
    assert fs["host_config"]["binds"] == {
        "vol": {"bind": "/data", "mode": "rw"},
        "/srv/objects/b/p/q": {"bind": "/store/b/p/q", "mode": "ro"},
        "/srv/objects/.gpulab-meta/b/p/q": {"bind": "/store/.gpulab-meta/b/p/q", "mode": "ro"},
    }
    assert fs["user"] == "1000:100" and fs["host_config"]["cap_drop"] == ["ALL"]
    s3 = sync_helper_config(
        image="i",
        operation="purge",
        bucket="b",
        prefix="p",
        mode="rw",
        docker_volume=None,
        store_kind="s3",
        store_root=None,
        endpoint_url="http://e:9000",
        region="eu-west-1",
        labels={},
        environment={"AWS_ACCESS_KEY_ID": "k"},
    )
    assert "--local" not in s3["command"] and s3["host_config"]["binds"] == {}
    assert s3["command"][-4:] == ["--store-endpoint", "http://e:9000", "--region", "eu-west-1"]
    # what the caller passes as environment is the helper's; never on its command line (a
    # store's credentials are files: tests/unit/test_store_access.py)
    assert "k" not in s3["command"]


def test_a_live_push_helper_says_live_and_a_final_push_waits_for_it():
    kw = dict(
        image="i",
        bucket="b",
        prefix="p",
        mode="rwd",
        docker_volume="vol",
        store_kind="s3",
        store_root=None,
        endpoint_url=None,
        region="r",
        labels={},
        environment={},
    )
    live = sync_helper_spec(operation="push", live=True, **kw).command
    assert "--live" in live and "--wait-lock" not in live and "--settle-seconds" not in live
    live = sync_helper_spec(operation="push", live=True, settle_s=1.5, **kw).command
    assert live[live.index("--settle-seconds") + 1] == "1.5"
    final = sync_helper_spec(operation="push", wait_lock_s=300, **kw).command
    assert "--live" not in final and final[final.index("--wait-lock") + 1] == "300"
    pull = sync_helper_spec(operation="pull", live=True, wait_lock_s=300, **kw).command
    assert "--live" not in pull and pull[pull.index("--wait-lock") + 1] == "300"
    vol = VolumeSync(STORAGE.workspace_spec("ann", "", "/workspace"), "v", "workspace")
    report = {"live": True, "completed": 1, "skipped": 5, "in_flux": 2, "bytes_transferred": 9}
    assert SyncOutcome(vol, True, report).summary() == (
        "workspace: 1 transferred, 3 unchanged, 2 in flux, 9 B"
    )


def test_store_credentials(tmp_path, monkeypatch):
    s3 = STORAGE.stores["s3"]
    monkeypatch.delenv("K", raising=False)
    with pytest.raises(StorageCredentialsError, match=r"no credentials in \$K / \$S"):
        store_credentials(s3)
    monkeypatch.setenv("K", "key")
    monkeypatch.setenv("S", "secret")
    assert store_credentials(s3) == {"AWS_ACCESS_KEY_ID": "key", "AWS_SECRET_ACCESS_KEY": "secret"}
    assert store_credentials(STORAGE.stores["local"]) == {}
    f = tmp_path / "creds"
    f.write_text("[default]\naws_access_key_id = a\naws_secret_access_key = b\n")
    filed = StorageConfig.from_config({"x": {"credentials": {"file": str(f)}}}, []).stores["x"]
    assert store_credentials(filed) == {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}


def test_notebook_volumes_and_verdict():
    vols = notebook_volumes(STORAGE, "c", "ann", "nb", "/workspace", ["datasets@s3:/d"])
    assert [v.label for v in vols] == ["workspace", "datasets@s3:/d:ro"]
    assert vols[0].docker_volume == "c-workspace" and vols[1].docker_volume.startswith("c-v-")
    ok, msg = push_verdict(
        [SyncOutcome(vols[0], True, {"completed": 2, "bytes_transferred": 2048})]
    )
    assert ok and "workspace: 2 transferred" in msg and "2.0 KB" in msg
    bad = VolumeSync(vols[1].spec, "v", "results")
    ok, msg = push_verdict([SyncOutcome(bad, False, reason="store down")])
    assert not ok and "push of results failed: results: store down" in msg
    assert "Nothing local was deleted" in msg


def test_a_misspelt_store_key_stops_the_start_naming_the_setting():
    from traitlets.config import Config

    from gpulab.settings import ConfigError, GpulabSettings

    c = Config()
    c.GpulabSettings.object_stores = {"lab": {"kind": "s3", "endpoint": "https://s3.lab"}}
    with pytest.raises(ConfigError) as e:
        GpulabSettings(config=c)
    assert str(e.value).startswith(
        "c.GpulabSettings.object_stores / volume_grants: object store 'lab': unknown key(s) "
        "['endpoint']"
    )
