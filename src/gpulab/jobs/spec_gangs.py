"""How many workers a distributed job may have, as JSON Schema branches of the served job
spec schema (:func:`gpulab.jobs.spec_schema.job_spec_schema`): by the GPUs per worker, the
workers the nodes hold at once and the caller's quota."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..resources import Flavor
from .spec_fields import DEFAULT_GPUS, MAX_WORKERS
from .spec_values import ABSENT_TEXT


def gang_branches(
    flavors: Mapping[str, Flavor],
    gpus_any: int,
    quota_gpus: int | None,
    quota_jobs: int | None,
    slots: Mapping[int, int],
) -> list[dict[str, Any]]:
    """How many workers a distributed job may have, by its GPUs per worker ``g`` (given in
    ``resources.gpus``, else its flavor's, else the default): at most ``slots[g]`` (workers
    of ``g`` GPUs the nodes hold at once) and, unless preemptible, ``quota_gpus // g``."""
    one = {"properties": {"workers": {"enum": [1, None]}}}
    out: list[dict[str, Any]] = [one]
    for g in range(gpus_any + 1):
        ways = [
            {
                "properties": {
                    "resources": {
                        "type": "object",
                        "properties": {"gpus": {"const": g}},
                        "required": ["gpus"],
                    }
                },
                "required": ["resources"],
            }
        ]
        absent = {
            "anyOf": [
                {"not": {"required": ["resources"]}},
                {
                    "properties": {
                        "resources": {
                            "anyOf": [
                                {"type": "null"},
                                {"properties": {"gpus": {"type": "null"}}},
                                {"not": {"required": ["gpus"]}},
                            ]
                        }
                    }
                },
            ]
        }
        named = [f.id for f in flavors.values() if f.resources.gpus == g]
        if named:
            ways.append(
                {
                    "allOf": [
                        absent,
                        {"properties": {"flavor": {"enum": named}}, "required": ["flavor"]},
                    ]
                }
            )
        if g == DEFAULT_GPUS:
            ways.append({"allOf": [absent, {"properties": {"flavor": {"enum": ABSENT_TEXT}}}]})
        most = MAX_WORKERS if g == 0 else min(MAX_WORKERS, slots.get(g, 0))
        in_quota = most if g == 0 or quota_gpus is None else min(most, quota_gpus // g)
        if quota_jobs == 0:  # nothing runs in quota: only preemptible jobs are accepted
            in_quota = 0
        kinds = [({"enum": [False, None]}, in_quota), ({"const": True}, most)]
        if in_quota == most:
            kinds = [(None, most)]
        for preemptible, high in kinds:
            if high < 2:
                continue
            branch: dict[str, Any] = {
                "properties": {"workers": {"type": "integer", "minimum": 2, "maximum": high}},
                "required": ["workers"],
                "anyOf": ways,
            }
            if preemptible is not None:
                branch["properties"]["preemptible"] = preemptible
                if preemptible.get("const") is True:
                    branch["required"].append("preemptible")
            out.append(branch)
    return out
