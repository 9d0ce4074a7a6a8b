"""Resource requests, flavors and limits (pure, no I/O).

A notebook asks for a flavor (``cpu-small``, ``gpu-1``...) or explicit cpus/memory/gpus. A
notebook's gpus may be a fraction below 1 (part of a shared GPU, see gpulab.gpus.sharing;
whether the installation offers that fraction is the spawner's check, against the ledger);
above 1 it is a whole number. The request is checked against the maximum the admin allows
that user (per user, else the most generous of their groups, else the default), then turned
into container limits.

Quotas (GPUs and active jobs per user, notebooks and jobs together) follow the same one rule,
:func:`own_else_groups`, as the disk quota (:mod:`gpulab.disk_quota`) does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from .bounds import (
    CPU_PERIOD,
    MAX_CPUS,
    MAX_GPUS,
    MAX_MEMORY,
    MAX_NUMBER_CHARS,
    MIN_CPU_QUOTA,
    MIN_CPUS,
    MIN_MEMORY,
    shown,
)
from .errors import FieldError
from .live_push import check_interval

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
# ASCII digits only ("\d" would take any Unicode digit); matched in full (no "$" that lets a
# trailing newline through)
_MEM_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:I?B)?\s*", re.IGNORECASE)
#: a number written as a string: no "nan", "inf", "1_000" or other spellings float() takes
_NUMBER_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


class ResourceError(FieldError):
    """An invalid or over-limit resource request; the message says what is allowed."""


def parse_memory(value: str | int | float, field: str = "memory") -> int:
    """Parse ``512M``, ``16G``, ``1.5GiB`` or a byte count into bytes (1 byte to 1 PiB)."""
    help_ = f"{field} must be a size such as 512M or 4G"
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ResourceError(field, f"{help_}, not {shown(value)}")
    if isinstance(value, str):
        if len(value) > MAX_NUMBER_CHARS:
            raise ResourceError(field, f"{help_}, not {len(value)} characters")
        m = _MEM_RE.fullmatch(value)
        if not m:
            raise ResourceError(field, f"{help_}, not {shown(value)}")
        size: float | int = float(m.group(1)) * _UNITS[m.group(2).upper()]
    else:
        size = value
    if isinstance(size, float) and not math.isfinite(size):
        raise ResourceError(field, f"{help_}, not {shown(value)}")
    if size <= 0:
        raise ResourceError(field, f"{field} must be positive, got {shown(value)}")
    if size > MAX_MEMORY:
        raise ResourceError(field, f"{field} must be at most 1P, got {shown(value)}")
    return int(size)


def format_memory(size: int) -> str:
    for unit in ("T", "G", "M", "K"):
        if size >= _UNITS[unit] and size % _UNITS[unit] == 0:
            return f"{size // _UNITS[unit]}{unit}"
    return str(size)


@dataclass(frozen=True)
class Resources:
    cpus: float
    memory: int  # bytes
    gpus: float = 0  # an int, or a fraction below 1 (a notebook's share of a shared GPU)

    def to_json(self) -> dict:
        return {"cpus": self.cpus, "memory": format_memory(self.memory), "gpus": self.gpus}


#: what a request's ``gpu_model`` may be (the JSON Schema's pattern; the parsers fullmatch it)
MODEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,63}$"
#: what a ``node_pool`` may be, in a request, a node's label or ``node_pools``
POOL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
MODEL_RE = re.compile(MODEL_PATTERN.strip("^$"))
POOL_RE = re.compile(POOL_PATTERN.strip("^$"))


def model_key(name: str) -> str:
    """A model's name as requests are matched on: case folded, runs of spaces, hyphens and
    underscores made one space ("nvidia a100-80gb" and "NVIDIA_A100 80GB" are one model)."""
    return " ".join(part for part in re.split(r"[\s_-]+", name.casefold()) if part)


def check_gpu_model(value: object, name: str) -> str:
    """A GPU model's name as an admin or a user gives it (ValueError naming ``name``)."""
    if not isinstance(value, str) or not MODEL_RE.fullmatch(value):
        raise ValueError(
            f"{name} must be a GPU model's name (letters, digits, spaces, '.', '_' and '-', "
            f"at most 64), not {str(value)[:80]!r}"
        )
    return value


def check_node_pool(value: object, name: str) -> str:
    """A node pool's name (ValueError naming ``name``)."""
    if not isinstance(value, str) or not POOL_RE.fullmatch(value):
        raise ValueError(
            f"{name} must be a node pool's name (letters, digits, '.', '_' and '-', at most "
            f"63), not {str(value)[:80]!r}"
        )
    return value


