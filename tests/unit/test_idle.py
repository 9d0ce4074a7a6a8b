"""Who is idle, given recorded activity, idle times and flavors (pure: gpulab.idle), and the
settings that configure it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from traitlets.config import Config

from gpulab.frameworks import Catalog
from gpulab.idle import (
    gpu_unused_timeout_for,
    idle_notebooks,
    idle_timeout_for,
    last_activity,
    parse_time,
    unused_gpu_notebooks,
)
from gpulab.notebooks.options import OptionsError, parse_notebook_options
from gpulab.resources import Flavor, Limits, Resources
from gpulab.settings import DEFAULT_EDITORS, DEFAULT_FRAMEWORKS, ConfigError, GpulabSettings

NOW = datetime(2027, 1, 1, 12, 0, tzinfo=UTC)
GPU = Resources(cpus=2, memory=8 * 1024**3, gpus=1)
CPU = Resources(cpus=1, memory=2 * 1024**3, gpus=0)


def ago(seconds: float) -> str:
    return (NOW - timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def record(server="nb", timeout=600.0, running=3600.0, user="ann", state="RUNNING") -> dict:
    return {
        "user": user,
        "server": server,
        "state": state,
        "running_since": ago(running),
        "options": {"idle_timeout": timeout},
    }


def hub(activity=None, started=3600.0, ready=True, pending=None) -> dict:
    return {
        "last_activity": None if activity is None else ago(activity),
        "started": ago(started),
        "ready": ready,
        "pending": pending,
    }


def decide(records, servers, seen=None, now=NOW):
    stops, new_seen = idle_notebooks(records, servers, now, seen or {})
    return [(s.user, s.server) for s in stops], new_seen


def test_idle_past_its_time_is_stopped_active_is_not():
    records = [record("idle"), record("active"), record("edge")]
    servers = {
        ("ann", "idle"): hub(activity=601),
        ("ann", "active"): hub(activity=30),
        ("ann", "edge"): hub(activity=600),  # exactly its idle time: idle
    }
    stops, _ = decide(records, servers)
    assert stops == [("ann", "idle"), ("ann", "edge")]


def test_the_decision_carries_what_the_compare_and_set_needs():
    stops, _ = idle_notebooks([record("nb")], {("ann", "nb"): hub(activity=900)}, NOW, {})
    (stop,) = stops
    assert stop.running_since == ago(3600)
    assert stop.idle_for == 900 and stop.idle_timeout == 600
    assert stop.message.startswith("no activity for 15m (its idle time: 10m)")


@pytest.mark.parametrize("timeout", [0, 0.0, None, -5, float("nan"), float("inf"), True, "600"])
def test_no_idle_time_means_never(timeout):
    r = record(timeout=timeout)
    if timeout is None:
        r["options"] = {}
    stops, _ = decide([r], {("ann", "nb"): hub(activity=10**6, started=10**6)})
    assert stops == []


def test_a_start_or_stop_under_way_or_an_unknown_server_is_left_alone():
    records = [record("starting"), record("stopping"), record("gone"), record("unready")]
    servers = {
        ("ann", "starting"): hub(activity=9999, pending="spawn", ready=False),
        ("ann", "stopping"): hub(activity=9999, pending="stop"),
        ("ann", "gone"): None,
        ("ann", "unready"): hub(activity=9999, ready=False),
    }
    assert decide(records, servers)[0] == []


def test_only_running_records():
    servers = {("ann", "nb"): hub(activity=9999)}
    assert decide([record(state="STOPPING")], servers)[0] == []


def test_a_recent_start_counts_as_activity():
    # the hub never recorded activity, the server started 5 minutes ago (hub and gpulab)
    r = record(running=300)
    assert decide([r], {("ann", "nb"): hub(activity=None, started=300)})[0] == []
    # gpulab's RUNNING time counts too (a restart of the same server)
    r = record(running=60)
    assert decide([r], {("ann", "nb"): hub(activity=5000, started=5000)})[0] == []


def test_last_activity_is_the_latest_of_the_three():
    r = record(running=50)
    assert last_activity(r, hub(activity=70, started=90)) == NOW - timedelta(seconds=50)
    assert last_activity(record(running=500), hub(activity=70)) == NOW - timedelta(seconds=70)
    assert last_activity({"running_since": None}, None) is None


def test_an_activity_time_in_the_future_ages_from_when_it_was_first_seen():
    future = (NOW + timedelta(days=365)).isoformat()
    servers = {("ann", "nb"): {**hub(), "last_activity": future}}
    stops, seen = decide([record()], servers)
    assert stops == []  # first seen now
    later = NOW + timedelta(seconds=599)
    assert decide([record()], servers, seen, now=later)[0] == []
    later = NOW + timedelta(seconds=600)
    assert decide([record()], servers, seen, now=later)[0] == [("ann", "nb")]
    # a new report is a new value: it counts from when it is seen (still capped by its time)
    servers = {("ann", "nb"): {**hub(), "last_activity": ago(-10)}}
    stops, seen2 = decide([record()], servers, seen, now=later)
    assert stops == [] and len(seen2) == 1


def test_seen_keeps_only_current_values():
    servers = {("ann", "nb"): hub(activity=5)}
    _, seen = decide([record()], servers, {("ann", "old", "x"): NOW})
    assert list(seen) == [("ann", "nb", parse_time(ago(5)).isoformat())]


def test_users_are_judged_apart():
    records = [record("nb", user="ann"), record("nb", user="bob")]
    servers = {("ann", "nb"): hub(activity=10), ("bob", "nb"): hub(activity=700)}
    assert decide(records, servers)[0] == [("bob", "nb")]


def test_parse_time_forms():
    assert parse_time("2027-01-01T12:00:00Z") == NOW
    assert parse_time("2027-01-01T12:00:00") == NOW  # the hub's naive UTC
    assert parse_time("2027-01-01T13:00:00+01:00") == NOW
    assert parse_time("yesterday") is None and parse_time(None) is None and parse_time(5) is None


# --- idle times: flavors and defaults ---------------------------------------------------------


def flavor(gpus=0, idle=None) -> Flavor:
    res = GPU if gpus else CPU
    return Flavor(id="f", title="f", resources=res, idle_timeout=idle)


def test_idle_time_from_flavor_else_the_kind_default():
    assert idle_timeout_for(flavor(gpus=1), GPU, 3600, 0) == 3600
    assert idle_timeout_for(flavor(gpus=0), CPU, 3600, 0) == 0
    assert idle_timeout_for(flavor(gpus=1, idle=900), GPU, 3600, 0) == 900
    assert idle_timeout_for(flavor(gpus=0, idle=7200), CPU, 3600, 0) == 7200
    assert idle_timeout_for(None, GPU, 3600, 0) == 3600
    assert idle_timeout_for(None, CPU, 3600, 1800) == 1800


def test_adding_gpus_to_a_flavor_does_not_escape_the_gpu_idle_stop():
    # a CPU flavor whose idle stop is off, asked for with a GPU
    assert idle_timeout_for(flavor(gpus=0, idle=0), GPU, 3600, 0) == 3600


CATALOG = Catalog.from_config(DEFAULT_FRAMEWORKS, DEFAULT_EDITORS)
FLAVORS = {
    f.id: f
    for f in [
        Flavor.from_config({"id": "cpu", "cpus": 1, "memory": "2G"}),
        Flavor.from_config({"id": "gpu", "cpus": 1, "memory": "2G", "gpus": 1}),
        Flavor.from_config(
            {"id": "gpu-long", "cpus": 1, "memory": "2G", "gpus": 1, "idle_timeout": 14400}
        ),
    ]
}
LIMITS = Limits(cpus=2, memory=16 * 1024**3, gpus=2)


def options(raw):
    return parse_notebook_options(
        raw, CATALOG, FLAVORS, LIMITS, "cpu", gpu_idle_timeout=3600, cpu_idle_timeout=0
    )


def test_options_record_the_idle_time_and_users_cannot_set_it():
    assert options({"flavor": "gpu"}).to_json()["idle_timeout"] == 3600
    assert options({"flavor": "gpu-long"}).idle_timeout == 14400
    assert options({"flavor": "cpu"}).idle_timeout == 0
    assert options({"cpus": 1, "memory": "1G", "gpus": 1}).idle_timeout == 3600
    assert options({"flavor": "cpu", "gpus": 1}).idle_timeout == 3600
    with pytest.raises(OptionsError) as e:
        options({"flavor": "gpu", "idle_timeout": 0})
    assert e.value.field == "idle_timeout"


# --- settings: a bad configuration is a clear error -------------------------------------------


def settings(**kw) -> GpulabSettings:
    c = Config()
    for k, v in kw.items():
        setattr(c.GpulabSettings, k, v)
    return GpulabSettings(config=c)


def test_default_settings_gpu_flavors_stop_after_an_hour_cpu_never():
    s = settings()
    assert s.idle_timeout_for("gpu-1", s.flavor_map["gpu-1"].resources) == 3600
    assert s.idle_timeout_for("cpu-small", s.flavor_map["cpu-small"].resources) == 0


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"gpu_idle_timeout": 60}, "gpu_idle_timeout = 60 s is shorter than twice"),
        ({"cpu_idle_timeout": -1}, "cannot be negative"),
        (
            {"flavors": [{"id": "g", "cpus": 1, "memory": "1G", "idle_timeout": "1h"}]},
            "flavor 'g': idle_timeout must be a number of seconds",
        ),
        (
            {"flavors": [{"id": "g", "cpus": 1, "memory": "1G", "idle_timeout": 30}]},
            "flavor 'g': idle_timeout = 30 s is shorter than twice activity_report_interval",
        ),
        ({"activity_report_interval": 0}, "activity_report_interval must be at least 1"),
        (
            {"gpu_unused_timeout": 30},
            "gpu_unused_timeout = 30 s is shorter than twice idle_check_interval",
        ),
        ({"gpu_unused_timeout": float("nan")}, "gpu_unused_timeout must be a number of seconds"),
        (
            {"flavors": [{"id": "g", "cpus": 1, "memory": "1G", "gpu_unused_timeout": "2h"}]},
            "flavor 'g': gpu_unused_timeout must be a number of seconds",
        ),
        ({"idle_check_interval": 0}, "idle_check_interval must be a positive"),
    ],
)
def test_bad_idle_settings_are_refused_with_their_name(kw, words):
    with pytest.raises(ConfigError) as e:
        settings(**kw)
    assert words in str(e.value)


def test_short_idle_times_go_with_short_reports():
    s = settings(activity_report_interval=5, gpu_idle_timeout=10, cpu_idle_timeout=0)
    assert s.gpu_idle_timeout == 10


# --- GPUs left unused: the policy's rule as data ----------------------------------------------


def test_gpu_unused_time_from_the_flavor_else_the_site_and_never_without_gpus():
    assert gpu_unused_timeout_for(flavor(gpus=1), GPU, 7200) == 7200
    assert gpu_unused_timeout_for(None, GPU, 0) == 0  # the policy is off by default
    assert gpu_unused_timeout_for(None, CPU, 7200) == 0
    own = Flavor.from_config(
        {"id": "g", "cpus": 1, "memory": "1G", "gpus": 1, "gpu_unused_timeout": 1800}
    )
    assert gpu_unused_timeout_for(own, GPU, 7200) == 1800
    assert gpu_unused_timeout_for(own, Resources(cpus=1, memory=2**30, gpus=2), 7200) == 7200


def test_options_record_the_gpu_unused_time_and_users_cannot_set_it():
    def opts(raw):
        return parse_notebook_options(
            raw, CATALOG, FLAVORS, LIMITS, "cpu", gpu_idle_timeout=3600, gpu_unused_timeout=900
        )

    assert opts({"flavor": "gpu"}).to_json()["gpu_unused_timeout"] == 900
    assert opts({"flavor": "cpu"}).gpu_unused_timeout == 0
    assert options({"flavor": "gpu"}).gpu_unused_timeout == 0  # the site's policy is off
    with pytest.raises(OptionsError) as e:
        opts({"flavor": "gpu", "gpu_unused_timeout": 0})
    assert e.value.field == "gpu_unused_timeout"


def _unused(busy, since=None, timeout=600.0, state="RUNNING"):
    now = datetime(2026, 1, 1, 12, tzinfo=UTC)
    nb = {
        "user": "ann",
        "server": "nb",
        "state": state,
        "running_since": "2026-01-01T10:00:00+00:00",
        "options": {"gpu_unused_timeout": timeout},
    }
    key = ("ann", "nb", nb["running_since"])
    seen = {} if since is None else {key: now - timedelta(seconds=since)}
    return unused_gpu_notebooks([nb], {("ann", "nb"): busy}, now, seen)


def test_gpus_unused_for_their_whole_time_stop_the_notebook():
    stops, seen = _unused(0, since=600)
    assert [(s.user, s.server, s.kind) for s in stops] == [("ann", "nb", "gpu")]
    assert stops[0].running_since == "2026-01-01T10:00:00+00:00"  # the compare-and-set's
    assert stops[0].message.startswith("its GPUs unused for 10m")
    assert _unused(0, since=599)[0] == []


@pytest.mark.parametrize(
    "busy, timeout, state",
    [(1, 600, "RUNNING"), (None, 600, "RUNNING"), (0, 0, "RUNNING"), (0, 600, "STOPPING")],
)
def test_gpus_in_use_unread_a_policy_off_or_a_notebook_not_running_stop_nobody(
    busy, timeout, state
):
    stops, seen = _unused(busy, since=3600, timeout=timeout, state=state)
    assert stops == [] and seen == {}  # and the clock starts again


def test_the_clock_starts_at_the_first_look_that_finds_the_gpus_unused():
    stops, seen = _unused(0)
    assert stops == [] and list(seen.values()) == [datetime(2026, 1, 1, 12, tzinfo=UTC)]
