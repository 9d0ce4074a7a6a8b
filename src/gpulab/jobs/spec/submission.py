"""Validate a training job submission, in one place for the REST API and the CLI alike.

The body of ``POST /jobs`` (or what the CLI builds from its arguments) goes through
:func:`parse_job_spec`, which returns a frozen :class:`JobSpec` or raises :class:`JobSpecError`
naming the field at fault (dotted for nested fields: ``resources.gpus``, ``env.FOO``,
``hang_restart.period``) with a message that says what is allowed. It mirrors the notebook
options (:mod:`gpulab.notebooks.options`): the same catalog, flavors, per-user limits, allowed
images and volume grants, so the jobs API cannot reach what the notebook form would refuse.

:data:`~gpulab.jobs.spec.schema.JOB_SPEC_SCHEMA` describes the same body as a JSON Schema
(draft 2020-12) for the service's OpenAPI document; a unit test keeps its fields and the
parser's in step.

Rules beyond the obvious:

- ``image`` and ``framework``/``version`` are exclusive, except when they name the same image
  (a body returned by the API, submitted again to clone a job); with neither, the catalog's
  default framework and its default (first) version are used.
- resources: a ``flavor`` gives cpus/memory/gpus, which ``resources.*`` may override; without a
  flavor each field has a job default (1 cpu, 4G, **1 GPU**). ``default_flavor`` (if given) is
  used only when the body names no flavor and no resources at all.
- ``command`` given as one string runs through ``sh -c``; ``args`` follow the command.
- values are JSON-typed: a number is never a string or a boolean, a boolean is never "true".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ... import checks
from ...errors import FieldError
from ...frameworks import Catalog
from ...live_push import DEFAULT_FLOOR_S, check_interval
from ...notices import Notify, NotifyRules, parse_notify
from ...resources import Flavor, Limits, Resources, parse_memory
from ...storage import StorageConfig
from ...volumes import VolumeSpec, parse_volume
from ..gang import DISTRIBUTED_ENV
from .array import MAX_COMPLETIONS, Task, parse_array
from .base import (
    DEFAULT_CPUS,
    DEFAULT_GPUS,
    DEFAULT_HANG_PERIOD,
    DEFAULT_MEMORY,
    DEFAULT_PRIORITY,
    DEFAULT_TIMEOUT,
    MAX_TIMEOUT,
    WORKSPACE_DIR,
    JobSpecError,
    check_secret,
)
from .fields import (
    HangRestart,
    parse_auto_delete,
    parse_fields,
    parse_read_only,
    parse_working_dir,
)
from .git import GitSource, check_git_mounts, parse_git
from .ports import Port, parse_ports

__all__ = ["JobSpec", "parse_job_spec"]


@dataclass(frozen=True)
class JobSpec:
    """A validated job definition (what a job runs and with what)."""

    name: str | None
    image: str
    command: tuple[str, ...]
    #: for an image from a registry (and only then, which is how the supervisor knows one):
    #: when it is pulled, and the owner's secret that holds the registry's credentials (None:
    #: an anonymous pull)
    image_pull_policy: str | None = None
    image_pull_secret: str | None = None
    framework: str | None = None
    version: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    flavor: str | None = None
    resources: Resources = field(
        default_factory=lambda: Resources(DEFAULT_CPUS, parse_memory(DEFAULT_MEMORY), DEFAULT_GPUS)
    )
    #: the GPU model and the node pool its GPUs (every worker's) must be of ("" for any)
    gpu_model: str = ""
    node_pool: str = ""
    #: containers of a distributed job, each with ``resources`` (placed all or none)
    workers: int = 1
    #: a job array (a sweep): its tasks, at most ``parallelism`` at once, each with its set of
    #: ``parameters`` where given (None, None, None: a plain job)
    completions: int | None = None
    parallelism: int | None = None
    parameters: tuple[Mapping[str, Any], ...] | None = None
    volumes: tuple[VolumeSpec, ...] = ()
    timeout: float = DEFAULT_TIMEOUT
    retries: int = 0
    hang_restart: HangRestart = field(default_factory=HangRestart)
    preemptible: bool = False
    #: a preempted job ends INTERRUPTED (PREEMPTED) instead of going back to the queue
    terminate_after_preemption: bool = False
    priority: int = DEFAULT_PRIORITY
    #: environment variables filled from the owner's secrets at start: NAME -> secret name
    secret_env: dict[str, str] = field(default_factory=dict)
    ports: tuple[Port, ...] = ()
    git: tuple[GitSource, ...] = ()
    working_dir: str | None = None
    read_only_rootfs: bool = False
    #: whom to tell of its end, failure or preemption (gpulab.notices); None: nobody
    notify: Notify | None = None
    #: seconds after its end when the service deletes its record, history and saved logs
    #: (None: the site's ``job_retention``)
    auto_delete_after: float | None = None
    #: seconds between live pushes of its rw/rwd volumes while it runs (0: never); None: its
    #: flavor's, else the site's ``sync_interval`` (:mod:`gpulab.live_push`)
    sync_interval: float | None = None
    #: one task of an array (its index and parameters; None for any other job): never
    #: submitted, made by :meth:`task_spec`
    task: Task | None = None

    @property
    def is_array(self) -> bool:
        """An array's own spec (its tasks run; it runs nothing itself)."""
        return self.completions is not None and self.task is None

    def task_spec(self, index: int) -> JobSpec:
        """The spec of the array's task ``index``: the array's, with its parameter set alone
        (the list stays with the array) and no notices (the array's end is told once)."""
        sets = self.parameters or ()
        params = dict(sets[index]) if index < len(sets) else {}
        return replace(self, parameters=None, notify=None, task=Task(index, params))

    @property
    def total_gpus(self) -> int:
        """GPUs of all its workers together (what quotas, placement and billing count)."""
        return self.resources.gpus * self.workers

    def to_json(self) -> dict[str, Any]:
        """JSON-serialisable; memory as ``"4G"``, volumes as spec strings, durations in seconds."""
        return {
            "name": self.name,
            "framework": self.framework,
            "version": self.version,
            "image": self.image,
            "image_pull_policy": self.image_pull_policy,
            "image_pull_secret": self.image_pull_secret,
            "command": list(self.command),
            "args": list(self.args),
            # a secret shows as its reference, never its value
            "env": {**self.env, **{k: {"secret": v} for k, v in self.secret_env.items()}},
            "labels": dict(self.labels),
            "flavor": self.flavor,
            "resources": self.resources.to_json(),
            "gpu_model": self.gpu_model or None,
            "node_pool": self.node_pool or None,
            "workers": self.workers,
            "completions": self.completions,
            "parallelism": self.parallelism,
            "parameters": None if self.parameters is None else [dict(p) for p in self.parameters],
            "volumes": [str(v) for v in self.volumes],
            "timeout": self.timeout,
            "retries": self.retries,
            "hang_restart": self.hang_restart.to_json(),
            "preemptible": self.preemptible,
            "terminate_after_preemption": self.terminate_after_preemption,
            "priority": self.priority,
            "ports": [p.to_json() for p in self.ports],
            "git": [g.to_json() for g in self.git],
            "working_dir": self.working_dir,
            "read_only_rootfs": self.read_only_rootfs,
            "notify": self.notify.to_json() if self.notify else None,
            "auto_delete_after": self.auto_delete_after,
            "sync_interval": self.sync_interval,
            # a task's own part (not a submission field: a task is rerun with its array)
            **({"task": self.task.to_json()} if self.task is not None else {}),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> JobSpec:
        """Rebuild a stored spec from :meth:`to_json`'s output, trusting it (no access checks:
        grants, limits or the catalog may have changed since the job was accepted). Fields
        missing from older records take their defaults."""
        res = d.get("resources") or {}
        hang = d.get("hang_restart") or {}
        env = d.get("env") or {}
        return cls(
            name=d.get("name"),
            framework=d.get("framework"),
            version=d.get("version"),
            image=str(d["image"]),
            image_pull_policy=d.get("image_pull_policy"),
            image_pull_secret=d.get("image_pull_secret"),
            command=tuple(d["command"]),
            args=tuple(d.get("args") or ()),
            env={k: v for k, v in env.items() if isinstance(v, str)},
            secret_env={k: v["secret"] for k, v in env.items() if isinstance(v, dict)},
            labels=dict(d.get("labels") or {}),
            flavor=d.get("flavor"),
            resources=Resources(
                cpus=float(res.get("cpus", DEFAULT_CPUS)),
                memory=parse_memory(res.get("memory", DEFAULT_MEMORY)),
                gpus=int(res.get("gpus", DEFAULT_GPUS)),
            ),
            gpu_model=d.get("gpu_model") or "",
            node_pool=d.get("node_pool") or "",
            workers=int(d.get("workers") or 1),
            completions=None if d.get("completions") is None else int(d["completions"]),
            parallelism=None if d.get("parallelism") is None else int(d["parallelism"]),
            parameters=None
            if d.get("parameters") is None
            else tuple(dict(p) for p in d["parameters"]),
            volumes=tuple(_stored_volume(s) for s in d.get("volumes") or ()),
            timeout=float(d.get("timeout", DEFAULT_TIMEOUT)),
            retries=int(d.get("retries", 0)),
            hang_restart=HangRestart(
                enabled=bool(hang.get("enabled", False)),
                period=float(hang.get("period", DEFAULT_HANG_PERIOD)),
            ),
            preemptible=bool(d.get("preemptible", False)),
            terminate_after_preemption=bool(d.get("terminate_after_preemption", False)),
            priority=int(d.get("priority", DEFAULT_PRIORITY)),
            ports=tuple(Port.from_json(p) for p in d.get("ports") or ()),
            git=tuple(GitSource.from_json(g) for g in d.get("git") or ()),
            working_dir=d.get("working_dir") or None,
            read_only_rootfs=bool(d.get("read_only_rootfs", False)),
            notify=Notify.from_json(d.get("notify")),
            auto_delete_after=_stored_seconds(d.get("auto_delete_after")),
            sync_interval=_stored_seconds(d.get("sync_interval")),
            task=Task.from_json(d["task"]) if d.get("task") else None,
        )


def _stored_seconds(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _stored_volume(spec: str) -> VolumeSpec:
    """Parse a volume spec string of a stored job, whatever stores exist today."""
    store = re.split(r"[/:]", spec.split("@", 1)[-1], maxsplit=1)[0]
    return parse_volume(spec, [store], workspace=WORKSPACE_DIR)


def parse_job_spec(
    raw: Mapping,
    *,
    catalog: Catalog,
    flavors: Mapping[str, Flavor],
    limits: Limits,
    default_flavor: str | None = None,
    allowed_images: frozenset[str] = frozenset(),
    storage: StorageConfig | None = None,
    user: str = "",
    host_gpus: int,
    max_timeout: float = MAX_TIMEOUT,
    gpu_home: str = "this host",
    secret_names: frozenset[str] | None = None,
    git_allowed: bool = True,
    notify_rules: NotifyRules | None = None,
    max_retention: float | None = None,
    max_tasks: int = MAX_COMPLETIONS,
    image_registries: tuple[str, ...] = (),
    default_pull_policy: str = "if-not-present",
    sync_floor: float = DEFAULT_FLOOR_S,
) -> JobSpec:
    """Turn a raw submission into a :class:`JobSpec` or raise :class:`JobSpecError`.

    Fields are checked in the order of :data:`JOB_SPEC_FIELDS`, so the first fault is reported.
    ``name`` may be absent (None): the caller then generates one. ``timeout`` defaults to 7 days
    (or ``max_timeout`` if lower) and may not exceed ``max_timeout``. ``secret_names``: the
    owner's secrets (None: secrets are not enabled, and a reference to one is refused).
    ``notify_rules``: where notices may go on this site (None: nowhere, ``notify`` is refused).
    ``max_retention``: the longest ``auto_delete_after`` the site allows (None: ten years).
    ``max_tasks``: the most tasks of a job array (``max_job_tasks``).
    ``image_registries``: the admin's patterns of registries and repositories users may run
    images from (:mod:`gpulab.imagerefs`); such an image's spec keeps its pull policy
    (``default_pull_policy``, the site's, when the submission gives none).
    ``sync_floor``: the shortest ``sync_interval`` but 0 (``sync_interval_floor``).
    """
    fields = parse_fields(
        raw,
        catalog=catalog,
        flavors=flavors,
        limits=limits,
        default_flavor=default_flavor,
        allowed_images=allowed_images,
        storage=storage,
        user=user,
        host_gpus=host_gpus,
        max_timeout=max_timeout,
        gpu_home=gpu_home,
        image_registries=image_registries,
    )
    registry_image = checks.from_registry(fields["image"], catalog, allowed_images)
    pull_policy, pull_secret = checks.image_pull(
        JobSpecError,
        raw,
        registry_image,
        lambda field, name: check_secret(field, name, secret_names),
    )
    if registry_image:  # kept with the job: what marks its image as one from a registry
        pull_policy = pull_policy or default_pull_policy
    if fields["workers"] > 1:
        for var in sorted({*fields["env"], *fields["secret_env"]} & set(DISTRIBUTED_ENV)):
            raise JobSpecError(
                f"env.{var}",
                f"{var} is set by gpulab for each worker of a distributed job: remove it",
            )
    for var, secret in fields["secret_env"].items():
        check_secret(f"env.{var}", secret, secret_names)
    if not git_allowed and raw.get("git"):
        raise JobSpecError("git", "git repositories are not enabled on this platform")
    git = parse_git(raw.get("git"), secret_names)
    check_git_mounts(git, [v.mount for v in fields["volumes"]])
    completions, parallelism, parameters = parse_array(raw, max_tasks)
    return JobSpec(
        **fields,
        image_pull_policy=pull_policy,
        image_pull_secret=pull_secret,
        completions=completions,
        parallelism=parallelism,
        parameters=parameters,
        ports=parse_ports(raw),
        git=git,
        working_dir=parse_working_dir(raw),
        read_only_rootfs=parse_read_only(raw),
        notify=parse_notify(raw.get("notify"), notify_rules or NotifyRules(), JobSpecError),
        auto_delete_after=parse_auto_delete(raw, max_retention),
        sync_interval=parse_sync_interval(raw, sync_floor),
    )


def parse_sync_interval(raw: Mapping, floor: float) -> float | None:
    """``sync_interval``: 0 (no live push) or from ``floor`` to a day; absent: None (the
    flavor's, else the site's)."""
    value = raw.get("sync_interval")
    if value is None or value == "":
        return None
    try:
        return check_interval(value, "sync_interval", floor)
    except FieldError as e:
        raise JobSpecError(e.field, str(e)) from None
