"""Job specs parsed against sample settings (the default catalog and flavors, a user's limits,
two stores): what the unit tests of job submission share."""

from __future__ import annotations

import pytest

from gpulab.frameworks import Catalog
from gpulab.jobs.spec import JobSpecError, parse_job_spec
from gpulab.resources import Flavor, Limits, parse_memory
from gpulab.settings import DEFAULT_EDITORS, DEFAULT_FLAVORS, DEFAULT_FRAMEWORKS
from gpulab.storage import StorageConfig

CATALOG = Catalog.from_config(DEFAULT_FRAMEWORKS, DEFAULT_EDITORS)
FLAVORS = {f["id"]: Flavor.from_config(f) for f in DEFAULT_FLAVORS}
LIMITS = Limits(cpus=4, memory=parse_memory("16G"), gpus=2)
STORAGE = StorageConfig.from_config(
    {
        "s3": {"endpoint_url": "http://127.0.0.1:9000"},
        "local": {"kind": "filesystem", "root": "/srv/objects"},
    },
    [
        {"store": "s3", "bucket": "datasets", "modes": ["ro"]},
        {"store": "s3", "bucket": "team", "prefix": "vision", "users": ["ann"]},
    ],
    "local",
)


def parse(raw, **kw):
    args = {
        "catalog": CATALOG,
        "flavors": FLAVORS,
        "limits": LIMITS,
        "host_gpus": 4,
        "storage": STORAGE,
        "user": "ann",
    } | kw
    return parse_job_spec(raw, **args)


def refused(raw, field, words="", **kw):
    with pytest.raises(JobSpecError) as e:
        parse(raw, **kw)
    assert e.value.field == field, str(e.value)
    assert words in str(e.value)
    return str(e.value)
