"""The REST API keeps the contract of its OpenAPI document under a contract fuzzer.

schemathesis loads the document from a real hub's gpulab service and runs every operation
with every check it has on (not only "no server error"): documented status codes, content
types, headers and bodies; schema-valid data accepted and schema-invalid data refused;
requests without credentials refused; JSON 405 (with Allow) for methods a path does not serve.
"""

from __future__ import annotations

import json
import time

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi import checks as openapi_checks

from gpulab.jobs.spec.schema import DURATION_FORMAT, SIZE_FORMAT

from ..support.hub import ENDED

pytestmark = [pytest.mark.docker, pytest.mark.hub]

CONFIG = """
c.GpulabSettings.gpu_devices = [{"id": "0"}, {"id": "1"}]
c.GpulabSettings.gpu_mode = "env"
c.GpulabSettings.supervisor_interval = 0.2
# every job the fuzzer submits ends FAILED (IMAGE_MISSING) before any container is made
c.GpulabSettings.frameworks = [
    {"id": "absent", "title": "Absent", "editors": ["jupyterlab"],
     "versions": [{"id": "1", "image": "gpulab-test/absent:1"},
                  {"id": "2", "image": "gpulab-test/absent:2"}]},
    {"id": "missing", "title": "Missing", "editors": ["jupyterlab"],
     "versions": [{"id": "1", "image": "gpulab-test/missing:1"}]},
]
c.GpulabSettings.allowed_images = ["gpulab-test/other:1"]
# no object store: the document says "no volumes" (grants and mount paths are beyond a schema)
c.GpulabSettings.object_stores = {}
c.GpulabSettings.workspace_store = ""
c.GpulabSettings.volume_grants = []
# no git sources: whether a URL's last part can name a directory, and paths unique among the
# repositories, are beyond a schema too (tests/unit/test_jobs_git.py fuzzes the field alone)
c.GpulabSettings.job_git_sources = False
"""

# the document's custom formats: strings whose value range a pattern cannot say. Values the
# fuzzer sends in valid requests, within every field's range here (time-outs up to 30 days and
# hang periods from 10 s; memory from 32M up to the default limit, 16G)
DURATIONS = st.one_of(
    st.integers(10, 86400).map(str),
    st.builds("{}{}".format, st.integers(10, 600), st.sampled_from(["s", "m", "h", "S", "M"])),
    st.sampled_from(["1h30m", "1d", " 2h ", "1d 2h 3m 4s", "1.5h", "90.5"]),
)
SIZES = st.one_of(
    st.builds("{}{}".format, st.integers(32, 4096), st.sampled_from(["M", "m", "MiB", "MB"])),
    st.sampled_from(["1G", "1.5GiB", "4g", " 2G ", "33554432", "16G"]),
)
schemathesis.openapi.format(DURATION_FORMAT, DURATIONS)
schemathesis.openapi.format(SIZE_FORMAT, SIZES)

#: examples per operation in the fuzzing phase (the coverage phase adds its own, bounded ones)
MAX_EXAMPLES = 25
#: scenarios of the stateful phase (each up to 6 linked calls)
STATEFUL_EXAMPLES = 20

load_all_checks()
ALL_CHECKS = CHECKS.get_all()


@pytest.fixture(scope="module")
def hub(hub_with):
    return hub_with(CONFIG)


@pytest.fixture(scope="module")
def auth(hub) -> dict[str, str]:
    return {"Authorization": f"token {hub.create_user('fuzz')}"}


@pytest.fixture(scope="module")
def api_schema(hub, auth):
    config = SchemathesisConfig.from_dict(
        {
            "seed": 20240612,
            "base-url": f"{hub.url}/services/gpulab",
            "headers": auth,
            "checks": {"enabled": True},
            "generation": {
                "max-examples": MAX_EXAMPLES,
                "deterministic": True,
                "database": "none",
                "mode": "all",
            },
            "phases": {
                "examples": {"enabled": True},
                "coverage": {"enabled": True},
                "fuzzing": {"enabled": True},
                "stateful": {"enabled": True},
            },
        }
    )
    return schemathesis.openapi.from_url(
        f"{hub.url}/services/gpulab/api/openapi.json", config=config, headers=auth, timeout=30
    )


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.fixture(autouse=True)
def _node_id(request):
    # schemathesis 4.32's lazy loader reads Node._nodeid, which pytest 9 no longer has
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid


@schema.parametrize()
def test_every_operation_keeps_the_contract(case):
    """Examples, coverage (boundaries, every negation, missing credentials, undeclared
    methods) and fuzzing phases, positive and negative data, every check."""
    case.call_and_validate(checks=ALL_CHECKS, timeout=30)


