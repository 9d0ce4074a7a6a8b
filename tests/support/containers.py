"""Look into the containers gpulab made, through the engine (what a test checks)."""

from __future__ import annotations

import contextlib
import threading

from docker.errors import NotFound


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


class HelperWatch:
    """Inspects every sync helper of ``hub`` while it lives, as ``docker inspect`` shows it."""

    def __init__(self, docker_client, hub):
        self.api = docker_client.api
        self.filters = {
            "label": [f"org.gpulab.instance={hub.instance}", "org.gpulab.kind=sync-helper"]
        }
        self.seen: dict[str, dict] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop.is_set():
            for c in self.api.containers(all=True, filters=self.filters):
                if c["Id"] not in self.seen:
                    with contextlib.suppress(NotFound):
                        self.seen[c["Id"]] = self.api.inspect_container(c["Id"])
            self.stop.wait(0.05)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)
