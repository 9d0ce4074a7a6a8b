"""No GPU outside the ledger, on a real engine set up as an NVIDIA GPU host is (a stand-in: a
Docker-in-Docker engine whose default runtime, named nvidia, records what each container is
given, with a stand-in nvidia-container-runtime-hook on its PATH; tests/support/gpu_host.py).

The workloads are what gpulab's domains hand its runtime: a notebook's WorkloadSpec from
notebooks.container.notebook_spec, jobs' (with the job runner) and a sync helper's, all from
an image with ``ENV NVIDIA_VISIBLE_DEVICES=all`` as every CUDA base image has it, run by
gpulab's DockerRuntime (made by make_runtime) in both gpu_modes. Each container is given
exactly the devices it booked: the IDs, or ``void``; a container started without gpulab from
the same image would be given every GPU (``all``). And the start-up check: this engine can
deliver in both modes; this machine's own (runc only) can in neither."""

from __future__ import annotations

import io
import secrets

import pytest
from traitlets.config import Config

from gpulab.names import notebook_container_name
from gpulab.notebooks.container import HubSide, notebook_spec
from gpulab.notebooks.life import policy_of
from gpulab.resources import Resources
from gpulab.runtime import make_runtime
from gpulab.runtime.base import HelperSpec, WorkloadSpec
from gpulab.settings import GpulabSettings

from ..conftest import run_async
from ..support.gpu_host import GpuHost, visible_devices

pytestmark = [pytest.mark.docker]

BASE = "gpulab/debian:bookworm"
CUDA_LIKE = "gpulab-test/cuda-like:1"
HOOK = "/usr/local/bin/nvidia-container-runtime-hook"


def settings(instance: str, mode: str) -> GpulabSettings:
    c = Config()
    c.GpulabSettings.instance = instance
    c.GpulabSettings.gpu_devices = [{"id": str(i)} for i in range(4)]
    c.GpulabSettings.gpu_mode = mode
    c.GpulabSettings.network_isolation = "none"
    return GpulabSettings(config=c)


@pytest.fixture(scope="module")
def gpu_host(docker_client, tmp_path_factory):
    host = GpuHost(
        tmp_path_factory.mktemp("gpuhost"), "gpulab-test-gpuhost-" + secrets.token_hex(3)
    )
    try:
        host.start(docker_client)
        host.load_image(docker_client, BASE)
        dockerfile = f"FROM {BASE}\nENV NVIDIA_VISIBLE_DEVICES=all\n".encode()
        stream = host.client().build(
            fileobj=io.BytesIO(dockerfile), tag=CUDA_LIKE, rm=True, decode=True
        )
        for chunk in stream:  # a failed build says so in the stream, not by raising
            if "error" in chunk:
                raise RuntimeError(f"building {CUDA_LIKE} on the GPU host: {chunk['error']}")
        yield host
    finally:
        host.stop()


def notebook(s: GpulabSettings, user: str, gpu_ids: list[str], mark: str) -> WorkloadSpec:
    return notebook_spec(
        policy=policy_of(s),
        hub=HubSide(
            env={"PROOF": mark},
            command=["true"],
            args=[],
            base_url=f"/user/{user}/nb/",
            port=8888,
            user="1000",
        ),
        name=notebook_container_name(s.instance, user, "nb"),
        image=CUDA_LIKE,
        user=user,
        server="nb",
        workload_id=f"{s.instance}/notebook/{user}/nb",
        resources=Resources(cpus=0.5, memory=256 * 1024**2, gpus=len(gpu_ids)),
        gpu_ids=gpu_ids,
        mounts=[],
        network_id="",
        node="",
    )


def job(s: GpulabSettings, job_id: str, gpu_ids: list[str], mark: str) -> WorkloadSpec:
    return WorkloadSpec(
        name=f"{s.instance}-job-{job_id}",
        image=CUDA_LIKE,
        command=["true"],
        env={"PROOF": mark, "GPULAB_JOB_ID": job_id},
        labels={"org.gpulab.instance": s.instance, "org.gpulab.kind": "job"},
        memory=256 * 1024**2,
        gpu_ids=gpu_ids,
        runner=True,  # under gpulab's job runner, as every job
    )


def given_by_mark(host: GpuHost) -> dict[str, dict]:
    """What each container was given, by its PROOF mark."""
    out = {}
    for path in host.records_dir.glob("runtime-*.json"):
        got = host.given(path.stem.removeprefix("runtime-"))
        marks = [e.split("=", 1)[1] for e in got["env"] if e.startswith("PROOF=")]
        if marks:
            out[marks[0]] = got
    return out


