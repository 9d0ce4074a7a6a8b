"""A training job's submission (pure): parsed into a :class:`JobSpec` or refused with a
:class:`JobSpecError` naming the field, and described as a JSON Schema.

- :mod:`.base`: the error, the defaults and caps, the paths, the rules parser and schema share;
- :mod:`.fields`: one parser per plain field (name, image, command, env, resources...);
- :mod:`.ports`, :mod:`.git`: the ``ports`` and ``git`` fields, with what they give a job;
- :mod:`.submission`: :class:`JobSpec` and :func:`parse_job_spec`, all fields together;
- :mod:`.schema`: the JSON Schema of a submission, served in the OpenAPI document.
"""

from .base import (
    DEFAULT_CPUS,
    DEFAULT_GPUS,
    DEFAULT_MEMORY,
    DEFAULT_TIMEOUT,
    HANG_RESTART_FIELDS,
    JOB_SPEC_FIELDS,
    MAX_PRIORITY,
    MAX_TIMEOUT,
    MAX_WORKERS,
    RESOURCE_FIELDS,
    WORKSPACE_DIR,
    JobSpecError,
)
from .fields import HangRestart, parse_command
from .git import GitSource
from .ports import Port
from .schema import JOB_SPEC_SCHEMA, job_spec_schema
from .submission import JobSpec, parse_job_spec

__all__ = [
    "DEFAULT_CPUS",
    "DEFAULT_GPUS",
    "DEFAULT_MEMORY",
    "DEFAULT_TIMEOUT",
    "HANG_RESTART_FIELDS",
    "JOB_SPEC_FIELDS",
    "JOB_SPEC_SCHEMA",
    "MAX_PRIORITY",
    "MAX_TIMEOUT",
    "MAX_WORKERS",
    "RESOURCE_FIELDS",
    "WORKSPACE_DIR",
    "GitSource",
    "HangRestart",
    "JobSpec",
    "JobSpecError",
    "Port",
    "job_spec_schema",
    "parse_command",
    "parse_job_spec",
]
