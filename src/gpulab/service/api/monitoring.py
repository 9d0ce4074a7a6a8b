"""What monitoring reads: the service's liveness, and Prometheus' metrics (not JSON: kept out
of the OpenAPI document, like JupyterHub's /hub/metrics)."""

from __future__ import annotations

import asyncio

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from ..base import METRICS, BaseHandler, JsonErrors, authenticated


class HealthHandler(JsonErrors):
    def get(self):
        self.finish({"status": "ok"})


class MetricsHandler(BaseHandler):
    """Prometheus metrics (gpulab/metrics.py), for tokens with ``custom:gpulab:metrics``."""

    @authenticated
    async def get(self):
        self.require(METRICS)
        body = await asyncio.to_thread(generate_latest, REGISTRY)  # the collector reads the DB
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(body)
