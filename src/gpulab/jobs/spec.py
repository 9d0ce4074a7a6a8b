"""Validate a training job submission, in one place for the REST API and the CLI alike.

The body of ``POST /jobs`` (or what the CLI builds from its arguments) goes through
:func:`parse_job_spec`, which returns a frozen :class:`JobSpec` or raises :class:`JobSpecError`
naming the field at fault (dotted for nested fields: ``resources.gpus``, ``env.FOO``,
``hang_restart.period``) with a message that says what is allowed. It mirrors the notebook
options (:mod:`gpulab.options`): the same catalog, flavors, per-user limits, allowed images and
volume grants, so the jobs API cannot reach what the notebook form would refuse.

:data:`JOB_SPEC_SCHEMA` describes the same body as a JSON Schema (draft 2020-12) for the
service's OpenAPI document; a unit test keeps its fields and the parser's in step.

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

import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import FieldError
from ..frameworks import Catalog, CatalogError
from ..resources import Flavor, Limits, ResourceError, Resources, parse_memory, resolve_resources
from ..runtime.objects import LABEL_PREFIX
from ..storage import StorageConfig
from ..volumes import VolumeError, VolumeSpec, parse_volume
from .durations import DurationError, format_duration, parse_duration

__all__ = [
    "DEFAULT_TIMEOUT",
    "JOB_SPEC_FIELDS",
    "JOB_SPEC_SCHEMA",
    "MAX_TIMEOUT",
    "HangRestart",
    "JobSpec",
    "JobSpecError",
    "parse_job_spec",
]

DEFAULT_TIMEOUT = 7 * 86400.0
MAX_TIMEOUT = 30 * 86400.0
DEFAULT_HANG_PERIOD = 1800.0
MIN_HANG_PERIOD = 10.0
MAX_RETRIES = 128
DEFAULT_PRIORITY = 50
MAX_PRIORITY = 100
DEFAULT_CPUS = 1.0
DEFAULT_MEMORY = "4G"
DEFAULT_GPUS = 1
MAX_ENV = 100
MAX_ENV_VALUE_BYTES = 32 * 1024
MAX_LABELS = 32
MAX_LABEL_VALUE = 63
MAX_NAME = 63
#: command + args together, in UTF-8 bytes (well under the kernel's ARG_MAX)
MAX_COMMAND_BYTES = 256 * 1024
WORKSPACE_DIR = "/workspace"

#: environment variable names a job may not set: the platform's own and its credentials
RESERVED_ENV_PREFIXES = ("JUPYTERHUB_", "GPULAB_", "AWS_")
RESERVED_ENV_NAMES = frozenset({"NVIDIA_VISIBLE_DEVICES"})
#: label namespaces a job may not use: gpulab's own (ownership!) and Docker's reserved ones
RESERVED_LABEL_PREFIXES = (LABEL_PREFIX, "com.docker.", "io.docker.", "org.dockerproject.")

_NAME_RE = re.compile(r"^[a-z][a-z0-9-]*$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_KEY_RE = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
_DURATION_PATTERN = (
    r"^(?=.*\d)\s*(\d+(\.\d+)?|(\d+(\.\d+)?[dD])?\s*(\d+(\.\d+)?[hH])?\s*"
    r"(\d+(\.\d+)?[mM])?\s*(\d+(\.\d+)?[sS])?)\s*$"
)

#: the top-level fields of a submission, in the order of :meth:`JobSpec.to_json`
JOB_SPEC_FIELDS = (
    "name",
    "framework",
    "version",
    "image",
    "command",
    "args",
    "env",
    "labels",
    "flavor",
    "resources",
    "volumes",
    "timeout",
    "retries",
    "hang_restart",
    "preemptible",
    "priority",
)
RESOURCE_FIELDS = ("cpus", "memory", "gpus")
HANG_RESTART_FIELDS = ("enabled", "period")


class JobSpecError(FieldError):
    """An invalid submission; ``field`` names the (dotted) field, the message what is allowed."""


@dataclass(frozen=True)
class HangRestart:
    """Restart the command when the job makes no progress for ``period`` seconds."""

    enabled: bool = False
    period: float = DEFAULT_HANG_PERIOD

    def to_json(self) -> dict:
        return {"enabled": self.enabled, "period": self.period}


@dataclass(frozen=True)
class JobSpec:
    """A validated job definition (what a job runs and with what)."""

    name: str | None
    image: str
    command: tuple[str, ...]
    framework: str | None = None
    version: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    flavor: str | None = None
    resources: Resources = field(
        default_factory=lambda: Resources(DEFAULT_CPUS, parse_memory(DEFAULT_MEMORY), DEFAULT_GPUS)
    )
    volumes: tuple[VolumeSpec, ...] = ()
    timeout: float = DEFAULT_TIMEOUT
    retries: int = 0
    hang_restart: HangRestart = field(default_factory=HangRestart)
    preemptible: bool = False
    priority: int = DEFAULT_PRIORITY

    def to_json(self) -> dict[str, Any]:
        """JSON-serialisable; memory as ``"4G"``, volumes as spec strings, durations in seconds."""
        return {
            "name": self.name,
            "framework": self.framework,
            "version": self.version,
            "image": self.image,
            "command": list(self.command),
            "args": list(self.args),
            "env": dict(self.env),
            "labels": dict(self.labels),
            "flavor": self.flavor,
            "resources": self.resources.to_json(),
            "volumes": [str(v) for v in self.volumes],
            "timeout": self.timeout,
            "retries": self.retries,
            "hang_restart": self.hang_restart.to_json(),
            "preemptible": self.preemptible,
            "priority": self.priority,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> JobSpec:
        """Rebuild a stored spec from :meth:`to_json`'s output, trusting it (no access checks:
        grants, limits or the catalog may have changed since the job was accepted). Fields
        missing from older records take their defaults."""
        res = d.get("resources") or {}
        hang = d.get("hang_restart") or {}
        return cls(
            name=d.get("name"),
            framework=d.get("framework"),
            version=d.get("version"),
            image=str(d["image"]),
            command=tuple(d["command"]),
            args=tuple(d.get("args") or ()),
            env=dict(d.get("env") or {}),
            labels=dict(d.get("labels") or {}),
            flavor=d.get("flavor"),
            resources=Resources(
                cpus=float(res.get("cpus", DEFAULT_CPUS)),
                memory=parse_memory(res.get("memory", DEFAULT_MEMORY)),
                gpus=int(res.get("gpus", DEFAULT_GPUS)),
            ),
            volumes=tuple(_stored_volume(s) for s in d.get("volumes") or ()),
            timeout=float(d.get("timeout", DEFAULT_TIMEOUT)),
            retries=int(d.get("retries", 0)),
            hang_restart=HangRestart(
                enabled=bool(hang.get("enabled", False)),
                period=float(hang.get("period", DEFAULT_HANG_PERIOD)),
            ),
            preemptible=bool(d.get("preemptible", False)),
            priority=int(d.get("priority", DEFAULT_PRIORITY)),
        )


def _stored_volume(spec: str) -> VolumeSpec:
    """Parse a volume spec string of a stored job, whatever stores exist today."""
    store = re.split(r"[/:]", spec.split("@", 1)[-1], maxsplit=1)[0]
    return parse_volume(spec, [store], workspace=WORKSPACE_DIR)


# --- field parsers -----------------------------------------------------------------------------


def _type_name(value: object) -> str:
    return type(value).__name__ if value is not None else "null"


def _optional_text(raw: Mapping, key: str) -> str | None:
    """None and "" mean absent; anything else must be a string."""
    value = raw.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise JobSpecError(key, f"{key} must be a string, not {_type_name(value)} {value!r}")
    return value


def _integer(value: object, key: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise JobSpecError(key, f"{key} must be a whole number from {low} to {high}, not {value!r}")
    if not low <= value <= high:
        raise JobSpecError(key, f"{key} must be from {low} to {high}, got {value}")
    return value


def _boolean(value: object, key: str) -> bool:
    if not isinstance(value, bool):
        raise JobSpecError(key, f"{key} must be true or false, not {value!r}")
    return value


def _duration(value: object, key: str, low: float, high: float) -> float:
    try:
        seconds = parse_duration(value, key)  # type: ignore[arg-type]
    except DurationError as e:
        raise JobSpecError(e.field, str(e)) from None
    if seconds < low:
        raise JobSpecError(key, f"{key} must be at least {format_duration(low)}, got {value!r}")
    if seconds > high:
        raise JobSpecError(key, f"{key} must be at most {format_duration(high)}, got {value!r}")
    return seconds


def _name(raw: Mapping) -> str | None:
    name = _optional_text(raw, "name")
    if name is None:
        return None
    if len(name) > MAX_NAME or not _NAME_RE.match(name):
        raise JobSpecError(
            "name",
            f"name must be 1 to {MAX_NAME} lowercase letters, digits or '-', starting with a "
            f"letter, not {name!r}",
        )
    return name


def _strings(value: object, key: str) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(s, str) for s in value):
        raise JobSpecError(key, f"{key} must be a list of strings, not {value!r}")
    for s in value:
        if "\0" in s:
            raise JobSpecError(key, f"{key} must not contain NUL characters")
    return tuple(value)


def _command(raw: Mapping) -> tuple[tuple[str, ...], tuple[str, ...]]:
    value = raw.get("command")
    help_ = "command must be a non-empty list of strings, or one string run with sh -c"
    if value is None or (isinstance(value, str | list | tuple) and len(value) == 0):
        raise JobSpecError("command", f"a job needs a command: {help_}")
    if isinstance(value, str):
        if not value.strip():
            raise JobSpecError("command", f"command is blank: {help_}")
        command: tuple[str, ...] = ("sh", "-c", value)
        if "\0" in value:
            raise JobSpecError("command", "command must not contain NUL characters")
    elif isinstance(value, list | tuple):
        command = _strings(value, "command")
        if not command[0].strip():
            raise JobSpecError("command", f"the program (first item) is blank: {help_}")
    else:
        raise JobSpecError("command", f"{help_}, not {_type_name(value)} {value!r}")
    args = () if raw.get("args") is None else _strings(raw["args"], "args")
    size = sum(len(s.encode()) + 1 for s in command + args)
    if size > MAX_COMMAND_BYTES:
        raise JobSpecError(
            "command",
            f"command and args take {size} bytes; at most {MAX_COMMAND_BYTES} are allowed "
            "(pass large inputs through a volume)",
        )
    return command, args


def _env(raw: Mapping) -> dict[str, str]:
    value = raw.get("env")
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise JobSpecError("env", f"env must be an object of NAME: value strings, not {value!r}")
    if len(value) > MAX_ENV:
        raise JobSpecError("env", f"at most {MAX_ENV} environment variables, got {len(value)}")
    env: dict[str, str] = {}
    for name, text in value.items():
        key = f"env.{name}"
        if not isinstance(name, str) or not _ENV_NAME_RE.match(name):
            raise JobSpecError(
                key,
                f"environment variable name {name!r} must be letters, digits and '_', "
                "not starting with a digit",
            )
        if name.startswith(RESERVED_ENV_PREFIXES) or name in RESERVED_ENV_NAMES:
            raise JobSpecError(
                key,
                f"{name} is reserved to the platform: names starting with "
                f"{', '.join(RESERVED_ENV_PREFIXES)} and {', '.join(sorted(RESERVED_ENV_NAMES))}"
                " cannot be set",
            )
        if not isinstance(text, str):
            raise JobSpecError(key, f"{key} must be a string, not {_type_name(text)} {text!r}")
        if "\0" in text:
            raise JobSpecError(key, f"{key} must not contain NUL characters")
        if len(text.encode()) > MAX_ENV_VALUE_BYTES:
            raise JobSpecError(
                key, f"{key} is longer than {MAX_ENV_VALUE_BYTES // 1024} KiB; use a volume"
            )
        env[name] = text
    return env


def _labels(raw: Mapping) -> dict[str, str]:
    value = raw.get("labels")
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise JobSpecError(
            "labels", f"labels must be an object of key: value strings, not {value!r}"
        )
    if len(value) > MAX_LABELS:
        raise JobSpecError("labels", f"at most {MAX_LABELS} labels, got {len(value)}")
    labels: dict[str, str] = {}
    for name, text in value.items():
        key = f"labels.{name}"
        if not isinstance(name, str) or not _LABEL_KEY_RE.match(name):
            raise JobSpecError(
                key,
                f"label key {name!r} must be 1 to 63 lowercase letters, digits, '.', '_' or '-', "
                "starting and ending with a letter or digit",
            )
        if name.startswith(RESERVED_LABEL_PREFIXES):
            raise JobSpecError(
                key,
                f"label key {name!r} is reserved: keys starting with "
                f"{', '.join(RESERVED_LABEL_PREFIXES)} cannot be set",
            )
        if not isinstance(text, str):
            raise JobSpecError(key, f"{key} must be a string, not {_type_name(text)} {text!r}")
        if len(text) > MAX_LABEL_VALUE:
            raise JobSpecError(key, f"{key} must be at most {MAX_LABEL_VALUE} characters")
        labels[name] = text
    return labels


def _image(
    raw: Mapping, catalog: Catalog, allowed_images: frozenset[str]
) -> tuple[str, str | None, str | None]:
    custom = _optional_text(raw, "image")
    framework = _optional_text(raw, "framework")
    version = _optional_text(raw, "version")
    if custom is None or framework is not None or version is not None:
        try:
            fw = catalog.framework(framework)
            ver = fw.version(version)
        except CatalogError as e:
            raise JobSpecError(e.field, str(e)) from None
        if custom is None or custom == ver.image:
            # the same image named both ways (a body returned by the API, resubmitted) is fine
            return ver.image, fw.id, ver.id
        raise JobSpecError(
            "image",
            f"give either image or framework (and version), not both: {fw.id} {ver.id} is "
            f"{ver.image!r}, not {custom!r}",
        )
    if custom not in allowed_images and custom not in catalog.images():
        raise JobSpecError(
            "image",
            f"image {custom!r} is not in the catalog; choose a framework and version"
            + (f", or one of: {', '.join(sorted(allowed_images))}" if allowed_images else ""),
        )
    return custom, None, None


def _resources(
    raw: Mapping,
    flavors: Mapping[str, Flavor],
    limits: Limits,
    default_flavor: str | None,
    host_gpus: int,
) -> tuple[str | None, Resources]:
    value = raw.get("resources")
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise JobSpecError(
            "resources", f"resources must be an object with {', '.join(RESOURCE_FIELDS)}"
        )
    unknown = sorted(set(value) - set(RESOURCE_FIELDS), key=str)
    if unknown:
        raise JobSpecError(
            f"resources.{unknown[0]}",
            f"unknown resource {unknown[0]!r}; resources take: {', '.join(RESOURCE_FIELDS)}",
        )
    given = {k: v for k, v in value.items() if v is not None}
    cpus, memory, gpus = given.get("cpus"), given.get("memory"), given.get("gpus")
    if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, int | float)):
        raise JobSpecError("resources.cpus", f"resources.cpus must be a number, not {cpus!r}")
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int | str)):
        raise JobSpecError(
            "resources.memory",
            f"resources.memory must be a size such as 512M or 4G, not {memory!r}",
        )
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int)):
        raise JobSpecError("resources.gpus", f"resources.gpus must be a whole number, not {gpus!r}")
    if isinstance(cpus, float) and not math.isfinite(cpus):
        raise JobSpecError("resources.cpus", f"resources.cpus must be finite, not {cpus!r}")

    flavor = _optional_text(raw, "flavor")
    if flavor is None and not given and default_flavor:
        flavor = default_flavor
    request: dict[str, Any] = dict(given)
    if flavor is None:
        request = {"cpus": DEFAULT_CPUS, "memory": DEFAULT_MEMORY, "gpus": DEFAULT_GPUS} | given

    def resolve(lim: Limits) -> Resources:
        try:
            return resolve_resources(flavors, lim, flavor, **request)
        except ResourceError as e:
            where = e.field if e.field == "flavor" else f"resources.{e.field}"
            raise JobSpecError(where, str(e)) from None

    # the request itself first (syntax, then what the host can hold), the user's limits after
    res = resolve(Limits(cpus=math.inf, memory=sys.maxsize, gpus=sys.maxsize))
    if res.gpus > host_gpus:
        raise JobSpecError(
            "resources.gpus",
            f"{res.gpus} GPUs requested but this host has {host_gpus}",
        )
    return flavor, resolve(limits)


def _volumes(raw: Mapping, storage: StorageConfig | None, user: str) -> tuple[VolumeSpec, ...]:
    value = raw.get("volumes")
    if value is None or value == []:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise JobSpecError(
            "volumes", "volumes must be a list of strings such as 'bucket@store/prefix:/data:ro'"
        )
    if storage is None or not storage.stores:
        raise JobSpecError("volumes", "no object store is configured on this platform")
    try:
        return tuple(storage.user_volumes(user, value, workspace_dir=WORKSPACE_DIR))
    except VolumeError as e:
        raise JobSpecError("volumes", str(e)) from None


def _hang_restart(raw: Mapping, max_timeout: float) -> HangRestart:
    value = raw.get("hang_restart")
    if value is None:
        return HangRestart()
    if not isinstance(value, Mapping):
        raise JobSpecError(
            "hang_restart",
            'hang_restart must be an object such as {"enabled": true, "period": "30m"}',
        )
    unknown = sorted(set(value) - set(HANG_RESTART_FIELDS), key=str)
    if unknown:
        raise JobSpecError(
            f"hang_restart.{unknown[0]}",
            f"unknown field {unknown[0]!r}; hang_restart takes: {', '.join(HANG_RESTART_FIELDS)}",
        )
    enabled = value.get("enabled")
    period = value.get("period")
    return HangRestart(
        enabled=False if enabled is None else _boolean(enabled, "hang_restart.enabled"),
        period=DEFAULT_HANG_PERIOD
        if period is None
        else _duration(period, "hang_restart.period", MIN_HANG_PERIOD, max_timeout),
    )


# --- the parser --------------------------------------------------------------------------------


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
) -> JobSpec:
    """Turn a raw submission into a :class:`JobSpec` or raise :class:`JobSpecError`.

    Fields are checked in the order of :data:`JOB_SPEC_FIELDS`, so the first fault is reported.
    ``name`` may be absent (None): the caller then generates one. ``timeout`` defaults to 7 days
    (or ``max_timeout`` if lower) and may not exceed ``max_timeout``.
    """
    if not isinstance(raw, Mapping):
        raise JobSpecError("", "a job submission must be a JSON object")
    unknown = sorted(set(raw) - set(JOB_SPEC_FIELDS), key=str)
    if unknown:
        raise JobSpecError(
            str(unknown[0]),
            f"unknown field {unknown[0]!r}; a job takes: {', '.join(JOB_SPEC_FIELDS)}",
        )
    name = _name(raw)
    image, framework, version = _image(raw, catalog, allowed_images)
    command, args = _command(raw)
    env = _env(raw)
    labels = _labels(raw)
    flavor, resources = _resources(raw, flavors, limits, default_flavor, host_gpus)
    volumes = _volumes(raw, storage, user)
    timeout = (
        min(DEFAULT_TIMEOUT, max_timeout)
        if raw.get("timeout") is None
        else _duration(raw["timeout"], "timeout", 0.0, max_timeout)
    )
    retries = (
        0 if raw.get("retries") is None else _integer(raw["retries"], "retries", 0, MAX_RETRIES)
    )
    hang_restart = _hang_restart(raw, max_timeout)
    preemptible = (
        False if raw.get("preemptible") is None else _boolean(raw["preemptible"], "preemptible")
    )
    priority = (
        DEFAULT_PRIORITY
        if raw.get("priority") is None
        else _integer(raw["priority"], "priority", 0, MAX_PRIORITY)
    )
    return JobSpec(
        name=name,
        framework=framework,
        version=version,
        image=image,
        command=command,
        args=args,
        env=env,
        labels=labels,
        flavor=flavor,
        resources=resources,
        volumes=volumes,
        timeout=timeout,
        retries=retries,
        hang_restart=hang_restart,
        preemptible=preemptible,
        priority=priority,
    )


# --- JSON Schema -------------------------------------------------------------------------------

_DURATION_SCHEMA: dict[str, Any] = {
    "oneOf": [
        {"type": "number", "exclusiveMinimum": 0, "description": "seconds"},
        {
            "type": "string",
            "minLength": 1,
            "pattern": _DURATION_PATTERN,
            "examples": ["90s", "30m", "1h30m", "7d"],
        },
        {"type": "null"},
    ]
}

JOB_SPEC_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "Job submission",
    "description": "A training job: a container run to completion. Only `command` is required.",
    "type": "object",
    "additionalProperties": False,
    "required": ["command"],
    "properties": {
        "name": {
            "type": ["string", "null"],
            "pattern": r"^[a-z][a-z0-9-]*$",
            "maxLength": MAX_NAME,
            "description": "Lowercase letters, digits and '-', starting with a letter; "
            "generated when absent.",
        },
        "framework": {
            "type": ["string", "null"],
            "description": "Framework id from the catalog (default: the catalog's default).",
        },
        "version": {
            "type": ["string", "null"],
            "description": "Version id of the framework (default: its first version).",
        },
        "image": {
            "type": ["string", "null"],
            "description": "A catalog image or one of the admin's allowed images. Give it or "
            "`framework`/`version`, not both (unless they name this very image, as in a body "
            "returned by the API).",
        },
        "command": {
            "oneOf": [
                {"type": "string", "minLength": 1, "description": "run with sh -c"},
                {"type": "array", "items": {"type": "string"}, "minItems": 1},
            ],
            "description": "The program and its arguments, or one shell command line.",
        },
        "args": {"type": ["array", "null"], "items": {"type": "string"}},
        "env": {
            "type": ["object", "null"],
            "maxProperties": MAX_ENV,
            "propertyNames": {
                "pattern": _ENV_NAME_RE.pattern,
                "not": {
                    "anyOf": [{"pattern": f"^{p}"} for p in RESERVED_ENV_PREFIXES]
                    + [{"const": n} for n in sorted(RESERVED_ENV_NAMES)]
                },
            },
            "additionalProperties": {"type": "string", "maxLength": MAX_ENV_VALUE_BYTES},
            "description": "Environment variables (values at most 32 KiB in UTF-8); names "
            f"starting with {', '.join(RESERVED_ENV_PREFIXES)} are reserved.",
        },
        "labels": {
            "type": ["object", "null"],
            "maxProperties": MAX_LABELS,
            "propertyNames": {"pattern": _LABEL_KEY_RE.pattern},
            "additionalProperties": {"type": "string", "maxLength": MAX_LABEL_VALUE},
        },
        "flavor": {
            "type": ["string", "null"],
            "description": "A resource flavor; `resources` fields override its values.",
        },
        "resources": {
            "type": ["object", "null"],
            "additionalProperties": False,
            "properties": {
                "cpus": {
                    "type": ["number", "null"],
                    "exclusiveMinimum": 0,
                    "default": DEFAULT_CPUS,
                },
                "memory": {
                    "oneOf": [
                        {"type": "string", "examples": ["512M", "4G", "1.5GiB"]},
                        {"type": "integer", "exclusiveMinimum": 0, "description": "bytes"},
                        {"type": "null"},
                    ],
                    "default": DEFAULT_MEMORY,
                },
                "gpus": {"type": ["integer", "null"], "minimum": 0, "default": DEFAULT_GPUS},
            },
        },
        "volumes": {
            "type": ["array", "null"],
            "items": {"type": "string", "examples": ["datasets@s3/mnist:/data:ro"]},
            "description": "container@store[/prefix]:/mount/path[:ro|rw|rwd]",
        },
        "timeout": {
            **_DURATION_SCHEMA,
            "description": "Most the job may run (default 7 days).",
        },
        "retries": {
            "type": ["integer", "null"],
            "minimum": 0,
            "maximum": MAX_RETRIES,
            "default": 0,
            "description": "Restarts after a failure.",
        },
        "hang_restart": {
            "type": ["object", "null"],
            "additionalProperties": False,
            "properties": {
                "enabled": {"type": ["boolean", "null"], "default": False},
                "period": {
                    **_DURATION_SCHEMA,
                    "default": DEFAULT_HANG_PERIOD,
                    "description": "Seconds without progress before a restart (at least 10).",
                },
            },
        },
        "preemptible": {
            "type": ["boolean", "null"],
            "default": False,
            "description": "May run on idle GPUs beyond the owner's quota, and be preempted.",
        },
        "priority": {
            "type": ["integer", "null"],
            "minimum": 0,
            "maximum": MAX_PRIORITY,
            "default": DEFAULT_PRIORITY,
        },
    },
}