@dataclass(frozen=True)
class Flavor:
    id: str
    title: str
    resources: Resources
    #: seconds without activity after which its notebooks stop (0: never); None: the default
    #: of its kind (GpulabSettings.gpu_idle_timeout or cpu_idle_timeout)
    idle_timeout: float | None = None
    #: seconds its GPUs may go unused before its notebooks stop (0: never); None: the site's
    #: (GpulabSettings.gpu_unused_timeout)
    gpu_unused_timeout: float | None = None
    #: seconds its notebooks may wait in the queue for their GPUs (0: they never wait); None:
    #: the site's (GpulabSettings.notebook_gpu_wait)
    gpu_wait: float | None = None
    #: the GPU model and the node pool its workloads ask for ("" for any): a default a user
    #: may repeat but not change (:func:`gpulab.checks.want`)
    gpu_model: str = ""
    node_pool: str = ""
    #: seconds between live pushes of its workloads' volumes (0: never); None: the site's
    #: (GpulabSettings.sync_interval), which also checks it against the site's floor
    sync_interval: float | None = None

    @classmethod
    def from_config(cls, d: Mapping) -> Flavor:
        try:
            res = Resources(
                cpus=float(d["cpus"]),
                memory=parse_memory(d["memory"]),
                gpus=flavor_gpus(d.get("gpus", 0), str(d.get("id"))),
            )
            idle = d.get("idle_timeout")
            unused = d.get("gpu_unused_timeout")
            wait = d.get("gpu_wait")
            return cls(
                id=str(d["id"]),
                title=str(d.get("title", d["id"])),
                resources=res,
                idle_timeout=None
                if idle is None
                else check_idle_timeout(idle, f"flavor {d['id']!r}: idle_timeout"),
                gpu_unused_timeout=None
                if unused is None
                else check_idle_timeout(unused, f"flavor {d['id']!r}: gpu_unused_timeout"),
                gpu_wait=None
                if wait is None
                else check_gpu_wait(wait, f"flavor {d['id']!r}: gpu_wait"),
                gpu_model=check_gpu_model(d["gpu_model"], f"flavor {d['id']!r}: gpu_model")
                if d.get("gpu_model")
                else "",
                node_pool=check_node_pool(d["node_pool"], f"flavor {d['id']!r}: node_pool")
                if d.get("node_pool")
                else "",
                sync_interval=None
                if d.get("sync_interval") is None
                else check_interval(d["sync_interval"], f"flavor {d['id']!r}: sync_interval", 0),
            )
        except KeyError as e:
            raise ValueError(f"flavor {d!r} lacks {e.args[0]!r}") from None


def flavor_gpus(value, flavor: str) -> float:
    """A flavor's GPU count: a whole number, or a fraction below 1 (a share of a GPU)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"flavor {flavor!r}: gpus must be a number, not {value!r}")
    if value < 0 or (value > 1 and value != int(value)):
        raise ValueError(
            f"flavor {flavor!r}: gpus must be a whole number or a fraction below 1, not {value!r}"
        )
    return normalize_gpus(value)


def normalize_gpus(gpus: float) -> float:
    """1.0 -> 1 (so that JSON and messages say 1), 0.50000001 -> 0.5."""
    if not math.isfinite(gpus):
        return gpus  # refused by the range check, with the number as given
    return int(gpus) if gpus == int(gpus) else round(gpus, 4)


def check_idle_timeout(value, name: str) -> float:
    """An idle time in seconds: a finite number, 0 (never) or more."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(
            f"{name} must be a number of seconds (0 turns the idle stop off), not {value!r}"
        )
    if value < 0:
        raise ValueError(f"{name} cannot be negative (0 turns the idle stop off), not {value}")
    return float(value)


def check_gpu_wait(value, name: str) -> float:
    """How long a notebook may wait for its GPUs, in seconds: a finite number, 0 (it never
    waits: no GPU free now fails it at once) or more."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(
            f"{name} must be a number of seconds (0: a notebook never waits for GPUs), "
            f"not {value!r}"
        )
    if value < 0:
        raise ValueError(f"{name} cannot be negative (0: a notebook never waits), not {value}")
    return float(value)


def gpu_wait_for(flavor: Flavor | None, resources: Resources, default: float) -> float:
    """Seconds a notebook may wait in the queue for its GPUs (always 0 without GPUs): the
    flavor's own ``gpu_wait`` when the notebook asks for the flavor's GPUs, else the site's."""
    if resources.gpus <= 0:
        return 0.0
    own = flavor.gpu_wait if flavor is not None else None
    if own is not None and resources.gpus == flavor.resources.gpus:
        return own
    return default


def beyond_gpus(
    asked: float, most: int, where: str = "this host", *, option: str = ""
) -> str | None:
    """The one "can it ever fit" GPU rule: why ``asked`` GPUs can never be had where the most
    one workload can have is ``most`` (``where`` says what has them), or None. Job specs (at
    parse), job admission (the scheduler), the ledger and the notebook form all ask it.
    ``option``: the notebook form's wording names its option ("gpus=2 requested but this host
    has 1 GPU(s)"); else "2 GPUs requested but this host has 1"."""
    if asked <= most:
        return None
    if option:
        return f"{option}={asked:g} requested but {where} has {most} GPU(s)"
    return f"{asked} GPUs requested but {where} has {most}"


