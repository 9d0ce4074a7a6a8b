"""The notebook spawner on a cluster engine (Docker Swarm): the notebook is a workload of the
runtime interface, not a container of the hub's engine.

A mixin over DockerSpawner that replaces its engine calls (create, start, inspect, stop,
remove, the address the proxy connects to) with :class:`~gpulab.runtime.base.Runtime` calls
when ``GpulabSettings.runtime`` is not ``docker``; on one host it defers to DockerSpawner (and
to :class:`~gpulab.spawner_network.UserNetworkMixin`) unchanged. What gpulab decides stays in
the spawner: the node (from the GPU ledger: where the GPUs are, or by the placement policy for
a CPU notebook), the devices, the limits and the volumes; the engine runs it there.

The notebook joins its user's overlay network; the notebook gateway, a container on the
manager attached to that overlay (:mod:`gpulab.runtime.gateway`), routes its URL path to the
notebook's overlay address, and the hub and its proxy reach it through the gateway. No port of
a notebook is published. Its workspace and volumes are named
volumes of the node that runs it; they are pulled from object storage at the start and pushed
back at the stop by a helper task on that node, so that a notebook stopped on one node and
started on another finds its workspace (the pull mirrors the store: a node's older copy is
brought up to date, files deleted since are deleted there too).
"""

from __future__ import annotations

from dockerspawner import DockerSpawner

from .data.sync import PushRaced, retry_push
from .gpus.inventory import device_id, from_nodes, node_of
from .lifecycle import NotebookState
from .names import L_NETWORK, L_PORT, L_ROUTE
from .runtime.base import Mount, WorkloadSpec
from .spawner_data import SpawnFailed

S = NotebookState


