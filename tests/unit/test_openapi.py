"""The OpenAPI document stays true to the routes the service serves."""

from __future__ import annotations

import re

from gpulab.service.api.openapi import PATHS, document
from gpulab.service.app import ROUTES


def test_every_route_is_documented_and_every_documented_path_is_served():
    served = {path for path, _, _ in ROUTES}
    assert served == set(PATHS)


def test_documented_methods_exist_on_their_handlers():
    for path, _, handler in ROUTES:
        for method in PATHS[path]:
            assert method.upper() in handler.SUPPORTED_METHODS
            assert getattr(handler, method) is not getattr(handler.__mro__[-2], method, None), (
                path,
                method,
            )


def test_patterns_match_their_documented_paths():
    samples = {"{job_id}": "j0123abcd", "{user}": "ann", "{server}": "nb", "{action}": "rerun"}
    for path, pattern, _ in ROUTES:
        concrete = path
        for k, v in samples.items():
            concrete = concrete.replace(k, v)
        assert re.fullmatch(pattern, concrete.lstrip("/")), (path, pattern)


def test_document_shape():
    doc = document()
    assert doc["openapi"].startswith("3.")
    assert doc["components"]["schemas"]["JobSubmission"]["properties"]["command"]