@dataclass(frozen=True)
class Limits:
    """The most one notebook may ask for."""

    cpus: float
    memory: int
    gpus: int

    @classmethod
    def from_config(cls, d: Mapping) -> Limits:
        return cls(cpus=float(d["cpus"]), memory=parse_memory(d["memory"]), gpus=int(d["gpus"]))

    def describe(self) -> str:
        return f"cpus ≤ {self.cpus:g}, memory ≤ {format_memory(self.memory)}, gpus ≤ {self.gpus}"


T = TypeVar("T")
G = TypeVar("G")


def own_else_groups(
    user: str,
    groups: Iterable[str],
    default: T,
    per_user: Mapping[str, T],
    per_group: Mapping[str, G],
    most: Callable[[Sequence[G]], T],
) -> T:
    """The one rule of every per-user limit and quota: the user's own wins; else the most
    generous of their groups' entries (``most`` of them, field by field); else the default."""
    if user in per_user:
        return per_user[user]
    found = [per_group[g] for g in sorted(set(groups)) if g in per_group]
    return most(found) if found else default


def most_generous(values: Iterable[int | None]) -> int | None:
    """The largest of several limits (None, unlimited, beats all)."""
    best = 0
    for v in values:
        if v is None:
            return None
        best = max(best, v)
    return best


def effective_limits(
    user: str,
    groups: Iterable[str],
    default: Mapping,
    per_user: Mapping[str, Mapping],
    per_group: Mapping[str, Mapping],
) -> Limits:
    """A user's own limit wins; otherwise the most generous of their groups; else default.
    A user's or group's entry overrides the default field by field."""

    def limits(d: Mapping) -> Limits:
        return Limits.from_config({**default, **d})

    def most(found: Sequence[Mapping]) -> Limits:
        each = [limits(d) for d in found]
        return Limits(
            cpus=max(g.cpus for g in each),
            memory=max(g.memory for g in each),
            gpus=max(g.gpus for g in each),
        )

    own = {user: limits(per_user[user])} if user in per_user else {}
    chosen = own_else_groups(user, groups, None, own, per_group, most)
    return chosen if chosen is not None else Limits.from_config(default)


@dataclass(frozen=True)
class Quota:
    """Most GPUs a user may hold in quota, and most jobs they may have in the quota states
    (QUEUED, INITIALIZING, PENDING, RUNNING: checked at submission, and of the active ones
    when a job starts); None means unlimited."""

    gpus: int | None = None
    jobs: int | None = None

    @classmethod
    def from_config(cls, d: Mapping) -> Quota:
        """A quota as the operator writes it (``{"gpus": 4, "jobs": 2}``; a missing field is
        unlimited)."""
        return cls(gpus=d.get("gpus"), jobs=d.get("jobs"))

    def allows(self, gpus_used: int, jobs_used: int, gpus: int) -> bool:
        """True if one more job of ``gpus`` GPUs stays within this quota."""
        return (self.gpus is None or gpus_used + gpus <= self.gpus) and (
            self.jobs is None or jobs_used + 1 <= self.jobs
        )


def _most_quota(found: Sequence[Quota]) -> Quota:
    return Quota(
        gpus=most_generous(q.gpus for q in found), jobs=most_generous(q.jobs for q in found)
    )


def quota_for(
    user: str,
    groups: Iterable[str],
    default: Quota,
    per_user: Mapping[str, Quota],
    per_group: Mapping[str, Quota],
) -> Quota:
    """The user's own quota wins; else the most generous of their groups' (per field); else
    the default."""
    return own_else_groups(user, groups, default, per_user, per_group, _most_quota)


@dataclass(frozen=True)
class Quotas:
    """The installation's quotas (``job_quota``, ``user_job_quotas``, ``group_job_quotas``)
    read once from the configuration: what the scheduler plans with and admission checks."""

    default: Quota
    per_user: Mapping[str, Quota]
    per_group: Mapping[str, Quota]

    @classmethod
    def from_config(
        cls, default: Mapping, per_user: Mapping[str, Mapping], per_group: Mapping[str, Mapping]
    ) -> Quotas:
        return cls(
            Quota.from_config(default),
            {u: Quota.from_config(d) for u, d in per_user.items()},
            {g: Quota.from_config(d) for g, d in per_group.items()},
        )

    def of(self, user: str, groups: Iterable[str]) -> Quota:
        return quota_for(user, groups, self.default, self.per_user, self.per_group)


