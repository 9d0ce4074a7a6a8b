"""``gpulab doctor``'s checks as data (each status of each check), the CUDA rule it shares, the
pieces of its gathering that need no engine, and the CLI's hand-off to it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from traitlets.config import Config

from gpulab.cuda import cuda_gap, cuda_shortfall, parse_cuda
from gpulab.db import expected_schema, read_schema
from gpulab.doctor import checks as c
from gpulab.doctor.checks import (
    ERROR,
    OK,
    WARNING,
    BucketProbe,
    DatabaseFacts,
    Facts,
    ImageNeed,
    ProxyFacts,
    StoreFacts,
)
from gpulab.doctor.gather import _buckets, _root_state, proxy_facts
from gpulab.gpus.inventory import GpuDevice, Inventory
from gpulab.runtime.base import EngineError, EngineNetwork, EngineSurvey
from gpulab.runtime.engine import EngineClient
from gpulab.runtime.survey import daemon_json_pools, pools_of
from gpulab.settings import GpulabSettings

NVIDIA = {"nvidia": {"path": "nvidia-container-runtime"}, "runc": {"path": "runc"}}
RUNC = {"runc": {"path": "runc"}}
ENGINE = EngineSurvey(
    address="unix:///var/run/docker.sock",
    version="27.3.1",
    runtimes=NVIDIA,
    default_runtime="runc",
)
DOWN = EngineSurvey(error="Error while fetching server API version: connection refused")
DRIVER = Inventory(
    (GpuDevice("0", "NVIDIA H100 80GB HBM3", "81559M"),), "nvml", "550.54.15", "12.4"
)
NO_DRIVER = Inventory(source="nvml", problem="no NVIDIA driver found")


# --- the CUDA rule (core) -----------------------------------------------------------------


@pytest.mark.parametrize(
    "text, parsed",
    [("12.8", (12, 8)), ("12", (12, 0)), ("12.8.1", (12, 8)), ("", None), ("x.1", None)],
)
def test_cuda_versions_parse(text, parsed):
    assert parse_cuda(text) == parsed


@pytest.mark.parametrize(
    "needed, driver, gap",
    [
        ("12.8", "12.9", ""),
        ("12.8", "12.8", ""),
        ("12.8", "12.4", "minor"),
        ("12.8", "11.8", "major"),
        ("12.8", "", ""),  # unknown: no gap claimed
        ("", "12.4", ""),
    ],
)
def test_cuda_gap(needed, driver, gap):
    assert cuda_gap(needed, driver) == gap
    shortfall = cuda_shortfall("img", needed, driver)
    assert (shortfall is None) == (gap == "")
    if gap:
        assert f"needs CUDA {needed}" in shortfall and f"supports CUDA {driver}" in shortfall


# --- engine, driver, GPUs, delivery ---------------------------------------------------------


def test_engine_ok_and_down():
    up = c.check_engine(ENGINE)
    assert up.status == OK and "27.3.1" in up.found and "docker.sock" in up.found
    down = c.check_engine(DOWN)
    assert down.status == ERROR and "connection refused" in down.found
    assert "DOCKER_HOST" in down.todo


def test_gpu_delivery_uses_the_start_up_rule():
    ok = c.check_gpu_delivery("device_request", 2, ENGINE)
    assert ok.status == OK and "2 GPU(s)" in ok.found
    runc = EngineSurvey(runtimes=RUNC, default_runtime="runc")
    refused = c.check_gpu_delivery("device_request", 2, runc)
    assert refused.status == ERROR
    assert "nvidia-ctk runtime configure" in refused.todo  # the rule's own words: the fix
    env = c.check_gpu_delivery("env", 1, ENGINE)  # nvidia is there, but not the default
    assert env.status == ERROR and "--set-as-default" in env.todo
    none = c.check_gpu_delivery("device_request", 0, runc)
    assert none.status == OK and "no GPU" in none.found
    assert c.check_gpu_delivery("device_request", 2, DOWN) is None  # the engine's line says
    swarm = c.check_gpu_delivery("device_request", 2, ENGINE, clustered=True)
    assert swarm.status == WARNING
    assert c.check_gpu_delivery("nope", 1, ENGINE).status == ERROR
    off = c.check_gpu_delivery("device_request", 2, runc, enforced=False)  # check_gpu_runtime
    assert off.status == WARNING and "check_gpu_runtime is off" in off.found


def test_driver():
    ok = c.check_driver(DRIVER, (), True)
    assert ok.status == OK and "550.54.15" in ok.found and "CUDA 12.4" in ok.found
    missing = c.check_driver(NO_DRIVER, (), True)
    assert missing.status == WARNING and "no NVIDIA driver" in missing.found
    assert "nvidia-smi" in missing.todo
    configured = c.check_driver(NO_DRIVER, (GpuDevice("0"),), True)
    assert configured.status == WARNING and "nothing confirms" in configured.found
    off = c.check_driver(Inventory(), (), False)
    assert off.status == WARNING and "discover_gpus is off" in off.found


def test_gpus_each_one_and_a_configured_one_nvml_lacks():
    mig = Inventory(
        (GpuDevice("0", "H100", "81559M"), GpuDevice("MIG-ab", "A100 MIG 0", "9984M")),
        "nvml",
        "550",
        "12.4",
    )
    found = c.check_gpus((), mig, True)
    assert [(f.check, f.status) for f in found] == [("gpu 0", OK), ("gpu MIG-ab", OK)]
    assert found[0].found == "GPU 0: H100, 81559M"
    assert found[1].found.startswith("MIG device MIG-ab")
    assert c.check_gpus((), mig, False) == []  # discovery off: none handed out
    wrong = c.check_gpus((GpuDevice("0"), GpuDevice("3")), mig, True)
    assert [f.status for f in wrong] == [OK, ERROR]
    assert "'3'" in wrong[1].found and "0, MIG-ab" in wrong[1].found
    unconfirmed = c.check_gpus((GpuDevice("0", "A100"),), NO_DRIVER, True)
    assert unconfirmed[0].status == OK and "not confirmed by NVML" in unconfirmed[0].found


# --- images -------------------------------------------------------------------------------

FW = ImageNeed("gpulab/pytorch:2.13", "framework", "pytorch 2.13")
SYNC = ImageNeed("gpulab/sync:1", "sync", "sync helper")
CUDA_128 = {"org.gpulab.flavour": "cuda", "org.gpulab.cuda": "12.8"}
CPU = {"org.gpulab.flavour": "cpu"}


@pytest.mark.parametrize(
    "need, labels, driver, gpus, status, words",
    [
        (FW, None, "12.4", 1, WARNING, "missing on this host"),
        (SYNC, None, "12.4", 1, ERROR, "sync helper"),
        (FW, CUDA_128, "12.9", 1, OK, "CUDA build (needs CUDA 12.8)"),
        (FW, CUDA_128, "12.4", 1, WARNING, "driver CUDA 12.4"),
        (FW, CUDA_128, "11.8", 1, ERROR, "driver CUDA 11.8"),
        (FW, CUDA_128, "", 0, WARNING, "without a working NVIDIA driver"),
        (FW, CPU, "12.4", 2, WARNING, "CPU build on a host with 2 GPU(s)"),
        (FW, CPU, "", 0, OK, "CPU build"),
        (SYNC, {}, "12.4", 2, OK, "present"),
        (FW, {}, "12.4", 2, WARNING, "flavour unknown"),
        (FW, {}, "", 0, OK, "present"),
        (FW, {"org.gpulab.flavour": "rocm"}, "", 0, WARNING, "unknown flavour 'rocm'"),
        # read as the catalog reads them (cuda.ImageBuild): any case, a CUDA version alone
        (FW, {"org.gpulab.flavour": "CUDA", "org.gpulab.cuda": "12.4"}, "12.4", 1, OK, "CUDA"),
        (FW, {"org.gpulab.cuda": "13.0"}, "12.4", 1, ERROR, "needs CUDA 13.0"),
    ],
)
def test_each_image(need, labels, driver, gpus, status, words):
    f = c.check_image(need, labels, driver, gpus)
    assert f.check == f"image {need.image}"
    assert f.status == status and words in f.found, f
    if status != OK:
        assert f.todo


def test_images_on_a_swarm_or_a_silent_engine():
    facts = Facts(config="x", images=(FW, SYNC), clustered=True)
    (one,) = c.check_images(facts)
    assert one.status == WARNING and "2 image(s) not checked" in one.found
    assert c.check_images(Facts(config="x", images=(FW,), engine=DOWN)) == []
    engine = EngineSurvey(version="1", images={FW.image: CUDA_128, SYNC.image: None})
    facts = Facts(config="x", images=(FW, SYNC), engine=engine, nvml=DRIVER)
    assert [f.status for f in c.check_images(facts)] == [WARNING, ERROR]


# --- stores -------------------------------------------------------------------------------

S3 = StoreFacts("s3", "s3", where="http://s3.example:9000", credentials_from="$S3_KEY / $S3_SECRET")


def _store(*probes: BucketProbe, **kw) -> StoreFacts:
    return StoreFacts(**{**S3.__dict__, "probes": probes, **kw})


@pytest.mark.parametrize(
    "probe, status, words",
    [
        (BucketProbe("data", "volume grant"), OK, "data answer(s) with the keys from $S3_KEY"),
        (BucketProbe("ws", "workspaces", code="NoSuchBucket"), OK, "ws (not there yet: made at"),
        (BucketProbe("ro", "volume grant", True, "NoSuchBucket"), WARNING, "volumes of it"),
        (BucketProbe("d", "g", code="InvalidAccessKeyId"), ERROR, "does not know the access"),
        (BucketProbe("d", "g", code="SignatureDoesNotMatch"), ERROR, "does not match"),
        (BucketProbe("d", "g", code="AccessDenied"), ERROR, "refuses the keys"),
        (BucketProbe("d", "g", code="unreachable", message="timeout"), ERROR, "cannot reach"),
        (BucketProbe("d", "g", code="InternalError"), ERROR, "InternalError"),
    ],
)
def test_each_store_outcome(probe, status, words):
    (f,) = c.check_store(_store(probe))
    assert f.check == "store s3" and f.status == status and words in f.found, f


def test_a_store_lists_only_what_is_wrong_and_its_credentials():
    found = c.check_store(_store(BucketProbe("a", "g"), BucketProbe("b", "g", code="AccessDenied")))
    assert [f.status for f in found] == [ERROR] and "bucket b" in found[0].found
    (creds,) = c.check_store(_store(credentials_error="store s3: no credentials in $S3_KEY"))
    assert creds.status == ERROR and "GPULAB_SERVICE_ENV" in creds.todo


@pytest.mark.parametrize(
    "state, status",
    [("writable", OK), ("missing", OK), ("not writable", ERROR), ("not a directory", ERROR)],
)
def test_filesystem_stores(state, status):
    (f,) = c.check_store(StoreFacts("local", "filesystem", where="/srv/o", root_state=state))
    assert f.status == status


# --- address pools ------------------------------------------------------------------------


def _pools(networks, pools=None, users=50, **kw) -> c.Finding:
    engine = EngineSurvey(
        version="1", networks=tuple(networks), address_pools=pools, pools_from="docker info"
    )
    return c.check_address_pools(Facts(config="x", engine=engine, users_needed=users, **kw))


def test_address_pools_against_the_users():
    others = [EngineNetwork("bridge", ("172.17.0.0/16",)), EngineNetwork("host")]
    ours = [EngineNetwork("gpulab-net-a", ("172.18.0.0/16",), ours=True)]
    few = _pools(others + ours)
    assert few.status == WARNING
    assert "room for 30 user networks" in few.found and "1 by gpulab's" in few.found
    assert "default-address-pools" in few.todo
    assert _pools(others, users=30).status == OK
    big = _pools(others, pools=(("10.201.0.0/16", 24),), users=200)
    assert big.status == OK and "room for 256" in big.found  # 172.17 is outside the pool
    assert _pools([], network_isolation="none").status == OK
    assert _pools([], clustered=True).status == WARNING
    assert c.check_address_pools(Facts(config="x", engine=DOWN)) is None


def test_pools_as_docker_info_and_daemon_json_write_them(tmp_path):
    assert pools_of([{"Base": "10.201.0.0/16", "Size": 24}, {"base": "x"}]) == (
        ("10.201.0.0/16", 24),
    )
    daemon = tmp_path / "daemon.json"
    daemon.write_text(json.dumps({"default-address-pools": [{"base": "10.9.0.0/16", "size": 24}]}))
    assert daemon_json_pools(daemon) == (("10.9.0.0/16", 24),)
    assert daemon_json_pools(tmp_path / "none.json") is None
    daemon.write_text("{}")
    assert daemon_json_pools(daemon) is None


# --- database and proxy -------------------------------------------------------------------


def test_database_schema_read_without_changing_it(tmp_path):
    url = f"sqlite:///{tmp_path / 'g.sqlite'}"
    assert read_schema(url) is None and not (tmp_path / "g.sqlite").exists()
    expected = expected_schema()
    assert "jobs" in expected and "state" in expected["jobs"]
    fresh = c.check_database(DatabaseFacts("db", tables=None, expected=expected))
    assert fresh.status == OK and "does not exist yet" in fresh.found

    from gpulab.db import Database

    Database(url)  # what the hub does at its start: every table
    current = c.check_database(DatabaseFacts("db", tables=read_schema(url), expected=expected))
    assert current.status == OK and "schema current" in current.found
    older = {t: cols for t, cols in read_schema(url).items() if t != "leases"}
    older["jobs"] = older["jobs"] - {"state"}
    stale = c.check_database(DatabaseFacts("db", tables=older, expected=expected))
    assert stale.status == WARNING
    assert "tables leases" in stale.found and "columns jobs.state" in stale.found
    down = c.check_database(DatabaseFacts("db", error="connection refused", expected=expected))
    assert down.status == ERROR
    # the schema's revision: the doctor reads it, and an older one waits for upgrade-db
    from gpulab.doctor.gather import database_facts

    facts = database_facts(url)
    assert facts.revision == facts.head and facts.head
    assert "revision " + facts.head in c.check_database(facts).found
    behind = c.check_database(
        DatabaseFacts("db", tables=read_schema(url), expected=expected, revision="0", head="1")
    )
    assert behind.status == WARNING and "upgrade-db" in behind.todo


def test_proxy(tmp_path):
    assert c.check_proxy(ProxyFacts("chp", "/usr/bin/chp")).status == OK
    missing = c.check_proxy(ProxyFacts("configurable-http-proxy"))
    assert missing.status == ERROR and "npm install" in missing.todo
    assert c.check_proxy(ProxyFacts("x", started_by_hub=False)).status == OK
    tool = tmp_path / "chp"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    cfg = Config()
    cfg.ConfigurableHTTPProxy.command = [str(tool)]
    assert proxy_facts(cfg).path == str(tool)
    cfg.ConfigurableHTTPProxy.command = [str(tmp_path / "nothing")]
    assert proxy_facts(cfg).path == ""
    assert proxy_facts(Config()).command == "configurable-http-proxy"


# --- gathering without an engine ----------------------------------------------------------


def test_root_states(tmp_path):
    assert _root_state(str(tmp_path)) == "writable"
    assert _root_state(str(tmp_path / "a" / "b")) == "missing"
    (tmp_path / "f").write_text("")
    assert _root_state(str(tmp_path / "f")) == "not a directory"


def test_buckets_the_configuration_names():
    s = GpulabSettings(
        object_stores={"s3": {"endpoint_url": "http://x"}},
        workspace_store="s3",
        workspace_bucket="wsp",
        volume_grants=[
            {"store": "s3", "bucket": "shared", "modes": ["ro"]},
            {"store": "s3", "bucket": "scratch"},
            {"store": "s3", "bucket": "wsp", "modes": ["ro"]},
        ],
    )
    assert _buckets(s, "s3") == [
        ("wsp", "workspaces", False),
        ("shared", "volume grant", True),
        ("scratch", "volume grant", False),
    ]
    assert _buckets(s, "other") == []


def test_the_engine_client_follows_docker_host(monkeypatch):
    """The service's engine is DOCKER_HOST's, as the hub's DockerSpawner's and the docker
    CLI's (and the doctor's): an engine there that does not answer is an EngineError."""
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:9")
    with pytest.raises(EngineError) as e:
        EngineClient(None, None).client  # noqa: B018
    assert "127.0.0.1:9" in str(e.value) or "Connection refused" in str(e.value)


# --- the whole report ---------------------------------------------------------------------


def test_check_all_render_and_exit_code():
    facts = Facts(
        config="/srv/jupyterhub_config.py",
        configured_gpus=(),
        nvml=DRIVER,
        engine=EngineSurvey(
            address="unix:///var/run/docker.sock",
            version="27.3.1",
            runtimes=RUNC,
            default_runtime="runc",
            images={FW.image: CUDA_128},
        ),
        images=(FW,),
        stores=(_store(BucketProbe("d", "g", code="SignatureDoesNotMatch")),),
        users_needed=10,
        database=DatabaseFacts("sqlite:///g", tables=None),
        proxy=ProxyFacts("chp", "/bin/chp"),
    )
    findings = c.check_all(facts, "runtime docker")
    checks = [f.check for f in findings]
    assert checks == [
        "config",
        "engine",
        "driver",
        "gpu 0",
        "gpu runtime",
        f"image {FW.image}",
        "store s3",
        "address pools",
        "database",
        "proxy",
    ]
    assert c.exit_code(findings) == 1  # runc only: the GPU cannot be handed out
    text = c.render(findings)
    assert text.splitlines()[0].startswith("ok       config")
    assert "\n" + " " * 9 in text and "-> " in text  # what to do, under the error
    assert text.endswith("error(s)\n")
    doc = c.to_json(findings)
    assert doc["status"] == ERROR and doc["checks"][0]["check"] == "config"
    assert c.exit_code([c.Finding("x", WARNING, "w")]) == 0


# --- the CLI hands `gpulab doctor` to the doctor's program ---------------------------------


def test_gpulab_doctor_runs_the_doctor(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(c.__file__).parents[2])}
    run = subprocess.run(
        [sys.executable, "-m", "gpulab.cli", "doctor", "--config", str(tmp_path / "none.py")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert run.returncode == 1, run.stderr
    assert run.stdout.startswith("error    config  cannot read")
    assert "no file" in run.stdout and "Traceback" not in run.stderr
    usage = subprocess.run(
        [sys.executable, "-m", "gpulab.cli", "doctor", "--nope"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert usage.returncode == 2 and "gpulab doctor" in usage.stderr


def test_what_the_survey_makes_of_the_engines_answers(monkeypatch):
    from gpulab.runtime.survey import _network, engine_address

    net = {
        "Name": "gpulab-net-ann",
        "IPAM": {"Config": [{"Subnet": "172.18.0.0/16", "Gateway": "172.18.0.1"}]},
        "Labels": {"org.gpulab.instance": "gpulab"},
    }
    assert _network(net, "gpulab") == EngineNetwork("gpulab-net-ann", ("172.18.0.0/16",), True)
    assert not _network(net, "other").ours
    assert _network({"Name": "host", "IPAM": {"Config": None}}, "gpulab").subnets == ()
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    assert engine_address("http+docker://localhost") == "unix:///var/run/docker.sock"
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/user/1000/docker.sock")
    assert engine_address("http+docker://localhost") == "unix:///run/user/1000/docker.sock"
    assert engine_address("https://10.0.0.5:2376") == "https://10.0.0.5:2376"


def test_a_configuration_file_that_refuses_is_a_config_error(tmp_path):
    from gpulab.doctor.gather import ConfigUnreadable, read_settings

    refusing = tmp_path / "refuses.py"
    refusing.write_text('raise SystemExit("GPULAB_SITE_CONFIG names /x, which is not a file")\n')
    with pytest.raises(ConfigUnreadable, match="which is not a file"):
        read_settings(str(refusing))
    broken = tmp_path / "broken.py"
    broken.write_text("c = get_config()  # noqa\nc.GpulabSettings.gpu_mode = 'nope'\n")
    with pytest.raises(ConfigUnreadable, match="TraitError"):
        read_settings(str(broken))