@pytest.mark.parametrize("mode", ["env", "device_request"])
def test_every_container_gets_exactly_its_booked_gpus(gpu_host, mode):
    s = settings("tgh" + secrets.token_hex(3), mode)
    runtime = make_runtime(s, gpu_host.client())

    async def run_all():
        assert await runtime.gpu_delivery_refusal() is None  # an NVIDIA host: it can deliver
        await runtime.create_and_start(notebook(s, "cpu-user", [], f"{mode}:cpu-notebook"))
        await runtime.create_and_start(notebook(s, "gpu-user", ["1"], f"{mode}:gpu-notebook"))
        await runtime.create_and_start(job(s, "c1", [], f"{mode}:cpu-job"))
        await runtime.create_and_start(job(s, "g1", ["0", "2"], f"{mode}:gpu-job"))
        helper = HelperSpec(image=CUDA_LIKE, command=["true"], env={"PROOF": f"{mode}:helper"})
        result = await runtime.run_helper(helper, lambda line: None)
        assert result.exit_code == 0, result

    run_async(run_all())
    given = {
        k.split(":", 1)[1]: v for k, v in given_by_mark(gpu_host).items() if k.startswith(mode)
    }
    assert set(given) == {"cpu-notebook", "gpu-notebook", "cpu-job", "gpu-job", "helper"}

    booked = {"cpu-notebook": "void", "gpu-notebook": "1", "cpu-job": "void", "gpu-job": "0,2"}
    booked["helper"] = "void"
    for name, devices in booked.items():
        # the image's "all" is gone: every value the runtime and the hook read is the booking
        assert set(visible_devices(given[name]["env"])) == {devices}, (name, given[name]["env"])
        with_gpus = devices != "void"
        if mode == "device_request" and with_gpus:
            # Docker's nvidia driver called the toolkit's hook, which read the same devices
            assert HOOK in given[name]["prestart"], name
            assert set(visible_devices(given[name]["hook_env"])) == {devices}, name
        else:
            # no device request: the NVIDIA runtime alone decides, from the environment
            # (Docker's own prestart hook, libnetwork-setkey, is there in every container)
            assert HOOK not in given[name]["prestart"] and given[name]["hook_env"] is None, name


def test_without_gpulab_the_same_image_would_get_every_gpu(gpu_host):
    """The control: what the recording runtime sees of a container that nobody told."""
    client = gpu_host.client()
    c = client.create_container(CUDA_LIKE, ["true"], environment={"PROOF": "control"})
    client.start(c["Id"])
    assert visible_devices(gpu_host.given(c["Id"])["env"]) == ["all"]


@pytest.mark.parametrize("mode", ["env", "device_request"])
def test_an_engine_without_the_nvidia_runtime_is_refused(mode):
    """This machine's own engine has runc only: a gpu_mode with GPUs to hand out is refused,
    saying what to configure (the service stops on it; the hub refuses GPU notebooks)."""
    runtime = make_runtime(settings("tgr" + secrets.token_hex(3), mode))
    refusal = run_async(runtime.gpu_delivery_refusal())
    assert refusal and "nvidia-ctk runtime configure" in refusal
    why = {"env": "the engine's default runtime is 'runc'", "device_request": "no NVIDIA runtime"}
    assert why[mode] in refusal, refusal


REFUSING = """
c.GpulabSettings.check_gpu_runtime = True
c.GpulabSettings.gpu_devices = [{"id": "0"}, {"id": "1"}]
c.GpulabSettings.gpu_mode = "env"
"""


@pytest.mark.hub
def test_gpulab_refuses_to_start_on_an_engine_that_cannot_deliver(hub_with):
    """gpu_mode 'env' with GPUs, on this machine's runc engine: the hub says why at start-up
    (it would refuse GPU notebooks: tests/unit/test_notebook_life.py), the service stops with
    the same reason, and JupyterHub, whose managed service exited at start-up, stops too."""
    log = hub_with(REFUSING, start=False).start_refused(60)
    why = "gpu_mode 'env' hands GPUs out with NVIDIA_VISIBLE_DEVICES"
    assert f"gpulab.service] gpulab cannot hand out this host's GPUs: {why}" in log
    assert "nvidia-ctk runtime configure --runtime=docker --set-as-default" in log
    assert f"GPU notebooks are refused: this engine cannot hand out the GPUs: {why}" in log
    assert "Service gpulab exited with status 2" in log
