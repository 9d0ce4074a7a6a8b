"""CUDA images: what an image's labels say of its build (flavour, the CUDA it needs), and the one
rule that refuses a GPU workload whose image needs a newer CUDA major version than the host's
driver supports (cuda.cuda_refusal; an older minor version runs it by CUDA's minor version
compatibility), as data, then through the two doors that apply it: a notebook's options
(notebooks.form.check_options) and a job's submission (jobs.actions.cuda_too_new)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from traitlets.config import Config

from gpulab.cuda import CUDA_LABEL, FLAVOUR_LABEL, ImageBuild, cuda_refusal
from gpulab.gpus.inventory import GpuDevice, Inventory
from gpulab.jobs.actions import cuda_too_new
from gpulab.jobs.spec import JobSpec
from gpulab.notebooks import form
from gpulab.notebooks.form import OptionsRefused, check_options
from gpulab.resources import Resources, parse_memory
from gpulab.runtime.images import ImageCache
from gpulab.settings import GpulabSettings

from ..conftest import run_async
from ..support.fake_runtime import EngineError, FakeRuntime

NEW = "gpulab-test/cuda-new:1"
CPU = "gpulab-test/cpu:1"
NEW_LABELS = {FLAVOUR_LABEL: "cuda", CUDA_LABEL: "12.8"}

REFUSED = (
    "image gpulab-test/cuda-new:1 needs CUDA 12.8, newer than CUDA 11.8, the newest the NVIDIA "
    "driver of this host supports: upgrade the driver to one for CUDA 12.8 or later, or choose "
    "an image built for CUDA 11.8 (or no GPU)"
)


# (needs, gpus, driver's CUDA, refused?)
@pytest.mark.parametrize(
    ("needs", "gpus", "driver", "refused"),
    [
        pytest.param("12.8", 1, "11.8", True, id="a-newer-major-than-the-driver"),
        pytest.param("12.8", 0.5, "11.8", True, id="a-gpu-share-too"),
        pytest.param("13.0", 1, "12.8", True, id="cuda-13-on-a-cuda-12-driver"),
        pytest.param("12.8", 0, "11.8", False, id="no-gpu-asked"),
        pytest.param("12.8", 1, "12.8", False, id="the-drivers-own"),
        pytest.param("12.4", 1, "12.8", False, id="older-than-the-driver"),
        pytest.param("12.9", 1, "12.4", False, id="a-newer-minor-runs-by-minor-compatibility"),
        pytest.param("12.10", 1, "12.9", False, id="minors-compared-as-numbers"),
        pytest.param("", 1, "11.8", False, id="cpu-or-unlabelled-image"),
        pytest.param("12.8", 1, "", False, id="driver-cuda-unknown"),
        pytest.param("twelve", 1, "11.8", False, id="a-label-that-is-no-version"),
    ],
)
def test_the_rule_as_data(needs, gpus, driver, refused):
    why = cuda_refusal(NEW, needs, gpus, driver)
    assert (why is not None) is refused
    if refused:
        assert why.startswith(f"image {NEW} needs CUDA {needs}, newer than CUDA {driver}")


def test_the_refusal_names_the_image_both_versions_and_what_to_do():
    assert cuda_refusal(NEW, "12.8", 1, "11.8") == REFUSED
    assert "the cluster's nodes" in cuda_refusal(NEW, "12.8", 1, "11.8", "the cluster's nodes")


@pytest.mark.parametrize(
    ("labels", "build", "shown"),
    [
        (NEW_LABELS, ImageBuild("cuda", "12.8"), "CUDA 12.8"),
        ({FLAVOUR_LABEL: "cpu"}, ImageBuild("cpu", ""), "CPU"),
        ({FLAVOUR_LABEL: "cuda"}, ImageBuild("cuda", ""), "CUDA"),
        ({}, ImageBuild(), ""),
        (None, ImageBuild(), ""),
    ],
)
def test_an_images_build_from_its_labels(labels, build, shown):
    assert ImageBuild.from_labels(labels) == build
    assert build.describe() == shown


# --- the notebook's door -------------------------------------------------------------------


def settings_with(frameworks) -> GpulabSettings:
    c = Config()
    c.GpulabSettings.frameworks = frameworks
    c.GpulabSettings.gpu_devices = [{"id": "0"}]
    return GpulabSettings(config=c)


SETTINGS = [
    {"id": "new", "title": "New", "versions": [{"id": "1", "image": NEW}]},
    {"id": "cpu", "title": "Cpu", "versions": [{"id": "1", "image": CPU}]},
]


def runtime(driver_cuda: str = "11.8") -> FakeRuntime:
    inventory = Inventory((GpuDevice("0"),), "nvml", "520.61.05", driver_cuda)
    rt = FakeRuntime(gpus=("0",), images={NEW, CPU}, inventory=inventory)
    rt.image_label_sets = {NEW: NEW_LABELS, CPU: {FLAVOUR_LABEL: "cpu"}}
    return rt


LEDGER = SimpleNamespace(clustered=False, devices=("0",))


def check(rt, options):
    return run_async(check_options(settings_with(SETTINGS), rt, LEDGER, "ann", [], options))


def test_a_gpu_notebook_on_a_too_new_image_is_refused_on_its_version():
    with pytest.raises(OptionsRefused) as e:
        check(runtime(), {"framework": "new", "gpus": "1", "cpus": "1", "memory": "1G"})
    assert str(e.value) == f"version: {REFUSED}"


def test_the_same_notebook_without_gpu_a_cpu_image_or_a_new_driver_starts():
    for rt, options in (
        (runtime(), {"framework": "new", "gpus": "0", "cpus": "1", "memory": "1G"}),
        (runtime(), {"framework": "cpu", "gpus": "1", "cpus": "1", "memory": "1G"}),
        (runtime("12.8"), {"framework": "new", "gpus": "1", "cpus": "1", "memory": "1G"}),
        (runtime(""), {"framework": "new", "gpus": "1", "cpus": "1", "memory": "1G"}),
    ):
        assert check(rt, options).image in (NEW, CPU)


def test_the_spawn_form_shows_each_versions_flavour_and_the_drivers_cuda():
    rt = runtime()
    ledger = SimpleNamespace(
        clustered=False,
        devices=("0",),
        free_count=lambda: 1,
        shared_free=lambda: {},
        free_by_model=lambda: [],
        known_pools=lambda: [],
    )
    page = run_async(form.render_form(settings_with(SETTINGS), rt, ledger, "ann", []))
    assert 'data-framework="new" selected data-cuda="12.8">New 1 · CUDA 12.8</option>' in page
    assert 'data-framework="cpu" >Cpu 1 · CPU</option>' in page
    assert "(their driver supports CUDA 11.8)" in page
    assert 'name="image"' not in page  # no registry allowed: the catalog only
    s = settings_with(SETTINGS)
    s.image_registries = ["ghcr.io/acme/*"]
    page = run_async(form.render_form(s, rt, ledger, "ann", []))
    assert 'name="image" id="gpulab-image"' in page and "<code>ghcr.io/acme/*</code>" in page
    assert 'name="image_pull_secret"' in page


def test_the_spawn_form_keeps_the_models_when_the_ledger_cannot_be_read():
    def unreadable():
        raise RuntimeError("database is locked")

    ledger = SimpleNamespace(
        clustered=False,
        devices=(GpuDevice("0", model="A100"), GpuDevice("1", model="A100")),
        free_count=unreadable,
        shared_free=unreadable,
        free_by_model=unreadable,
        known_pools=lambda: [],
    )
    page = run_async(form.render_form(settings_with(SETTINGS), runtime(), ledger, "ann", []))
    assert '<option value="A100">A100 (? of 2 free now)</option>' in page
    assert "(another is refused)" in page


# --- the job's door ------------------------------------------------------------------------


def job(image: str, gpus: float) -> JobSpec:
    return JobSpec(
        name=None,
        image=image,
        command=("true",),
        resources=Resources(1.0, parse_memory("1G"), gpus),
    )


def test_a_gpu_job_on_a_too_new_image_is_refused_and_a_cpu_job_is_not():
    sup = SimpleNamespace(runtime=runtime())
    assert run_async(cuda_too_new(sup, job(NEW, 1))) == REFUSED
    assert run_async(cuda_too_new(sup, job(NEW, 0))) is None
    assert run_async(cuda_too_new(sup, job(CPU, 1))) is None
    # the engine is not even asked when there is nothing to compare with
    rt = runtime("")
    assert run_async(cuda_too_new(SimpleNamespace(runtime=rt), job(NEW, 1))) is None
    assert not [c for c in rt.calls if c.method == "image_labels"]


def test_an_engine_that_cannot_tell_refuses_nothing():
    rt = runtime()
    rt.images = {CPU}  # the image is missing: the job is queued as before (IMAGE_MISSING later)
    assert run_async(cuda_too_new(SimpleNamespace(runtime=rt), job(NEW, 1))) is None
    rt = runtime()

    async def broken(image):
        raise EngineError("engine down", status=None)

    rt.image_labels = broken
    assert run_async(cuda_too_new(SimpleNamespace(runtime=rt), job(NEW, 1))) is None
    rt.inventory = None  # a cluster: its nodes' drivers are not read here
    assert run_async(cuda_too_new(SimpleNamespace(runtime=rt), job(NEW, 1))) is None


def test_the_image_cache_keeps_what_it_read():
    rt, cache = runtime(), ImageCache(30.0)
    got = run_async(cache.builds(rt, [NEW, CPU, "gone:1"], lambda i: i))
    assert got == {NEW: ImageBuild("cuda", "12.8"), CPU: ImageBuild("cpu"), "gone:1": ImageBuild()}
    calls = len(rt.calls)
    again = run_async(cache.builds(rt, [NEW, CPU], lambda i: i))
    assert again == {NEW: got[NEW], CPU: got[CPU]} and len(rt.calls) == calls


def test_the_drivers_cuda_is_the_runtimes_inventorys():
    assert runtime("11.8").driver_cuda == "11.8"
    assert runtime("").driver_cuda == ""  # NVML did not say
    rt = runtime()
    rt.inventory = None  # a cluster: its nodes' drivers are not read here
    assert rt.driver_cuda == ""


def test_a_runtime_keeps_one_image_cache_that_the_form_the_options_and_the_pages_share():
    def asked(rt, call):
        return sorted(c.args[0] for c in rt.calls if c.method == call)

    rt, each = runtime(), sorted([NEW, CPU, "gone:1"])
    builds = run_async(rt.image_builds([NEW, CPU, "gone:1"]))
    assert builds == {
        NEW: ImageBuild("cuda", "12.8"),
        CPU: ImageBuild("cpu"),
        "gone:1": ImageBuild(),
    }
    assert run_async(rt.missing_images([NEW, CPU, "gone:1"])) == ["gone:1"]
    assert asked(rt, "image_labels") == each
    # the notebook options' CUDA check and a second reader find what was read: not asked again
    with pytest.raises(OptionsRefused):
        check(rt, {"framework": "new", "gpus": "1", "cpus": "1", "memory": "1G"})
    assert run_async(rt.image_builds([NEW, CPU])) == {NEW: builds[NEW], CPU: builds[CPU]}
    assert run_async(rt.missing_images([NEW, CPU])) == []
    assert asked(rt, "image_labels") == each
    assert asked(rt, "image_exists") == each
    # a missing image is asked again (an image just built is offered at once)
    assert run_async(rt.missing_images(["gone:1"])) == ["gone:1"]
    assert asked(rt, "image_exists") == sorted([*each, "gone:1"])
    # another runtime (another engine) has a cache of its own
    other = runtime()
    run_async(other.image_builds([NEW]))
    assert asked(other, "image_labels") == [NEW]


def test_the_admin_page_lists_each_image_with_its_build_and_whether_gpus_may_use_it():
    from gpulab.jobs.overview import image_rows

    catalog = settings_with(SETTINGS).catalog
    builds = {NEW: ImageBuild("cuda", "12.8"), CPU: ImageBuild("cpu")}
    driver = "11.8"  # the driver's CUDA (Runtime.driver_cuda)
    assert image_rows(catalog, builds, driver) == [
        {
            "framework": "New",
            "version": "1",
            "image": NEW,
            "flavour": "CUDA 12.8",
            "refused": REFUSED,
            "short": "",
        },
        {
            "framework": "Cpu",
            "version": "1",
            "image": CPU,
            "flavour": "CPU",
            "refused": "",
            "short": "",
        },
    ]
    # a driver older in the minor version only: allowed, with what it falls short of
    minor = image_rows(catalog, builds, "12.4")
    assert minor[0]["refused"] == "" and minor[0]["short"].startswith(
        f"{NEW} needs CUDA 12.8 and the driver supports CUDA 12.4: minor version compatibility"
    )
    assert [r["refused"] for r in image_rows(catalog, builds, "")] == ["", ""]  # unknown
    assert [r["flavour"] for r in image_rows(catalog, {}, driver)] == ["", ""]
