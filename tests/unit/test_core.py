"""The pure core: lifecycle, resources, catalog and option validation (no I/O)."""

from __future__ import annotations

import pytest

from gpulab.frameworks import Catalog
from gpulab.lifecycle import (
    InvalidTransition,
    JobState,
    NotebookState,
    check_job_transition,
    check_notebook_transition,
)
from gpulab.names import escape_name, notebook_container_name
from gpulab.notebooks.options import OptionsError, form_to_options, parse_notebook_options
from gpulab.resources import (
    Flavor,
    ResourceError,
    container_limits,
    effective_limits,
    format_memory,
    parse_memory,
    resolve_resources,
)
from gpulab.runtime.objects import gpu_request, limits_host_config

from ..support.options import CATALOG, FLAVORS, LIMITS

S = NotebookState


def parse(raw, **kw):
    return parse_notebook_options(raw, CATALOG, FLAVORS, LIMITS, "cpu-small", **kw)


def test_notebook_life_allows_the_domain_paths():
    path = [
        S.STARTING,
        S.RUNNING,
        S.STOPPING,
        S.STOPPED,
        S.STARTING,
        S.RUNNING,
        S.STOPPING,
        S.SYNC_FAILED,
        S.STOPPING,
        S.STOPPED,
        S.DELETING,
        S.DELETED,
    ]
    old = None
    for new in path:
        check_notebook_transition(old, new)
        old = new


@pytest.mark.parametrize(
    "old, new",
    [
        (None, S.RUNNING),
        (S.STOPPED, S.RUNNING),
        (S.DELETED, S.RUNNING),
        (S.RUNNING, S.STOPPED),
        (S.DELETING, S.STARTING),
    ],
)
def test_notebook_life_refuses_shortcuts(old, new):
    with pytest.raises(InvalidTransition, match=f"to {new.value}"):
        check_notebook_transition(old, new)


def test_job_life():
    J = JobState
    for old, new in [
        (None, J.QUEUED),
        (J.QUEUED, J.INITIALIZING),
        (J.RUNNING, J.RESTARTING),
        (J.FINALIZING, J.SYNC_FAILED),
        (J.INTERRUPTING, J.QUEUED),
    ]:
        check_job_transition(old, new)
    with pytest.raises(InvalidTransition):
        check_job_transition(J.DONE, J.RUNNING)


@pytest.mark.parametrize(
    "text, size",
    [
        ("512M", 512 * 1024**2),
        ("4G", 4 * 1024**3),
        ("1.5GiB", int(1.5 * 1024**3)),
        ("2gb", 2 * 1024**3),
        (1024, 1024),
    ],
)
def test_parse_memory(text, size):
    assert parse_memory(text) == size


@pytest.mark.parametrize("bad", ["-1G", "0", "lots", "", True, -5, "4X"])
def test_parse_memory_rejects(bad):
    with pytest.raises(ResourceError):
        parse_memory(bad)


def test_format_memory():
    assert format_memory(8 * 1024**3) == "8G" and format_memory(1536 * 1024**2) == "1536M"


def test_effective_limits_user_beats_groups_beats_default():
    default = {"cpus": 1, "memory": "2G", "gpus": 0}
    groups = {"a": {"gpus": 1}, "b": {"gpus": 4, "cpus": 2}}
    assert effective_limits("x", [], default, {}, groups).gpus == 0
    got = effective_limits("x", ["a", "b"], default, {}, groups)
    assert (got.gpus, got.cpus) == (4, 2)
    assert effective_limits("x", ["b"], default, {"x": {"gpus": 8}}, groups).gpus == 8


def test_resolve_resources_flavor_and_overrides():
    res = resolve_resources(FLAVORS, LIMITS, "cpu-small")
    assert (res.cpus, res.memory, res.gpus) == (1, 2 * 1024**3, 0)
    res = resolve_resources(FLAVORS, LIMITS, None, cpus="0.5", memory="1G", gpus="1")
    assert (res.cpus, res.memory, res.gpus) == (0.5, 1024**3, 1)
    with pytest.raises(ResourceError, match="allowed: cpus ≤ 2, memory ≤ 8G, gpus ≤ 1"):
        resolve_resources(FLAVORS, LIMITS, "gpu-2")
    with pytest.raises(ResourceError, match="whole number"):
        resolve_resources(FLAVORS, LIMITS, None, cpus=1, memory="1G", gpus="1.5")
    with pytest.raises(ResourceError, match="cannot be negative"):
        resolve_resources(FLAVORS, LIMITS, None, cpus=1, memory="1G", gpus=-1)


def test_container_limits():
    res = resolve_resources(FLAVORS, LIMITS, "cpu-small")
    hc = limits_host_config(container_limits(res, pids_limit=100))
    assert hc == {
        "cpu_period": 100_000,
        "cpu_quota": 100_000,
        "mem_limit": 2 * 1024**3,
        "memswap_limit": 2 * 1024**3,
        "pids_limit": 100,
        "shm_size": 1024**3,
    }


