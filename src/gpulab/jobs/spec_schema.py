"""The JSON Schema (draft 2020-12) of a job submission, for the service's OpenAPI document.

It says what :func:`gpulab.jobs.spec.parse_job_spec` accepts, caps included; a unit test keeps
the two in step (fields, and examples both must accept or refuse).
"""

from __future__ import annotations

from typing import Any

from ..bounds import (
    MAX_COMMAND_BYTES,
    MAX_COMMAND_ITEMS,
    MAX_CPUS,
    MAX_ENV,
    MAX_ENV_BYTES,
    MAX_ENV_NAME_CHARS,
    MAX_ENV_VALUE_BYTES,
    MAX_GPUS,
    MAX_ID_CHARS,
    MAX_IMAGE_CHARS,
    MAX_LABEL_KEY_CHARS,
    MAX_LABEL_VALUE_CHARS,
    MAX_LABELS,
    MAX_MEMORY,
    MAX_NAME_CHARS,
    MAX_NUMBER_CHARS,
    MAX_VOLUME_SPEC_CHARS,
    MAX_VOLUMES,
    MIN_CPUS,
    MIN_MEMORY,
    size_text,
)
from ..resources import format_memory
from .spec_fields import (
    _DURATION_PATTERN,
    _ENV_NAME_RE,
    _LABEL_KEY_RE,
    DEFAULT_CPUS,
    DEFAULT_GPUS,
    DEFAULT_HANG_PERIOD,
    DEFAULT_MEMORY,
    DEFAULT_PRIORITY,
    MAX_PRIORITY,
    MAX_RETRIES,
    RESERVED_ENV_NAMES,
    RESERVED_ENV_PREFIXES,
)

__all__ = ["JOB_SPEC_SCHEMA"]

_DURATION_SCHEMA: dict[str, Any] = {
    "oneOf": [
        {"type": "number", "exclusiveMinimum": 0, "description": "seconds"},
        {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_NUMBER_CHARS,
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
            "maxLength": MAX_NAME_CHARS,
            "description": "Lowercase letters, digits and '-', starting with a letter; "
            "generated when absent.",
        },
        "framework": {
            "type": ["string", "null"],
            "maxLength": MAX_ID_CHARS,
            "description": "Framework id from the catalog (default: the catalog's default).",
        },
        "version": {
            "type": ["string", "null"],
            "maxLength": MAX_ID_CHARS,
            "description": "Version id of the framework (default: its first version).",
        },
        "image": {
            "type": ["string", "null"],
            "maxLength": MAX_IMAGE_CHARS,
            "description": "A catalog image or one of the admin's allowed images. Give it or "
            "`framework`/`version`, not both (unless they name this very image, as in a body "
            "returned by the API).",
        },
        "command": {
            "oneOf": [
                {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": MAX_COMMAND_BYTES,
                    "description": "run with sh -c",
                },
                {
                    "type": "array",
                    "items": {"type": "string"},
                    "minItems": 1,
                    "maxItems": MAX_COMMAND_ITEMS,
                },
            ],
            "description": "The program and its arguments, or one shell command line. With "
            f"`args`: at most {MAX_COMMAND_ITEMS} entries and {size_text(MAX_COMMAND_BYTES)} "
            "in UTF-8 together.",
        },
        "args": {
            "type": ["array", "null"],
            "items": {"type": "string"},
            "maxItems": MAX_COMMAND_ITEMS,
        },
        "env": {
            "type": ["object", "null"],
            "maxProperties": MAX_ENV,
            "propertyNames": {
                "pattern": _ENV_NAME_RE.pattern,
                "maxLength": MAX_ENV_NAME_CHARS,
                "not": {
                    "anyOf": [{"pattern": f"^{p}"} for p in RESERVED_ENV_PREFIXES]
                    + [{"const": n} for n in sorted(RESERVED_ENV_NAMES)]
                },
            },
            "additionalProperties": {"type": "string", "maxLength": MAX_ENV_VALUE_BYTES},
            "description": f"Environment variables (values at most "
            f"{size_text(MAX_ENV_VALUE_BYTES)} in UTF-8, names and values at most "
            f"{size_text(MAX_ENV_BYTES)} together); names starting with "
            f"{', '.join(RESERVED_ENV_PREFIXES)} are reserved.",
        },
        "labels": {
            "type": ["object", "null"],
            "maxProperties": MAX_LABELS,
            "propertyNames": {"pattern": _LABEL_KEY_RE.pattern, "maxLength": MAX_LABEL_KEY_CHARS},
            "additionalProperties": {"type": "string", "maxLength": MAX_LABEL_VALUE_CHARS},
        },
        "flavor": {
            "type": ["string", "null"],
            "maxLength": MAX_ID_CHARS,
            "description": "A resource flavor; `resources` fields override its values.",
        },
        "resources": {
            "type": ["object", "null"],
            "additionalProperties": False,
            "properties": {
                "cpus": {
                    "type": ["number", "null"],
                    "minimum": MIN_CPUS,
                    "maximum": MAX_CPUS,
                    "default": DEFAULT_CPUS,
                },
                "memory": {
                    "oneOf": [
                        {
                            "type": "string",
                            "maxLength": MAX_NUMBER_CHARS,
                            "examples": ["512M", "4G", "1.5GiB"],
                        },
                        {
                            "type": "integer",
                            "minimum": MIN_MEMORY,
                            "maximum": MAX_MEMORY,
                            "description": "bytes",
                        },
                        {"type": "null"},
                    ],
                    "default": DEFAULT_MEMORY,
                    "description": f"At least {format_memory(MIN_MEMORY)}.",
                },
                "gpus": {
                    "type": ["integer", "null"],
                    "minimum": 0,
                    "maximum": MAX_GPUS,
                    "default": DEFAULT_GPUS,
                },
            },
        },
        "volumes": {
            "type": ["array", "null"],
            "maxItems": MAX_VOLUMES,
            "items": {
                "type": "string",
                "maxLength": MAX_VOLUME_SPEC_CHARS,
                "examples": ["datasets@s3/mnist:/data:ro"],
            },
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
