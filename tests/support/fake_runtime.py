"""An in-memory :class:`~gpulab.runtime.base.Runtime` for unit tests: no engine, no threads.

It keeps workloads, volumes, networks and images in dicts, records every call in
:attr:`FakeRuntime.calls`, and lets a test script what the engine does next::

    rt = FakeRuntime(images={"gpulab/python:3.11"})
    rt.fail("create_and_start", name="job-1")      # the engine refuses that workload once
    rt.exits("job-2", 3)                           # job-2 ends with exit code 3 (now or on start)
    rt.vanish("job-3")                             # job-3 disappears behind gpulab's back
    rt.forget_image("gpulab/python:3.11")          # the image is gone

A cluster (what :class:`~gpulab.runtime.swarm.SwarmRuntime` reports through the interface)::

    rt = FakeRuntime.cluster({"a": ("0", "1"), "b": ("0",)})   # nodes and their GPU IDs
    rt.node_down("b")                              # b's workloads are lost (no exit code)
    rt.drain("a"); rt.node_up("b")                 # a takes nothing new; b is back

Each node of a cluster answers for itself, as a node's own engine does for a Swarm: its
images (``node_images``: what a pull put there), its volumes; a node that is down raises
:class:`~gpulab.runtime.base.EngineUnreachable` for them, one not in the cluster has none.

and then reads back what happened: ``rt.names("create_and_start")``, ``rt.workloads[name]``,
``await rt.state(name)``.

Keep it simple and additive: tests of the notebook life and of the job supervisor build on it.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpulab.gpus.inventory import GpuDevice, Inventory
from gpulab.gpus.usage import DeviceUsage
from gpulab.names import L_INSTANCE, L_KIND, L_USER
from gpulab.runtime.base import (
    EngineError,
    EngineNetwork,
    EngineSurvey,
    EngineUnreachable,
    ExecSession,
    HelperResult,
    HelperSpec,
    ImagePullFailed,
    Labelled,
    LogStream,
    Node,
    PullProgress,
    Runtime,
    WorkloadGone,
    WorkloadSpec,
    WorkloadState,
)
from gpulab.runtime.exits import ExitEvents

__all__ = ["Call", "EngineError", "FakeExecSession", "FakeRuntime", "FakeWorkload"]

#: exit codes of a process ended by SIGTERM / SIGKILL, as an engine reports them
SIGTERM_EXIT = 143
SIGKILL_EXIT = 137


@dataclass(frozen=True)
class Call:
    """One call of a runtime method: its name and arguments (``name`` as given)."""

    method: str
    args: tuple
    kwargs: dict

    @property
    def target(self) -> Any:
        """The first argument (a workload's name for most methods, the spec for a create)."""
        if not self.args:
            return None
        first = self.args[0]
        return first.name if isinstance(first, WorkloadSpec) else first


@dataclass
class FakeWorkload:
    """A workload the fake engine holds: its spec and its present state."""

    spec: WorkloadSpec
    running: bool = True
    exit_code: int | None = None
    oom: bool = False
    started_at: float | None = None
    error: str = ""
    lost: bool = False
    #: how often it was started (create, start_again) and restarted in place
    starts: int = 1
    restarts: int = 0
    logs: bytes = b""
    cpu_ns: int = 0
    #: keeps running on SIGTERM (a stop then kills it, a terminate leaves it running)
    ignores_term: bool = False
    #: the address it has on each network it joined (network ID -> IP)
    addresses: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def labels(self) -> dict[str, str]:
        return self.spec.labels

    def end(self, code: int | None, oom: bool = False, error: str = "", lost: bool = False):
        self.running = False
        self.exit_code = code
        self.oom = oom
        self.error = error
        self.lost = lost

    def state(self) -> WorkloadState:
        return WorkloadState(
            running=self.running,
            exit_code=None if self.running else self.exit_code,
            oom=self.oom,
            started_at=self.started_at,
            node=self.spec.node,
            error=self.error,
            lost=self.lost,
        )


@dataclass
class _Failure:
    method: str
    error: BaseException
    name: Any
    times: int


class FakeExecSession(ExecSession):
    """A terminal that echoes what is written to it; :meth:`finish` ends it with a code."""

    def __init__(self, output: bytes = b""):
        self._out: queue.Queue[bytes] = queue.Queue()
        if output:
            self._out.put(output)
        self.written: list[bytes] = []
        self.sizes: list[tuple[int, int]] = []
        self.closed = False
        self._code: int | None = None

    def read(self) -> bytes:
        if self.closed and self._out.empty():
            return b""
        return self._out.get()

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        self.written.append(data)
        self._out.put(data)

    def resize(self, cols: int, rows: int) -> None:
        self.sizes.append((cols, rows))

    def finish(self, code: int = 0) -> None:
        """The shell exits with ``code``."""
        self._code = code
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._out.put(b"")

    def exit_code(self) -> int | None:
        return self._code


class FakeRuntime(Runtime):
    """The whole :class:`Runtime` interface in memory. See the module's docstring."""

    def __init__(
        self,
        nodes: Iterable[Node] | None = None,
        images: Iterable[str] | None = None,
        gpus: tuple[str, ...] = (),
        registry: str = "",
        clock: Callable[[], float] = time.time,
        inventory: Inventory | None = None,
        clustered: bool = False,
    ):
        super().__init__(workers=4, registry=registry)
        #: one engine's GPUs, as make_runtime gives a DockerRuntime this host's
        self.devices = tuple(GpuDevice(g) for g in gpus)
        #: how they were found (NVML's driver and CUDA versions), as make_runtime hands a
        #: DockerRuntime its inventory; None: nothing read (a cluster's nodes say their own)
        self.inventory = inventory
        if clustered:  # a Swarm's manager: GPUs from nodes(), images pulled from the registry
            self.clustered = True
            self.images_at = "in the registry"
        self.node_list: list[Node] = (
            list(nodes)
            if nodes is not None
            else [Node(id="", hostname="", ready=True, active=True, gpus=tuple(gpus))]
        )
        #: the images the engine has (None: it has every image)
        self.images: set[str] | None = set(images) if images is not None else None
        self.clock = clock
        #: the default command of an image (none here: the engine cannot tell)
        self.image_commands: dict[str, list[str]] = {}
        #: {image: its labels} (image_labels; an image not listed has none)
        self.image_label_sets: dict[str, dict[str, str]] = {}
        #: a registry: {NAME:TAG as the engine names it: (digest, credentials it asks for:
        #: (username, password), or None for an anonymous pull)}
        self.registry_images: dict[str, tuple[str, tuple[str, str] | None]] = {}
        #: bytes each pull reports (one layer)
        self.pull_bytes = 1_000_000
        #: a cluster's nodes' own images: {hostname: what pulls put there}
        self.node_images: dict[str, set[str]] = {}
        self.calls: list[Call] = []
        self.workloads: dict[str, FakeWorkload] = {}
        #: (volume, node) pairs that exist
        self.volumes: set[tuple[str, str]] = set()
        #: network ID -> (instance, owner user or "", job ID or "")
        self.networks: dict[str, tuple[str, str, str]] = {}
        #: helper runs: the specs given, the node each ran on ("" on one engine), and the
        #: results scripted for the next runs
        self.helper_configs: list[HelperSpec] = []
        self.helper_nodes: list[str] = []
        self._helper_results: list[tuple[int, list[str]]] = []
        #: what dead helpers left apart from themselves, per instance (a Swarm's secrets), as
        #: names; remove_helper_leftovers takes them
        self.helper_leftovers: dict[str, list[str]] = {}
        #: exec_run results scripted per workload: (exit code, output, cut)
        self._exec_results: dict[str, list[tuple[int | None, bytes, bool]]] = {}
        self.sessions: list[FakeExecSession] = []
        self._failures: list[_Failure] = []
        #: exits scripted for workloads not started yet: name -> (code, oom)
        self._pending_exits: dict[str, tuple[int, bool]] = {}
        self._ips = itertools.count(2)
        self._lock = threading.Lock()
        #: what gpu_delivery_refusal answers (a test scripts an engine that cannot deliver)
        self.refusal: str | None = None
        #: what gpu_usage answers: node ("" on one engine) -> its devices' readings, or a
        #: function that gives it (a test's meter; it may raise)
        self.gpu_readings: Mapping[str, Sequence[DeviceUsage]] | Callable[[], Mapping] = {}

    @classmethod
    def cluster(cls, nodes: Mapping[str, Sequence[str]], **kw) -> FakeRuntime:
        """A cluster as a Swarm's manager reports it: ``{hostname: its GPU IDs}``, every node
        ready and active. Its GPUs come from :meth:`nodes` (none in ``devices``); a workload
        runs on the node its spec names; a node that goes down or is drained loses what runs
        there (see :meth:`node_down`); each node's images and volumes are its own (as its
        own engine answers for them), a node that is down answers nothing."""
        return cls(
            nodes=[
                Node(id=f"id-{h}", hostname=h, ready=True, active=True, gpus=tuple(g))
                for h, g in nodes.items()
            ],
            clustered=True,
            **kw,
        )

    # --- what a test scripts ---------------------------------------------------------------

    def fail(
        self,
        method: str,
        error: BaseException | str | None = None,
        name: Any = None,
        times: int = 1,
    ) -> None:
        """The next ``times`` calls of ``method`` (for workload/volume ``name`` only, when
        given) raise ``error`` (default: an engine error) instead of doing anything.
        ``times=0``: every call from now on."""
        if not callable(getattr(Runtime, method, None)):
            raise AttributeError(f"Runtime has no method {method!r}")
        if error is None or isinstance(error, str):
            error = EngineError(error or f"fake engine error in {method}")
        self._failures.append(_Failure(method, error, name, times))

    def unfail(self, method: str) -> None:
        """Forget the failures scripted for ``method``: its calls work again."""
        with self._lock:
            self._failures = [f for f in self._failures if f.method != method]

    def exits(self, name: str, code: int, oom: bool = False) -> None:
        """The workload ends with ``code`` now if it runs; else as soon as it is started."""
        w = self.workloads.get(name)
        if w is not None and w.running:
            w.end(code, oom=oom)
            self._announce(name)
        else:
            self._pending_exits[name] = (code, oom)

    def lose(self, name: str, error: str = "node down") -> None:
        """The workload's node is lost: it ends without an exit code."""
        self.workloads[name].end(None, error=error, lost=True)
        self._announce(name)

    # --- exits announced as they happen, as a DockerRuntime's event stream does ---------------

    #: True: wait_exit wakes at once at an exit (runtime/exits.py); False (the default): it
    #: only waits, as a runtime that hears of nothing (its callers look at every pass)
    announcing = False
    _exit_events: ExitEvents | None = None

    @property
    def announces_exits(self) -> bool:
        return self.announcing

    async def wait_exit(self, names: Sequence[str], timeout: float, since: float) -> bool:
        if not self.announcing:
            return await super().wait_exit(names, timeout, since)
        if self._exit_events is None:
            self._exit_events = ExitEvents(client=None)  # announced below, not followed
        self._exit_events._loop = asyncio.get_running_loop()
        return await self._exit_events.wait(names, timeout, since)

    def _announce(self, name: str) -> None:
        events = self._exit_events
        if self.announcing and events is not None and events._loop is not None:
            events._loop.call_soon_threadsafe(events.announce, name, time.monotonic())

    def node_down(self, hostname: str) -> None:
        """The node stops answering (Swarm: "down"): what ran there ends without an exit code,
        lost; the manager no longer counts it running. Anything later pinned there is lost
        too (its task cannot start); a helper there does not run."""
        self._set_node(hostname, ready=False)

    def drain(self, hostname: str) -> None:
        """The node is drained: it takes nothing new, and what ran there is lost."""
        self._set_node(hostname, active=False)

    def node_up(self, hostname: str) -> None:
        """The node is ready and active again. What it lost stays ended (the manager shut
        those tasks down): without an exit code, no longer reported lost."""
        self._set_node(hostname, ready=True, active=True)
        for w in self.workloads.values():
            if w.spec.node == hostname and w.lost:
                w.lost, w.error = False, "task shutdown"

    def _set_node(self, hostname: str, **change) -> None:
        for i, n in enumerate(self.node_list):
            if n.hostname == hostname:
                self.node_list[i] = replace(n, **change)
                break
        else:
            raise KeyError(f"no node {hostname!r} in the fake cluster")
        why = self._node_trouble(hostname)
        for w in self.workloads.values():
            if why and w.spec.node == hostname and w.running:
                w.end(None, error=why, lost=True)

    def _node_trouble(self, hostname: str) -> str:
        """Why a cluster's node loses its work ("" when it is fine; always "" on one engine),
        in runtime.swarm_specs.task_state's words."""
        if not self.clustered:
            return ""
        node = next((n for n in self.node_list if n.hostname == hostname), None)
        if node is None:
            return "not in the cluster"
        if not node.ready:
            return f"node {hostname} is down"
        if not node.active:
            return f"node {hostname} is drain"
        return ""

    def vanish(self, name: str) -> None:
        """The workload disappears (removed behind gpulab's back)."""
        self.workloads.pop(name, None)
        self._announce(name)

    def forget_image(self, image: str) -> None:
        """The engine no longer has ``image`` (create_and_start then fails)."""
        if self.images is None:
            self.images = set()
        self.images.discard(image)

    def add_image(self, image: str) -> None:
        if self.images is not None:
            self.images.add(image)

    def add_volume(self, name: str, node: str = "") -> None:
        self.volumes.add((name, node))

    def script_helper(self, exit_code: int = 0, lines: Iterable[str] = ()) -> None:
        """The next helper run (the sync) prints ``lines`` and ends with ``exit_code``."""
        self._helper_results.append((exit_code, list(lines)))

    def script_exec(
        self, name: str, exit_code: int | None = 0, output: bytes = b"", cut: bool = False
    ) -> None:
        """The next exec_run in ``name`` returns this (exit code None: it timed out)."""
        self._exec_results.setdefault(name, []).append((exit_code, output, cut))

    # --- what a test reads back ---------------------------------------------------------------

    def called(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    def names(self, method: str) -> list[Any]:
        """The targets (workload names, mostly) of every call of ``method``, in order."""
        return [c.target for c in self.called(method)]

    def running(self) -> list[str]:
        return [n for n, w in self.workloads.items() if w.running]

    # --- plumbing -------------------------------------------------------------------------------

    def _enter(self, method: str, *args, **kwargs) -> None:
        """Record the call, then raise what a test scripted for it."""
        call = Call(method, args, kwargs)
        with self._lock:
            self.calls.append(call)
            for f in self._failures:
                if f.method == method and (f.name is None or f.name == call.target):
                    if f.times == 1:
                        self._failures.remove(f)
                    elif f.times > 1:
                        f.times -= 1
                    raise f.error

    def _get(self, name: str) -> FakeWorkload:
        w = self.workloads.get(name)
        if w is None:
            raise EngineError(f"No such container: {name}", status=404)
        return w

    def _start(self, w: FakeWorkload) -> None:
        w.running, w.exit_code, w.oom, w.error, w.lost = True, None, False, "", False
        w.started_at = self.clock()
        pending = self._pending_exits.pop(w.name, None)
        why = self._node_trouble(w.spec.node)
        if why:  # pinned to a node that cannot run it (Swarm: its task never starts)
            w.end(None, error=why, lost=True)
            self._announce(w.name)
        elif pending is not None:
            w.end(pending[0], oom=pending[1])
            self._announce(w.name)

    def _network_of(self, spec: WorkloadSpec) -> str:
        instance = spec.labels.get(L_INSTANCE, "")
        if spec.network_job:
            return self._job_network(instance, spec.labels.get(L_USER, ""), spec.network_job)
        if spec.network_owner:
            return self._user_network(instance, spec.network_owner)
        return "bridge"

    def _user_network(self, instance: str, user: str) -> str:
        nid = f"net-{instance}-{user}"
        self.networks.setdefault(nid, (instance, user, ""))
        return nid

    def _job_network(self, instance: str, owner: str, job_id: str) -> str:
        nid = f"jobnet-{instance}-{job_id}"
        self.networks.setdefault(nid, (instance, owner, job_id))
        return nid

    def _in_use(self, network_id: str) -> bool:
        return any(network_id in w.addresses for w in self.workloads.values())

    # --- the cluster --------------------------------------------------------------------------

    async def nodes(self) -> list[Node]:
        self._enter("nodes")
        return list(self.node_list)

    async def gpu_delivery_refusal(self) -> str | None:
        self._enter("gpu_delivery_refusal")
        return self.refusal

    async def gpu_usage(self) -> dict[str, list[DeviceUsage]]:
        self._enter("gpu_usage")
        found = self.gpu_readings() if callable(self.gpu_readings) else self.gpu_readings
        return {node: list(usages) for node, usages in found.items()}

    async def watch_gpus(self, instance: str) -> None:
        self._enter("watch_gpus", instance)

    async def survey(self, images: Sequence[str], instance: str) -> EngineSurvey:
        """A runc-only engine that has the images it has (no labels), and its networks."""
        self._enter("survey", tuple(images), instance)
        return EngineSurvey(
            address="fake://engine",
            version="fake",
            runtimes={"runc": {"path": "runc"}},
            default_runtime="runc",
            networks=tuple(
                EngineNetwork(net_id, ours=owner[0] == instance)
                for net_id, owner in self.networks.items()
            ),
            images={i: ({} if self.images is None or i in self.images else None) for i in images},
        )

    async def image_exists(self, image: str, node: str = "") -> bool:
        self._enter("image_exists", image, node=node)
        if self.clustered and node:  # the node's own engine; one gone is the engine's error
            self._node_is_there(node)
            return image in self.node_images.get(node, set())
        return self.images is None or image in self.images

    def _node_is_there(self, hostname: str) -> None:
        """As a Swarm's image calls on a node: one not in the cluster is an EngineError (the
        workload placed there is placed again), one down EngineUnreachable."""
        if not self._node_answers(hostname):
            raise EngineError(
                f"node {hostname or '(none)'} is not in the cluster: it was lost after the "
                "workload was placed there"
            )

    def _node_answers(self, hostname: str) -> bool:
        """A cluster's node's own engine: False when the node is not in the cluster (it has
        nothing); EngineUnreachable when it is down."""
        node = next((n for n in self.node_list if n.hostname == hostname), None)
        if node is None or not hostname:
            return False
        if not node.ready:
            raise EngineUnreachable(f"node {hostname} is down: its engine is not asked")
        return True

    def _registry_answer(self, image: str, auth: dict[str, str] | None) -> str:
        name, _, pinned = image.partition("@")
        for ref, (digest, creds) in self.registry_images.items():
            if ref == name or (pinned and ref.split(":")[0] == name.split(":")[0]):
                if pinned and pinned != digest:
                    continue
                given = (auth["username"], auth["password"]) if auth else None
                if creds is not None and given != creds:
                    raise ImagePullFailed(
                        "unauthorized: authentication required", status=500, detail=""
                    )
                return digest
        raise ImagePullFailed(f"manifest unknown: {name} not found", status=404)

    async def fetch_image(
        self,
        image: str,
        policy: str,
        auth: dict[str, str] | None,
        on_progress: Callable[[PullProgress], None],
        node: str = "",
        max_bytes: int = 0,
    ) -> str:
        self._enter("fetch_image", image, policy=policy, node=node)
        return await super().fetch_image(image, policy, auth, on_progress, node, max_bytes)

    async def registry_digest(self, image: str, auth: dict[str, str] | None) -> str:
        self._enter("registry_digest", image)
        return self._registry_answer(image, auth)

    async def pull_image(
        self,
        image: str,
        auth: dict[str, str] | None,
        on_progress: Callable[[PullProgress], None],
        node: str = "",
        max_bytes: int = 0,
    ) -> None:
        self._enter("pull_image", image, node=node)
        if self.clustered:
            self._node_is_there(node)
        self._registry_answer(image, auth)
        half = self.pull_bytes // 2
        on_progress(PullProgress(half, self.pull_bytes, 1, "Downloading"))
        if max_bytes and self.pull_bytes > max_bytes:
            raise ImagePullFailed(f"the image's layers weigh more than {max_bytes} (cap)")
        on_progress(PullProgress(self.pull_bytes, self.pull_bytes, 1, "Pull complete"))
        if self.clustered:  # onto that node only
            self.node_images.setdefault(node, set()).add(image)
        else:
            self.add_image(image)

    async def image_command(self, image: str) -> list[str] | None:
        self._enter("image_command", image)
        if self.images is not None and image not in self.images:
            return None
        return list(self.image_commands.get(image) or []) or None

    async def image_labels(self, image: str) -> dict[str, str] | None:
        self._enter("image_labels", image)
        if self.images is not None and image not in self.images:
            return None
        return dict(self.image_label_sets.get(image) or {})

    # --- workloads ----------------------------------------------------------------------------

    async def create_and_start(self, spec: WorkloadSpec) -> None:
        self._enter("create_and_start", spec)
        old = self.workloads.get(spec.name)
        if old is not None and old.running:
            raise EngineError(f"Conflict: the container name {spec.name!r} is in use", status=409)
        pulled_there = spec.image in self.node_images.get(spec.node, set())
        if self.images is not None and spec.image not in self.images and not pulled_there:
            raise EngineError(f"No such image: {spec.image}", status=404)
        w = FakeWorkload(spec=spec)
        network = self._network_of(spec)
        w.addresses[network] = f"10.0.0.{next(self._ips)}"
        for m in spec.mounts:
            self.volumes.add((m.volume, spec.node))
        self.workloads[spec.name] = w
        self._start(w)

    async def state(self, name: str) -> WorkloadState | None:
        self._enter("state", name)
        w = self.workloads.get(name)
        return None if w is None else w.state()

    async def start_again(self, name: str) -> None:
        self._enter("start_again", name)
        w = self._get(name)
        if not w.running:
            w.starts += 1
            self._start(w)

    async def stop(self, name: str, grace: float) -> None:
        self._enter("stop", name, grace)
        w = self.workloads.get(name)
        if w is not None and w.running:
            w.end(SIGKILL_EXIT if w.ignores_term else SIGTERM_EXIT)

    async def terminate(self, name: str, grace: float) -> None:
        self._enter("terminate", name, grace)
        w = self.workloads.get(name)
        if w is not None and w.running and not w.ignores_term:
            w.end(SIGTERM_EXIT)

    async def kill(self, name: str) -> None:
        self._enter("kill", name)
        w = self.workloads.get(name)
        if w is not None and w.running:
            w.end(SIGKILL_EXIT)

    async def remove(self, name: str) -> bool:
        self._enter("remove", name)
        return self.workloads.pop(name, None) is not None

    async def restart_in_place(self, name: str) -> None:
        self._enter("restart_in_place", name)
        w = self._get(name)
        if not w.running:
            raise EngineError(f"Container {name} is not running", status=409)
        w.restarts += 1
        w.started_at = self.clock()

    async def logs(
        self,
        name: str,
        since: float | None = None,
        until: float | None = None,
        tail: int | None = None,
    ) -> bytes:
        self._enter("logs", name, since=since, until=until, tail=tail)
        w = self.workloads.get(name)
        if w is None:
            return b""
        if tail is not None:
            lines = w.logs.splitlines(keepends=True)
            return b"".join(lines[-tail:] if tail else [])
        return w.logs

    def log_stream(
        self, name: str, follow: bool, tail: int | None = None, timestamps: bool = False
    ) -> LogStream:
        self._enter("log_stream", name, follow=follow, tail=tail, timestamps=timestamps)
        w = self.workloads.get(name)
        if w is None:
            raise WorkloadGone(name)
        lines = w.logs.splitlines(keepends=True)
        if tail is not None:
            lines = lines[-tail:] if tail else []
        closed = threading.Event()

        def chunks():
            for line in lines:
                if closed.is_set():
                    return
                yield line

        return LogStream(chunks(), closed.set)

    async def exec_run(
        self, name: str, command: list[str], timeout: float, max_output: int
    ) -> tuple[int | None, bytes, bool]:
        self._enter("exec_run", name, command, timeout=timeout, max_output=max_output)
        w = self.workloads.get(name)
        if w is None or not w.running:
            raise WorkloadGone(name)
        scripted = self._exec_results.get(name)
        code, output, cut = scripted.pop(0) if scripted else (0, b"", False)
        if len(output) > max_output:
            output, cut = output[:max_output], True
        return code, output, cut

    async def exec_session(self, name: str, cols: int = 80, rows: int = 24) -> ExecSession:
        self._enter("exec_session", name, cols=cols, rows=rows)
        w = self.workloads.get(name)
        if w is None or not w.running:
            raise WorkloadGone(name)
        session = FakeExecSession()
        session.resize(cols, rows)
        self.sessions.append(session)
        return session

    async def cpu_time(self, name: str) -> int | None:
        self._enter("cpu_time", name)
        return self._get(name).cpu_ns

    async def labelled(self, instance: str, kind: str) -> list[Labelled]:
        self._enter("labelled", instance, kind)
        return [
            Labelled(
                id="id-" + w.name,
                name=w.name,
                labels=dict(w.labels),
                running=w.running and not self._node_trouble(w.spec.node),
                node=w.spec.node,
            )
            for w in self.workloads.values()
            if w.labels.get(L_INSTANCE) == instance and w.labels.get(L_KIND) == kind
        ]

    async def address(self, name: str, network_id: str) -> str:
        self._enter("address", name, network_id)
        w = self.workloads.get(name)
        if w is None or not w.running or network_id not in w.addresses:
            raise WorkloadGone(f"{name} has no address on network {network_id}")
        return w.addresses[network_id]

    # --- volumes and helpers --------------------------------------------------------------------

    async def volume_exists(self, name: str, node: str = "") -> bool:
        self._enter("volume_exists", name, node=node)
        if self.clustered and not self._node_answers(node):
            return False
        return (name, node) in self.volumes

    async def remove_volume(self, name: str, node: str = "") -> bool:
        self._enter("remove_volume", name, node=node)
        if self.clustered and not self._node_answers(node):
            return False
        if (name, node) not in self.volumes:
            return False
        for w in self.workloads.values():
            if w.spec.node == node and any(m.volume == name for m in w.spec.mounts):
                raise EngineError(f"volume is in use: {name} by {w.name}", status=409)
        self.volumes.discard((name, node))
        return True

    async def volumes_named(self, prefix: str, node: str | None = None) -> list[tuple[str, str]]:
        self._enter("volumes_named", prefix, node=node)
        down = {n.hostname for n in self.node_list if not n.ready} if self.clustered else set()
        return sorted(
            v
            for v in self.volumes
            if v[0].startswith(prefix)
            and v[1] not in down
            and (node is None or not self.clustered or v[1] == node)
        )

    async def run_helper(self, spec: HelperSpec, on_line, node: str = "") -> HelperResult:
        self._enter("run_helper", spec, node=node)
        why = self._node_trouble(node) if node else ""
        if why:  # its task cannot start there
            raise EngineError(f"the helper did not run: {why}")
        self.helper_configs.append(spec)
        self.helper_nodes.append(node)
        for m in spec.mounts:  # as an engine does: a named volume is made by its first mount
            self.volumes.add((m.volume, node))
        code, lines = self._helper_results.pop(0) if self._helper_results else (0, [])
        for line in lines:
            on_line(line)
        return HelperResult(code, list(lines))

    async def remove_helper_leftovers(self, instance: str) -> list[str]:
        """What a test put in :attr:`helper_leftovers` for ``instance``, taken away."""
        self._enter("remove_helper_leftovers", instance)
        return self.helper_leftovers.pop(instance, [])

    # --- networks -------------------------------------------------------------------------------

    async def ensure_user_network(self, instance: str, user: str) -> str:
        self._enter("ensure_user_network", instance, user)
        return self._user_network(instance, user)

    async def ensure_job_network(self, instance: str, owner: str, job_id: str) -> str:
        self._enter("ensure_job_network", instance, owner, job_id)
        return self._job_network(instance, owner, job_id)

    async def remove_job_network(self, instance: str, job_id: str) -> None:
        self._enter("remove_job_network", instance, job_id)
        nid = f"jobnet-{instance}-{job_id}"
        if nid in self.networks and not self._in_use(nid):
            del self.networks[nid]

    async def remove_user_network_if_unused(self, instance: str, user: str) -> bool:
        self._enter("remove_user_network_if_unused", instance, user)
        nid = f"net-{instance}-{user}"
        if nid not in self.networks or self._in_use(nid):
            return False
        del self.networks[nid]
        return True

    async def prune_user_networks(self, instance: str) -> list[str]:
        self._enter("prune_user_networks", instance)
        gone = []
        for nid, (inst, user, job) in list(self.networks.items()):
            if inst == instance and not self._in_use(nid):
                del self.networks[nid]
                gone.append(f"job {job}" if job else user)
        return gone

    async def reach(self, name: str, network_id: str, path: str, port: int) -> tuple[str, int]:
        self._enter("reach", name, network_id, path, port)
        w = self.workloads.get(name)
        if w is None or not w.running or network_id not in w.addresses:
            raise WorkloadGone(f"{name} has no address on network {network_id}")
        return w.addresses[network_id], port

    async def unreach(self, path: str) -> None:
        self._enter("unreach", path)

    async def restore_routes(self, instance: str) -> list[str]:
        self._enter("restore_routes", instance)
        return []
