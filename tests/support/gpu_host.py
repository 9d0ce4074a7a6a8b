"""A stand-in NVIDIA GPU host on a machine without a GPU: a real Docker engine in a container
(the swarm lab's worker image, gpulab-lab/dind) set up as a GPU server's engine is, and made to
record what every container it starts is given.

- Its default runtime is registered as ``nvidia`` (``--add-runtime nvidia=...
  --default-runtime nvidia``, as the NVIDIA Container Toolkit registers its own), and is
  ``gpu_host_bin/recording-runc``: a wrapper around runc that records each container's OCI
  environment (where the real runtime reads NVIDIA_VISIBLE_DEVICES) and prestart hooks.
- ``gpu_host_bin/nvidia-container-runtime-hook`` is on dockerd's PATH, so Docker registers its
  nvidia device driver (DeviceRequests with driver nvidia start, and call the hook) and the
  hook records the environment it is called with.

Records land in a host directory, one JSON file per container and per hook call, by container
ID. Nothing is handed over: the point is what each container would have been given.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
from pathlib import Path

import docker

REPO = Path(__file__).resolve().parents[2]
BIN = Path(__file__).with_name("gpu_host_bin")
#: where runtime/objects.py's job runner lies on the hub's host: the same path in the engine
RUNNER_DIR = REPO / "src" / "gpulab" / "runtime"


def dind_image() -> str:
    """The swarm lab's worker image, built or found up to date by scripts/swarm-lab.sh."""
    out = subprocess.run(
        [str(REPO / "scripts" / "swarm-lab.sh"), "image"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"scripts/swarm-lab.sh image failed:\n{out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]


def _run_flags(image: str) -> list[str]:
    """``docker run`` flags: --privileged where this engine can give it; else every capability
    it has, unconfined (as scripts/swarm-lab.sh runs its workers: the image's entry point
    makes /sys and the cgroup mounts writable; ``systempaths=unconfined`` is the CLI's)."""
    probe = ["docker", "run", "--rm", "--privileged", "--network", "none"]
    if subprocess.run([*probe, "--entrypoint", "true", image], capture_output=True).returncode == 0:
        return ["--privileged"]
    return [
        "--cap-add=ALL",
        "--cap-drop=SYS_RESOURCE",
        "--security-opt=seccomp=unconfined",
        "--security-opt=apparmor=unconfined",
        "--security-opt=systempaths=unconfined",
        "--device-cgroup-rule=a *:* rwm",
    ]


#: the engine's default address pools, as an operator configures a GPU server's
#: (``default-address-pools``: 256 networks of /24, one per user; docs/scale-out.md)
ADDRESS_POOL = "base=10.219.0.0/16,size=24"


class GpuHost:
    def __init__(self, workdir: Path, name: str, address_pool: str = ADDRESS_POOL):
        self.workdir = workdir
        self.name = name
        #: dockerd's --default-address-pool (a tiny one makes its pools run out)
        self.address_pool = address_pool
        self.records_dir = workdir / "records"
        self.run_dir = workdir / "run"
        self.container = None

    @property
    def socket(self) -> str:
        return f"unix://{self.run_dir / 'docker.sock'}"

    def client(self) -> docker.APIClient:
        return docker.APIClient(base_url=self.socket, version="auto", timeout=120)

    def start(self, host: docker.DockerClient, timeout: float = 60) -> GpuHost:
        image = dind_image()
        for d in (self.records_dir, self.run_dir):
            d.mkdir(parents=True, exist_ok=True)
        bins = self.workdir / "bin"
        shutil.copytree(BIN, bins, dirs_exist_ok=True)
        for f in bins.iterdir():
            f.chmod(0o755)
        mounts = {
            self.records_dir: "/records",
            self.run_dir: "/run/gpuhost",
            bins / "recording-runc": "/usr/local/bin/recording-runc:ro",
            bins
            / "nvidia-container-runtime-hook": "/usr/local/bin/nvidia-container-runtime-hook:ro",
            RUNNER_DIR: f"{RUNNER_DIR}:ro",
        }
        run = subprocess.run(
            ["docker", "run", "-d", "--name", self.name, "--label", "org.gpulab.test=gpu-host"]
            + [f"--volume={src}:{dst}" for src, dst in mounts.items()]
            + _run_flags(image)
            + [image, "--host", "unix:///run/gpuhost/docker.sock"]
            + ["--add-runtime", "nvidia=/usr/local/bin/recording-runc"]
            + ["--default-runtime", "nvidia", "--bip", "10.218.0.1/24"]
            + ["--default-address-pool", self.address_pool],
            capture_output=True,
            text=True,
            check=False,
        )
        if run.returncode != 0:
            raise RuntimeError(f"the stand-in GPU host did not start:\n{run.stderr}")
        self.container = host.containers.get(run.stdout.strip())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                self.client().ping()
                return self
            self.container.reload()
            if self.container.status != "running":
                break
            time.sleep(0.3)
        logs = self.container.logs(tail=30).decode(errors="replace")
        raise RuntimeError(f"the stand-in GPU host's dockerd did not answer:\n{logs}")

    def load_image(self, host: docker.DockerClient, image: str) -> None:
        """Copy ``image`` from the host's engine into this one (no registry is reachable)."""
        # saved under the name asked for: Image.save(named=True) names it by its first tag,
        # which is the swarm lab registry's (127.0.0.1:PORT/...) while the lab runs beside.
        # The answer is a stream that ends when the engine has loaded the image: read to its
        # end (a build started before that pulled the base from Docker Hub, and failed)
        for chunk in self.client().load_image(host.api.get_image(image)):
            if "error" in chunk:
                raise RuntimeError(f"loading {image} into the GPU host: {chunk['error']}")
        self.client().inspect_image(image)  # there now, or NotFound says so

    def given(self, container_id: str) -> dict:
        """What the container was given: ``env`` (its OCI environment, as the NVIDIA runtime
        reads it), ``prestart`` (its hooks) and ``hook_env`` (the environment the nvidia hook
        was called with; None: it was not called)."""
        runtime = json.loads((self.records_dir / f"runtime-{container_id}.json").read_text())
        hook = self.records_dir / f"hook-{container_id}.json"
        return {
            "env": runtime["env"],
            "prestart": runtime["prestart"],
            "hook_env": json.loads(hook.read_text())["env"] if hook.exists() else None,
        }

    def stop(self) -> None:
        if self.container is not None:
            with contextlib.suppress(docker.errors.NotFound):
                self.container.remove(force=True, v=True)
            self.container = None


def visible_devices(env: list[str]) -> list[str]:
    """Every NVIDIA_VISIBLE_DEVICES value in an OCI environment (the last one counts)."""
    return [e.split("=", 1)[1] for e in env if e.startswith("NVIDIA_VISIBLE_DEVICES=")]