class ClusterMixin(DockerSpawner):
    """Needs ``settings``, ``runtime``, ``ledger``, ``records``, ``notebook_user``, ``data``,
    ``_progress``, ``_fail`` and ``_record`` from the spawner."""

    #: the node the notebook runs on ("" on one host); kept in the spawner's state
    node: str = ""
    #: what _start decided for the workload (resources, volumes, labels), read by create_object
    _cluster_spec: dict | None = None

    @property
    def clustered(self) -> bool:
        return self.settings.runtime != "docker"

    def engine_image(self, image: str) -> str:
        """The name the engine runs ``image`` by (a Swarm's nodes pull it from the registry)."""
        return self.runtime.image_ref(image) if self.clustered else image

    async def refresh_cluster(self) -> None:
        """The ledger's nodes and devices as the cluster reports them now."""
        if self.clustered:
            self.ledger.devices, self.ledger.nodes = from_nodes(await self.runtime.nodes())

    async def choose_node(self, gpu_ids: list[str]) -> str:
        """Where the GPUs are; for a CPU notebook, the node the placement policy picks."""
        if not self.clustered:
            return ""
        if gpu_ids:
            return node_of(gpu_ids[0])
        return await self.runtime.run(self.ledger.node_for_cpu)

    async def join_cluster_network(self) -> None:
        """The user's overlay (the notebook gateway joins it once the notebook runs)."""
        s = self.settings
        self.network_name = await self.runtime.ensure_user_network(s.instance, self.user.name)

    def plan_workload(self, **parts) -> None:
        """Keep what create_object needs: cpus, memory, pids_limit, shm_size, labels, mounts
        (volume -> (target, read_only)), env."""
        self._cluster_spec = parts

    # --- DockerSpawner's engine calls, through the runtime on a cluster -----------------------

    async def pull_image(self, image):
        if self.clustered:
            return  # the registry was asked in _start; each node pulls from it
        return await super().pull_image(image)

    async def get_object(self):
        if not self.clustered:
            return await super().get_object()
        found = await self.runtime.state(self.object_name)
        if found is None:
            self.object_id = ""
            return None
        self.object_id = self.object_name
        return {
            "Id": self.object_name,
            "Config": {"Env": []},  # DockerSpawner reads it when it keeps an old object
            "State": {
                # a task on a lost node is the reconciler's to settle (NODE_LOST): until then
                # the hub keeps the server
                "Running": found.running or found.lost,
                "ExitCode": -1 if found.exit_code is None else found.exit_code,
                "Error": found.error,
                "FinishedAt": "",
            },
        }

    async def create_object(self):
        if not self.clustered:
            return await super().create_object()
        plan = self._cluster_spec or {}
        s = self.settings
        spec = WorkloadSpec(
            name=self.object_name,
            image=self.engine_image(self.image),
            command=[*(self.cmd or ["jupyterhub-singleuser"]), *self.get_args()],
            env={**self.get_env(), **plan.get("env", {})},
            labels={
                **plan.get("labels", {}),
                # what the gateway needs to put the route back (SwarmRuntime.restore_routes)
                L_ROUTE: self.server.base_url,
                L_NETWORK: self.network_name,
                L_PORT: str(self.port),
            },
            user=self.notebook_user,
            cpus=plan.get("cpus", 1.0),
            memory=plan.get("memory", 1024**3),
            pids_limit=plan.get("pids_limit", s.pids_limit),
            shm_size=plan.get("shm_size", 64 * 1024**2),
            gpu_ids=[device_id(g) for g in self.gpu_ids],
            mounts=[
                Mount(volume, target, read_only)
                for volume, (target, read_only) in plan.get("mounts", {}).items()
            ],
            network_owner=self.user.name,
            node=self.node,
            log_max_size=s.container_log_max_size,
            log_max_files=s.container_log_max_files,
            runner=False,
        )
        await self.runtime.create_and_start(spec)
        return {"Id": self.object_name}

    async def start_object(self):
        if not self.clustered:
            return await super().start_object()
        # create_and_start returned once the task runs

    async def get_ip_and_port(self):
        if not self.clustered:
            return await super().get_ip_and_port()
        # through the notebook gateway: the hub's readiness check and the proxy's route alike
        return await self.runtime.reach(
            self.object_name, self.network_name, self.server.base_url, self.port
        )

    async def stop_object(self):
        if not self.clustered:
            return await super().stop_object()
        await self.runtime.stop(self.object_name, 10)

    async def remove_object(self):
        if not self.clustered:
            return await super().remove_object()
        await self.runtime.remove(self.object_name)
        await self.runtime.unreach(self.server.base_url if self.server else "")

    # --- placement, and data left on a node ----------------------------------------------

    async def _push_before_start(self) -> None:
        """A cluster: a notebook whose last push failed keeps that data in its volume on the
        node it ran on. It is pushed from there first (as a push retry), so that the start,
        wherever it is placed, pulls it; if the push still fails, the start is refused and the
        record stays SYNC_FAILED."""
        user, server = self.user.name, self.name
        nb = await self.runtime.run(self.records.get, user, server) or {}
        if nb.get("state") != S.SYNC_FAILED.value or not nb.get("node"):
            return
        self.node = nb["node"]
        self._progress(3, f"Pushing what its last stop left on node {self.node}")
        vols = self.data_volumes(list((nb.get("options") or {}).get("volumes") or []))
        try:
            why = "pushed before a start, which may run on another node"
            ok, message, _ = await retry_push(self.records, self.data, vols, user, server, why)
        except PushRaced:
            msg = "this notebook is busy (a push retry); try again once it has stopped"
            raise SpawnFailed(409, msg) from None
        if not ok:
            msg = f"its last push failed, and fails again from node {self.node}: {message}"
            self._progress(100, f"FAILED: {msg}")
            raise SpawnFailed(409, msg)

    async def _place(self) -> None:
        """On a cluster: the node it runs on (where its GPUs are; for a CPU notebook, by the
        placement policy), recorded with the notebook, since its volumes live there."""
        s = self.settings
        ws = s.storage.workspace
        if ws is None or s.storage.stores[ws.store].kind != "s3":
            msg = (
                "on a Swarm the workspace must live in an S3 store (the admin sets "
                "c.GpulabSettings.workspace_store), so that it follows the notebook between nodes"
            )
            await self._fail(S.ERROR, "CONFIG", msg)
            raise SpawnFailed(503, msg)
        if not self.ledger.nodes:
            msg = "no node of the cluster takes workloads now (all down or drained)"
            await self._fail(S.ERROR, "NO_NODE", msg)
            raise SpawnFailed(503, msg)
        self.node = await self.choose_node(self.gpu_ids)
        await self.runtime.run(self.records.set_node, self.user.name, self.name, self.node)
        self._progress(25, f"Placed on node {self.node}")
