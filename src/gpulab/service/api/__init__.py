"""The service's REST API under ``/services/gpulab/api/``: jobs, their logs, exec and shell,
ports, secrets, notebooks, usage, monitoring, and the OpenAPI document that describes it.

Each handler reads its input, calls one domain function (:mod:`gpulab.jobs.actions`,
:mod:`gpulab.notebooks.data`, ...) and writes the answer; what every handler shares (identity,
scopes, JSON errors, the body cap) is :mod:`gpulab.service.base`."""
