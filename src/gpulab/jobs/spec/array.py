"""A job array, or sweep (pure): one submission that runs ``completions`` tasks, at most
``parallelism`` at once, each told its index and, given ``parameters``, its own parameter set.

The anchors: Run:ai's Trainings API (``completions``, ``parallelism``), Kubernetes' Indexed
Jobs (``JOB_COMPLETION_INDEX``) and Slurm's job arrays (``--array=0-9%2``,
``SLURM_ARRAY_TASK_ID``). Each task is a job of its own to the supervisor (scheduled, retried,
preempted and billed alone); the array is what the user submitted and sees as one job.

What a task is told (gpulab's own variables: a job may not set any ``GPULAB_`` name, so none
of these can be overridden by ``env`` or a secret, and a parameter's variable always carries
the ``GPULAB_PARAM_`` prefix):

- ``GPULAB_ARRAY_ID``: the array's job id; ``GPULAB_TASK_INDEX``: 0 .. completions-1;
  ``GPULAB_TASK_COUNT``: completions;
- ``GPULAB_TASK_PARAMS``: the task's parameter set as one JSON object (``{}`` without
  ``parameters``), and one ``GPULAB_PARAM_<KEY>`` per key (the key upper-cased; a number
  as JSON writes it).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...bounds import shown, size_text
from ...checks import key_text
from .base import JobSpecError

#: the most tasks of one array (each a job record: the queue's cap, max_queued_jobs, counts them)
MAX_COMPLETIONS = 1000
#: keys of one parameter set, and what one key and one value may hold
MAX_PARAMETER_KEYS = 32
MAX_PARAMETER_KEY_CHARS = 64
MAX_PARAMETER_VALUE_CHARS = 1024
#: one set as JSON (what GPULAB_TASK_PARAMS holds), and the whole list as JSON
MAX_PARAMETER_SET_BYTES = 4096
MAX_PARAMETERS_BYTES = 256 * 1024
#: a parameter's key: letters, digits and '_', not starting with a digit (an env name's tail)
PARAMETER_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PARAM_ENV_PREFIX = "GPULAB_PARAM_"

ARRAY_FIELDS = ("completions", "parallelism", "parameters")


@dataclass(frozen=True)
class Task:
    """What makes one task of an array itself: its index, its parameter set (empty without
    ``parameters``) and its array's id (set when the records are made)."""

    index: int
    parameters: Mapping[str, Any] = field(default_factory=dict)
    array: str = ""

    def to_json(self) -> dict:
        return {"array": self.array, "index": self.index, "parameters": dict(self.parameters)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Task:
        return cls(
            index=int(d["index"]),
            parameters=dict(d.get("parameters") or {}),
            array=str(d.get("array") or ""),
        )


def _count(value: object, key: str, low: int, high: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise JobSpecError(
            key, f"{key} must be a whole number from {low} to {high}, not {shown(value)}"
        )
    if not low <= value <= high:
        raise JobSpecError(key, f"{key} must be from {low} to {high}, got {shown(value)}")
    return value


def _parameter_set(value: object, key: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise JobSpecError(
            key,
            f'{key} must be an object of KEY: value, such as {{"lr": 0.01}}, not {shown(value)}',
        )
    if len(value) > MAX_PARAMETER_KEYS:
        raise JobSpecError(key, f"{key}: at most {MAX_PARAMETER_KEYS} keys (got {len(value)})")
    out: dict[str, Any] = {}
    seen: dict[str, str] = {}
    for name, v in value.items():
        where = f"{key}.{key_text(name)}"
        if (
            not isinstance(name, str)
            or len(name) > MAX_PARAMETER_KEY_CHARS
            or not PARAMETER_KEY_RE.fullmatch(name)
        ):
            raise JobSpecError(
                where,
                f"parameter key {shown(name)} must be 1 to {MAX_PARAMETER_KEY_CHARS} letters, "
                "digits and '_', not starting with a digit (it names the variable "
                f"{PARAM_ENV_PREFIX}<KEY>)",
            )
        upper = name.upper()
        if upper in seen:
            raise JobSpecError(
                where,
                f"parameter keys {seen[upper]!r} and {name!r} name the same variable "
                f"{PARAM_ENV_PREFIX}{upper}",
            )
        seen[upper] = name
        if isinstance(v, float) and not math.isfinite(v):
            raise JobSpecError(where, f"{where} must be a finite number, not {v!r}")
        if isinstance(v, bool) or not isinstance(v, str | int | float):
            raise JobSpecError(where, f"{where} must be a string or a number, not {shown(v)}")
        if isinstance(v, str):
            if len(v) > MAX_PARAMETER_VALUE_CHARS:
                raise JobSpecError(
                    where, f"{where}: at most {MAX_PARAMETER_VALUE_CHARS} characters (got {len(v)})"
                )
            if "\0" in v:
                raise JobSpecError(where, f"{where} must not contain NUL characters")
        out[name] = v
    if len(json.dumps(out).encode()) > MAX_PARAMETER_SET_BYTES:
        raise JobSpecError(
            key,
            f"{key}: at most {size_text(MAX_PARAMETER_SET_BYTES)} as JSON; pass large "
            "inputs through a volume",
        )
    return out


def parse_array(
    raw: Mapping, max_tasks: int = MAX_COMPLETIONS
) -> tuple[int | None, int | None, tuple[dict[str, Any], ...] | None]:
    """(completions, parallelism, parameters) of a submission; (None, None, None) for a plain
    job. ``parameters`` gives completions (its length; a ``completions`` that disagrees is
    refused, naming it); ``parallelism`` defaults to completions (every task may run at once,
    as GPUs and the quota allow: Slurm's default) and needs completions or parameters.
    ``max_tasks``: the site's cap (``max_job_tasks``), at most MAX_COMPLETIONS."""
    cap = max(1, min(max_tasks, MAX_COMPLETIONS))
    completions = raw.get("completions")
    parallelism = raw.get("parallelism")
    params = raw.get("parameters")
    sets: tuple[dict[str, Any], ...] | None = None
    if params is not None:
        if not isinstance(params, list | tuple) or not params:
            raise JobSpecError(
                "parameters",
                "parameters must be a non-empty list of objects (one parameter set per task), "
                f"not {shown(params)}",
            )
        if len(params) > cap:
            raise JobSpecError("parameters", f"parameters: at most {cap} sets (got {len(params)})")
        sets = tuple(_parameter_set(p, f"parameters[{i}]") for i, p in enumerate(params))
        size = len(json.dumps(list(sets)).encode())
        if size > MAX_PARAMETERS_BYTES:
            raise JobSpecError(
                "parameters",
                f"parameters: at most {size_text(MAX_PARAMETERS_BYTES)} as JSON (got {size} "
                "bytes); pass large inputs through a volume",
            )
    if completions is not None:
        completions = _count(completions, "completions", 1, cap)
        if sets is not None and completions != len(sets):
            raise JobSpecError(
                "completions",
                f"completions ({completions}) must equal the number of parameter sets "
                f"({len(sets)}), or be left out",
            )
    elif sets is not None:
        completions = len(sets)
    if parallelism is not None:
        if completions is None:
            raise JobSpecError(
                "parallelism", "parallelism needs completions or parameters (a job array)"
            )
        parallelism = _count(parallelism, "parallelism", 1, completions)
    elif completions is not None:
        parallelism = completions
    return completions, parallelism, sets


def param_env_name(key: str) -> str:
    return PARAM_ENV_PREFIX + key.upper()


def _env_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def task_env(task: Task, completions: int) -> dict[str, str]:
    """The variables a task is told (see the module's docstring)."""
    env = {
        "GPULAB_ARRAY_ID": task.array,
        "GPULAB_TASK_INDEX": str(task.index),
        "GPULAB_TASK_COUNT": str(completions),
    }
    env["GPULAB_TASK_PARAMS"] = json.dumps(dict(task.parameters), separators=(",", ":"))
    for key, value in task.parameters.items():
        env[param_env_name(key)] = _env_text(value)
    return env
