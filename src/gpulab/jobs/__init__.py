"""Training jobs: the pure core (submission validation, placement, billing, durations).

No I/O here: the service and the CLI build on these. See DOMAIN.md, "Training jobs".
"""

from ..billing import billed_minutes, billed_time
from ..durations import DurationError, format_duration, parse_duration
from ..resources import Quota, quota_for
from .scheduler import (
    ActiveJob,
    Placement,
    Plan,
    QueuedJob,
    can_ever_fit,
    plan,
)
from .spec import JOB_SPEC_SCHEMA, HangRestart, JobSpec, JobSpecError, parse_job_spec

__all__ = [
    "JOB_SPEC_SCHEMA",
    "ActiveJob",
    "DurationError",
    "HangRestart",
    "JobSpec",
    "JobSpecError",
    "Placement",
    "Plan",
    "QueuedJob",
    "Quota",
    "billed_minutes",
    "billed_time",
    "can_ever_fit",
    "format_duration",
    "parse_duration",
    "parse_job_spec",
    "plan",
    "quota_for",
]