def _number(value, field: str, kind: type) -> float | int:
    """A finite number from a JSON number or a string such as ``"0.5"`` (the form's)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ResourceError(field, f"{field} must be a number, not {shown(value)}")
    n: float | int = value  # type: ignore[assignment]
    if isinstance(value, str):
        text = value.strip()
        if len(text) > MAX_NUMBER_CHARS or not _NUMBER_RE.fullmatch(text):
            raise ResourceError(
                field, f"{field} must be a number such as 1 or 0.5, not {shown(value)}"
            )
        n = float(text)
    if isinstance(n, float) and not math.isfinite(n):
        # NaN passes every comparison below; inf is "no limit"; both read as a typo
        raise ResourceError(field, f"{field} must be a finite number, not {shown(value)}")
    if kind is int:
        if n != int(n):
            raise ResourceError(field, f"{field} must be a whole number, not {shown(value)}")
        return int(n)
    try:
        return float(n)
    except OverflowError:  # an int beyond float range: refused as out of range, not a 500
        return math.inf if n > 0 else -math.inf


def _check_range(res: Resources) -> None:
    """The sane range of each resource, whatever the limits: no zero CPU quota, no container
    too small to start, nothing that overflows the engine's integers."""
    if res.cpus < MIN_CPUS:
        raise ResourceError(
            "cpus",
            f"cpus must be at least {MIN_CPUS:g}, got {res.cpus:g}: a smaller CPU quota is no "
            "limit at all for the engine",
        )
    if res.cpus > MAX_CPUS:
        raise ResourceError("cpus", f"cpus must be at most {MAX_CPUS:g}, got {res.cpus:g}")
    if res.memory < MIN_MEMORY:
        raise ResourceError(
            "memory",
            f"memory must be at least {format_memory(MIN_MEMORY)}, got {format_memory(res.memory)}",
        )
    if res.gpus < 0:
        raise ResourceError("gpus", f"gpus cannot be negative, got {res.gpus}")
    if res.gpus > MAX_GPUS:
        raise ResourceError("gpus", f"gpus must be at most {MAX_GPUS}, got {res.gpus:g}")
    if res.gpus > 1 and res.gpus != int(res.gpus):
        raise ResourceError(
            "gpus",
            f"gpus={res.gpus:g}: more than one GPU is a whole number (a fraction is part of one "
            "shared GPU); ask for 1, 2, ... or a fraction below 1",
        )


def resolve_resources(
    flavors: Mapping[str, Flavor],
    limits: Limits,
    flavor: str | None = None,
    cpus=None,
    memory=None,
    gpus=None,
) -> Resources:
    """Combine a flavor and explicit overrides into a request, and check it against limits."""
    if flavor is not None:
        if flavor not in flavors:
            raise ResourceError(
                "flavor", f"unknown flavor {shown(flavor)}; choose one of: {', '.join(flavors)}"
            )
        base = flavors[flavor].resources
    elif cpus is None and memory is None and gpus is None:
        raise ResourceError("flavor", "choose a flavor or give cpus and memory")
    else:
        base = Resources(cpus=1.0, memory=parse_memory("2G"), gpus=0)

    res = Resources(
        cpus=base.cpus if cpus is None else float(_number(cpus, "cpus", float)),
        memory=base.memory if memory is None else parse_memory(memory),
        gpus=base.gpus if gpus is None else normalize_gpus(float(_number(gpus, "gpus", float))),
    )
    _check_range(res)
    for name, asked, most in (
        ("cpus", res.cpus, limits.cpus),
        ("memory", res.memory, limits.memory),
        ("gpus", res.gpus, limits.gpus),
    ):
        if asked > most:
            text = format_memory(asked) if name == "memory" else f"{asked:g}"
            raise ResourceError(
                name, f"{name}={text} is over your limit; allowed: {limits.describe()}"
            )
    return res


@dataclass(frozen=True)
class ContainerLimits:
    """What the engine enforces: CPU quota, memory, process count and /dev/shm size (the
    values; ``runtime/objects.py`` says them in an engine's words)."""

    cpu_period: int
    cpu_quota: int
    mem_limit: int
    pids_limit: int
    shm_size: int


def container_limits(
    res: Resources, pids_limit: int = 4096, shm_fraction: float = 0.5
) -> ContainerLimits:
    """PyTorch data loaders need a large /dev/shm: give it a share of the memory limit.

    The CPU quota is never below the engine's minimum: a quota that rounds to 0 would mean no
    CPU limit at all (requests are refused below 0.01 CPU; this also covers stored records and
    flavors).
    """
    period = CPU_PERIOD
    return ContainerLimits(
        cpu_period=period,
        cpu_quota=max(MIN_CPU_QUOTA, round(res.cpus * period)),
        mem_limit=res.memory,
        pids_limit=pids_limit,
        shm_size=max(64 * 1024**2, int(res.memory * shm_fraction)),
    )