def test_defaults_and_choices():
    opts = parse({})
    assert (opts.framework, opts.version, opts.editor, opts.image, opts.flavor) == (
        "python",
        "3.11",
        "jupyterlab",
        "gpulab/python:3.11",
        "cpu-small",
    )
    assert opts.default_url == "/lab"
    assert parse({"framework": "pytorch"}).image == "gpulab/pytorch:2.13"


def test_images_outside_catalog_only_when_allowed():
    with pytest.raises(OptionsError, match="not in the catalog") as e:
        parse({"image": "evil/miner:latest"})
    assert e.value.field == "image"
    assert parse({"image": "evil/miner:latest"}, allowed_images=frozenset({"evil/miner:latest"}))
    # naming a catalog image directly is fine
    assert parse({"image": "gpulab/pytorch:2.13"}).image == "gpulab/pytorch:2.13"


@pytest.mark.parametrize(
    "raw, field",
    [
        ({"framework": "caffe"}, "framework"),
        ({"version": "9"}, "version"),
        ({"editor": "vi"}, "editor"),
        ({"flavor": "huge"}, "flavor"),
        ({"gpus": 3}, "gpus"),
        ({"cpus": True}, "cpus"),
        ({"extra": 1}, "extra"),
        ({"framework": ["python"]}, "framework"),
        ({"auto_restart": "sometimes"}, "auto_restart"),
    ],
)
def test_invalid_options_name_their_field(raw, field):
    with pytest.raises(OptionsError) as e:
        parse(raw)
    assert e.value.field == field


def test_notebook_notify_options_as_the_form_and_the_api_give_them():
    from gpulab.notices import NotifyRules

    rules = NotifyRules(webhook_hosts=("*.example.org",), mail=True, mail_domains=("*",))
    opts = parse(
        form_to_options({"notify_on": ["done", "failed"], "notify_email": ["a@b.org"]}),
        notify_rules=rules,
    )
    assert opts.to_json()["notify"] == {
        "on": ["done", "failed"],
        "webhook": None,
        "email": "a@b.org",
    }
    api = {"notify_webhook": "https://h.example.org/x", "notify_on": ["failed"]}
    assert parse(api, notify_rules=rules).notify.on == ("failed",)
    assert parse({}).notify is None and parse({}).to_json()["notify"] is None
    off = NotifyRules()  # the default: nothing is sent anywhere
    for raw, given, field, words in [
        ({"notify_on": "done"}, rules, "notify_webhook", "give notify_webhook or notify_email"),
        ({"notify_webhook": "https://h.example.org/x"}, off, "notify_webhook", "not enabled"),
        ({"notify_email": "a@b.org"}, off, "notify_email", "not enabled"),
        ({"notify_webhook": "http://169.254.169.254/"}, rules, "notify_webhook", "may not go"),
        ({"notify_email": "a@b.org", "notify_on": "ended"}, rules, "notify_on", "unknown event"),
        ({"notify_email": "a@b.org", "notify_on": []}, rules, "notify_on", "the events, from"),
    ]:
        with pytest.raises(OptionsError) as e:
            parse(raw, notify_rules=given)
        assert e.value.field == field and words in str(e.value), str(e.value)
        assert str(e.value).startswith(f"{field}:"), str(e.value)  # what the form's script reads


def test_second_editor_needs_no_redesign():
    catalog = Catalog.from_config(
        [
            {
                "id": "py",
                "versions": [{"id": "1", "image": "img"}],
                "editors": ["jupyterlab", "vscode"],
            }
        ],
        {
            "jupyterlab": {"default_url": "/lab"},
            "vscode": {"title": "VS Code", "default_url": "/vscode/"},
        },
    )
    opts = parse_notebook_options({"editor": "vscode"}, catalog, FLAVORS, LIMITS, "cpu-small")
    assert (opts.editor, opts.default_url) == ("vscode", "/vscode/")


def test_form_to_options_keeps_custom_fields_only_for_custom():
    form = {
        "framework": ["python"],
        "flavor": ["cpu-small"],
        "cpus": ["4"],
        "memory": [""],
        "_xsrf": ["x"],
    }
    assert form_to_options(form) == {"framework": "python", "flavor": "cpu-small"}
    form["flavor"] = ["custom"]
    assert form_to_options(form) == {"framework": "python", "cpus": "4"}