def test_workflows_keep_the_contract(api_schema, hub, auth):
    """Stateful: submit jobs, then read, act on and delete them through the document's links;
    use_after_free and ensure_resource_availability watch what a delete or a submit left."""
    workflow = api_schema.as_state_machine()

    class Checked(workflow):
        def after_call(self, response, case):
            """Every job an answer shows unended (submitted, rerun, resumed, asked to stop) is
            waited for until it ended. The state machine's next steps follow from its answers'
            status codes (which links open), and Hypothesis replays a scenario's prefix
            expecting the same steps: an interrupt answered 200 (still QUEUED), 202 (started)
            or 409 (already FAILED) as the supervisor happened to be quick or not made the
            scenarios differ between replays (FlakyStrategyDefinition)."""
            super().after_call(response, case)
            try:
                job = response.json()
            except ValueError:
                return
            if isinstance(job, dict) and "id" in job and job.get("state") not in (None, *ENDED):
                _until_ended(hub, auth, job["id"])

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            case.validate_response(
                response,
                checks=ALL_CHECKS,
                additional_checks=additional_checks,
                transport_kwargs=kwargs or None,
                recorder=getattr(self, "recorder", None),
            )

    Checked.run(
        settings=settings(
            max_examples=STATEFUL_EXAMPLES,
            stateful_step_count=6,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
    )


def _until_ended(hub, auth: dict, job_id: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = requests.get(f"{hub.url}/services/gpulab/api/jobs/{job_id}", headers=auth, timeout=30)
        if r.status_code == 404 or r.json()["state"] in ENDED:
            return
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not end within {timeout:g} s")


def test_every_check_is_on():
    names = {c.__name__ for c in ALL_CHECKS}
    assert names >= {
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
        "response_schema_conformance",
        "negative_data_rejection",
        "positive_data_acceptance",
        "missing_required_header",
        "unsupported_method",
        "allow_header_conformance",
        "use_after_free",
        "ensure_resource_availability",
        "ignored_auth",
    }


def _conforms(case, response) -> None:
    case.validate_response(
        response,
        checks=[
            openapi_checks.status_code_conformance,
            openapi_checks.content_type_conformance,
            openapi_checks.response_schema_conformance,
            openapi_checks.response_headers_conformance,
        ],
    )


def test_an_oversized_body_is_a_documented_json_413(api_schema, hub, auth):
    """Beyond what a fuzzer sends: a body over the cap (1 MiB), declared or chunked."""
    op = api_schema["/api/jobs"]["POST"]
    case = op.Case(body={"command": "x" * (1024 * 1024 + 1)})
    r = case.call(timeout=60)
    assert r.status_code == 413 and r.json()["field"] == "body", r.text
    _conforms(case, r)
    chunks = iter([b'{"command": "', b"x" * (1024 * 1024 + 1), b'"}'])
    r = requests.post(
        f"{hub.url}/services/gpulab/api/jobs",
        data=chunks,
        headers={**auth, "Content-Type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 413 and r.json()["status"] == 413, r.text


def test_unknown_methods_are_json_405_with_allow(hub, auth):
    base = f"{hub.url}/services/gpulab/api"
    for method, path, allow in [
        ("PUT", "/jobs", "GET, POST"),
        ("PATCH", "/jobs/abc", "GET, DELETE"),
        ("DELETE", "/health", "GET"),
        ("POST", "/openapi.json", "GET"),
    ]:
        r = requests.request(method, base + path, headers=auth, timeout=30)
        assert r.status_code == 405, (method, path, r.text)
        assert r.headers["Allow"] == allow and r.headers["Content-Type"] == "application/json"
        assert r.json()["status"] == 405 and allow in r.json()["message"]


def test_the_document_is_the_callers(hub, auth):
    """With a token, the submission schema holds the caller's limits; the secret stays out."""
    url = f"{hub.url}/services/gpulab/api/openapi.json"
    mine = requests.get(url, headers=auth, timeout=30).json()
    anyone = requests.get(url, timeout=30).json()
    sub = mine["components"]["schemas"]["JobSubmission"]
    assert sub["properties"]["framework"]["enum"][:2] == ["absent", "missing"]
    assert sub["properties"]["volumes"]["maxItems"] == 0
    assert sub["properties"]["resources"]["properties"]["gpus"]["maximum"] == 2
    assert anyone["paths"] == mine["paths"]
    token = auth["Authorization"].split()[-1]
    assert token not in json.dumps(mine)
