"""Sample settings for notebook options: the default catalog and flavors, a user's limits."""

from __future__ import annotations

from gpulab.frameworks import Catalog
from gpulab.resources import Flavor, Limits, parse_memory
from gpulab.settings import DEFAULT_EDITORS, DEFAULT_FLAVORS, DEFAULT_FRAMEWORKS

CATALOG = Catalog.from_config(DEFAULT_FRAMEWORKS, DEFAULT_EDITORS)
FLAVORS = {f["id"]: Flavor.from_config(f) for f in DEFAULT_FLAVORS}
LIMITS = Limits(cpus=2, memory=parse_memory("8G"), gpus=1)