def test_gpu_request_modes():
    """Every container gets exactly its booked devices, in every mode: the IDs, or void."""
    gpus = {"NVIDIA_VISIBLE_DEVICES": "1,3", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
    none = {"NVIDIA_VISIBLE_DEVICES": "void", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
    host, env = gpu_request(["1", "3"], "device_request")
    assert host == {
        "device_requests": [
            {"Driver": "nvidia", "DeviceIDs": ["1", "3"], "Capabilities": [["gpu"]]}
        ]
    }
    assert env == gpus
    assert gpu_request(["1", "3"], "env") == ({}, gpus)
    # a CPU workload is told it has no GPU in both modes: on a host whose default runtime is
    # nvidia, an image's ENV NVIDIA_VISIBLE_DEVICES=all would otherwise give it every GPU
    assert gpu_request([], "env") == ({}, none)
    assert gpu_request([], "device_request") == ({}, none)
    with pytest.raises(ValueError, match="unknown gpu mode"):
        gpu_request([], "cdi")


def test_names_are_docker_safe_and_distinct():
    assert escape_name("a.b") != escape_name("a-b")
    assert notebook_container_name("gl", "ann@x.org", "my nb") == "gl-nb-ann-40x-2eorg--my-20nb"
    assert notebook_container_name("gl", "ann", "") == "gl-nb-ann"


# --- bounds of notebook options (docs/limits.md) -----------------------------------------------


def _storage():
    from gpulab.storage import StorageConfig

    return StorageConfig.from_config(
        {"s3": {"endpoint_url": "http://127.0.0.1:9000"}},
        [{"store": "s3", "bucket": "datasets", "modes": ["ro"]}],
    )


def _vols(n: int, prefix: str = "p") -> list[str]:
    return [f"datasets@s3/{prefix}:/data/v{i:04d}" for i in range(n)]


def max_options() -> dict:
    """Every option at its cap: 32 volumes of 1,024 characters, the longest texts."""
    prefix = "p" * (1024 - len("datasets@s3/:/data/v0000"))
    return {
        "framework": "python",
        "version": "3.11",
        "editor": "jupyterlab",
        "cpus": "0.01",
        "memory": "32M",
        "gpus": "0",
        "auto_restart": "false",
        "volumes": _vols(32, prefix),
    }


def parse_nb(raw: dict):
    return parse(raw, storage=_storage(), user="ann")


def refused_nb(raw: dict, field: str, words: str = "") -> str:
    with pytest.raises(OptionsError) as e:
        parse_nb(raw)
    assert e.value.field == field, (e.value.field, str(e.value))
    assert words in str(e.value), str(e.value)
    return str(e.value)


def test_notebook_options_at_every_cap_are_accepted():
    opts = parse_nb(max_options())
    assert len(opts.volumes) == 32
    assert (opts.resources.cpus, opts.resources.memory) == (0.01, 32 * 1024**2)
    # the form's one-spec-per-line text, at the cap too
    assert len(parse_nb(max_options() | {"volumes": "\n".join(_vols(32))}).volumes) == 32


@pytest.mark.parametrize(
    "change, field, words",
    [
        ({"volumes": _vols(33)}, "volumes", "volumes: at most 32 entries (got 33)"),
        ({"volumes": _vols(4000)}, "volumes", "volumes: at most 32 entries (got 4000)"),
        ({"volumes": "\n".join(_vols(33))}, "volumes", "volumes: at most 32 entries (got 33)"),
        ({"volumes": "x" * 40_000}, "volumes", "volumes: at most 32800 characters"),
        ({"volumes": ["datasets@s3/" + "p" * 1020 + ":/d"]}, "volumes", "at most 1024 characters"),
        ({"volumes": [1]}, "volumes", "list of strings"),
        ({"framework": "f" * 129}, "framework", "framework: at most 128 characters (got 129)"),
        ({"version": "v" * 129}, "version", "at most 128 characters"),
        ({"editor": "e" * 129}, "editor", "at most 128 characters"),
        ({"flavor": "f" * 129}, "flavor", "at most 128 characters"),
        ({"image": "i" * 513}, "image", "image: at most 512 characters"),
        ({"cpus": "1" * 33}, "cpus", "cpus: at most 32 characters"),
        ({"memory": "1" * 33}, "memory", "at most 32 characters"),
        ({"auto_restart": "t" * 33}, "auto_restart", "at most 32 characters"),
        ({"notify_webhook": "h" * 2049}, "notify_webhook", "at most 2048 characters"),
        ({"notify_email": "e" * 255}, "notify_email", "at most 254 characters"),
        ({"notify_on": "d" * 129}, "notify_on", "at most 128 characters"),
        ({"x" * 100_000: 1}, "x" * 64 + "...", "unknown option 'xxxx"),
        ({"privileged": True, **{f"f{i}": 1 for i in range(50_000)}}, "privileged", "unknown"),
    ],
)
def test_notebook_option_caps(change, field, words):
    msg = refused_nb(max_options() | change, field, words)
    assert len(msg) < 400, msg


@pytest.mark.parametrize(
    "change, field, words",
    [
        ({"cpus": "nan"}, "cpus", "must be a number"),
        ({"cpus": "NaN"}, "cpus", "must be a number"),
        ({"cpus": "inf"}, "cpus", "must be a number"),
        ({"cpus": "-Infinity"}, "cpus", "must be a number"),
        ({"cpus": "1_0"}, "cpus", "must be a number"),
        ({"cpus": "0.5\n1"}, "cpus", "must be a number"),
        ({"cpus": float("nan")}, "cpus", "finite"),
        ({"cpus": float("inf")}, "cpus", "finite"),
        ({"cpus": "1e-6"}, "cpus", "at least 0.01"),
        ({"cpus": 1e-6}, "cpus", "at least 0.01"),
        ({"cpus": 0}, "cpus", "at least 0.01"),
        ({"cpus": "1e400"}, "cpus", "finite"),
        ({"cpus": 10**400}, "cpus", "at most 1024"),
        ({"cpus": False}, "cpus", "must be a number"),
        ({"memory": "nan"}, "memory", "512M or 4G"),
        ({"memory": float("nan")}, "memory", "512M or 4G"),
        ({"memory": float("inf")}, "memory", "512M or 4G"),
        ({"memory": "1M"}, "memory", "at least 32M"),
        ({"memory": 1.5}, "memory", "at least 32M"),
        ({"memory": 10**30}, "memory", "at most 1P"),
        ({"gpus": "nan"}, "gpus", "must be a number"),
        ({"gpus": float("inf")}, "gpus", "finite"),
        ({"gpus": "1e400"}, "gpus", "finite"),
        ({"gpus": 10**400}, "gpus", "at most 1024"),
        ({"gpus": "1.5"}, "gpus", "whole number"),
        ({"gpus": -1}, "gpus", "cannot be negative"),
    ],
)
def test_notebook_numbers_are_finite_and_in_range(change, field, words):
    refused_nb({"memory": "1G", "cpus": 1} | change, field, words)


def test_notebook_options_validate_in_milliseconds_at_most(capsys):
    """The hub validates user_options on its event loop: the largest valid options and ones
    far over the caps (4,000 volumes took seconds of quadratic mount checks) each take well
    under 50 ms (measured: well under 1 ms)."""
    import statistics
    import time

    storage = _storage()
    cases = {
        "every cap at its limit": (max_options(), None),
        "4000 volumes": (max_options() | {"volumes": _vols(4000)}, "at most 32 entries"),
        "4000 volume lines": (
            max_options() | {"volumes": "\n".join(_vols(4000))},
            "at most 32800 characters",
        ),
        "100000 unknown options": ({f"f{i}": 1 for i in range(100_000)}, "unknown option"),
    }
    timings = {}
    for label, (raw, words) in cases.items():
        runs = []
        for _ in range(5):
            start = time.perf_counter()
            try:
                parse(raw, storage=storage, user="ann")
                why = None
            except OptionsError as e:
                why = f"{e.field}: {e}"
            runs.append(time.perf_counter() - start)
        assert (why is None) if words is None else (why is not None and words in why), why
        timings[label] = statistics.median(runs) * 1000
    with capsys.disabled():
        print("\nnotebook options validation, ms:", {k: round(v, 2) for k, v in timings.items()})
    assert max(timings.values()) < 50, timings


def test_container_cpu_quota_is_never_zero():
    """A quota that rounds to 0 means "no CPU limit" to Docker: never sent, even for a stored
    record or an operator's flavor below the 0.01 CPU floor of requests."""
    from gpulab.resources import Resources

    assert container_limits(Resources(cpus=1e-6, memory=2**30)).cpu_quota == 1000
    assert container_limits(Resources(cpus=0.01, memory=2**30)).cpu_quota == 1000
    assert container_limits(Resources(cpus=0.5, memory=2**30)).cpu_quota == 50_000


def test_flavor_below_the_floor_is_refused_at_request_time():
    tiny = {"tiny": Flavor.from_config({"id": "tiny", "cpus": 0.001, "memory": "1G"})}
    with pytest.raises(ResourceError, match="at least 0.01") as e:
        resolve_resources(tiny, LIMITS, "tiny")
    assert e.value.field == "cpus"


def test_bounds_helpers():
    from gpulab.bounds import body_too_large, shown, size_text

    assert size_text(1024**2) == "1 MiB" and size_text(32 * 1024) == "32 KiB"
    assert size_text(1000) == "1000 bytes"
    assert body_too_large(1024**2, 1024**2) is None
    msg = body_too_large(2 * 1024**2, 1024**2)
    assert "2097152 bytes" in msg and "at most 1048576 bytes (1 MiB)" in msg
    assert len(shown("x" * 10**6)) < 80 and len(shown(["x" * 1000] * 1000)) < 400
