"""Look into the containers gpulab made, through the engine (what a test checks)."""

from __future__ import annotations


def sh(docker_client, container: str, command: str) -> tuple[int, str]:
    res = docker_client.containers.get(container).exec_run(["sh", "-c", command], user="1000")
    return res.exit_code, res.output.decode()


def gpus_of(docker_client, job: dict) -> list[str]:
    """The GPUs each worker's container was given (gpu_mode "env")."""
    out = []
    for r in job["workers"]:
        env = docker_client.containers.get(r["container"]).attrs["Config"]["Env"]
        out += [e.split("=", 1)[1] for e in env if e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    return out
