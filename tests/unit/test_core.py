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
from gpulab.options import OptionsError, form_to_options, parse_notebook_options
from gpulab.resources import (
    Flavor,
    Limits,
    ResourceError,
    container_limits,
    effective_limits,
    format_memory,
    parse_memory,
    resolve_resources,
)
from gpulab.runtime.objects import escape_name, gpu_request, notebook_container_name
from gpulab.settings import DEFAULT_FLAVORS, DEFAULT_FRAMEWORKS

S = NotebookState
CATALOG = Catalog.from_config(
    DEFAULT_FRAMEWORKS, {"jupyterlab": {"title": "JupyterLab", "default_url": "/lab"}}
)
FLAVORS = {f["id"]: Flavor.from_config(f) for f in DEFAULT_FLAVORS}
LIMITS = Limits(cpus=2, memory=parse_memory("8G"), gpus=1)


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
    hc = container_limits(res, pids_limit=100).host_config()
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
        ({"framework": "jax"}, "framework"),
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
    host, env = gpu_request(["1", "3"], "device_request")
    assert host == {
        "device_requests": [
            {"Driver": "nvidia", "DeviceIDs": ["1", "3"], "Capabilities": [["gpu"]]}
        ]
    }
    assert env == {}
    host, env = gpu_request(["2"], "env")
    assert host == {} and env["NVIDIA_VISIBLE_DEVICES"] == "2"
    assert gpu_request([], "env")[1]["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert gpu_request([], "device_request") == ({}, {})


def test_names_are_docker_safe_and_distinct():
    assert escape_name("a.b") != escape_name("a-b")
    assert notebook_container_name("gl", "ann@x.org", "my nb") == "gl-nb-ann-40x-2eorg--my-20nb"
    assert notebook_container_name("gl", "ann", "") == "gl-nb-ann"
