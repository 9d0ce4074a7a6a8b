"""The REST API keeps the contract of its OpenAPI document under a contract fuzzer.

schemathesis loads the document from a real hub's gpulab service and runs every operation
with every check it has on (not only "no server error"): documented status codes, content
types, headers and bodies; schema-valid data accepted and schema-invalid data refused;
requests without credentials refused; JSON 405 (with Allow) for methods a path does not serve.

Its budget (measured on 2 idle cores; about twice as long in CI, beside the other worker):
~65 s, of which 9 s start its hub, ~50 s run the operations (~1,600 requests: about 1,000 cases
of the coverage phase, MAX_EXAMPLES fuzzed ones per operation and mode, ~100 probes of
ignored_auth) and 4 s the workflows. Nearly all of it is the fuzzer's own CPU (the hub and the
service use ~9 s): preparing the strategies of the two large bodies (POST /api/jobs ~20 s, its
exec ~9 s: schemathesis canonicalizes each branch of the submission schema, once) and building
the coverage phase's cases. A fuzzed example past the first few costs ~10 ms, so fewer of them
would save little and prove less: MAX_EXAMPLES stays at 25. No request starts a container
(CONFIG: every image is absent, so a job ends FAILED before one is made).
"""

from __future__ import annotations

import json
import posixpath
import re
import time
from urllib.parse import quote

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi import checks as openapi_checks

from gpulab.bounds import (
    MAX_COMMAND_BYTES,
    MAX_COMMAND_ITEMS,
    MAX_ENV_BYTES,
    MAX_ENV_VALUE_BYTES,
    MAX_REQUEST_BODY,
)
from gpulab.jobs.spec.array import MAX_PARAMETER_SET_BYTES, MAX_PARAMETERS_BYTES
from gpulab.jobs.spec.git import default_path
from gpulab.jobs.spec.schema import DURATION_FORMAT, SIZE_FORMAT

from ..support.hub import ENDED

pytestmark = [pytest.mark.docker, pytest.mark.hub]

CONFIG = """
c.GpulabSettings.gpu_devices = [{"id": "0"}, {"id": "1"}]
c.GpulabSettings.gpu_mode = "env"
c.GpulabSettings.supervisor_interval = 0.2
# a fuzzed job array has at most 3 tasks (the default 1,000 would be a thousand jobs a case)
c.GpulabSettings.max_job_tasks = 3
# every job the fuzzer submits ends FAILED (IMAGE_MISSING) before any container is made
c.GpulabSettings.frameworks = [
    {"id": "absent", "title": "Absent", "editors": ["jupyterlab"],
     "versions": [{"id": "1", "image": "gpulab-test/absent:1"},
                  {"id": "2", "image": "gpulab-test/absent:2"}]},
    {"id": "missing", "title": "Missing", "editors": ["jupyterlab"],
     "versions": [{"id": "1", "image": "gpulab-test/missing:1"}]},
]
c.GpulabSettings.allowed_images = ["gpulab-test/other:1"]
# volumes: the embedded store ("local") with the caller's workspace and grants of every kind
# (whole buckets, a prefix, one user's, some modes only), which the document writes as one
# pattern; a second store that nothing is granted on
c.GpulabSettings.object_stores["other"] = {
    "kind": "filesystem", "root": c.GpulabSettings.object_stores["local"]["root"] + "-other"}
c.GpulabSettings.volume_grants = [
    {"store": "local", "bucket": "shared", "modes": ["ro"]},
    {"store": "local", "bucket": "scratch"},
    {"store": "local", "bucket": "team", "prefix": "vision", "users": ["fuzz"],
     "modes": ["rw", "rwd"]},
    {"store": "local", "bucket": "team", "prefix": "audio", "users": ["someone-else"]},
    {"store": "local", "bucket": "gpulab-workspaces", "prefix": "public/data"},
]
c.GpulabSettings.job_git_sources = True
# no sync helper image: a volume's pull and a repository's clone fail at once (PULL_FAILED,
# GIT_FAILED), before any helper container is made
c.GpulabSettings.sync_image = "gpulab-test/absent-sync:1"
"""

# the document's custom formats: strings whose value range a pattern cannot say. Values the
# fuzzer sends in valid requests, within every field's range here (time-outs up to 30 days and
# hang periods from 10 s; memory from 32M up to the default limit, 16G)
DURATIONS = st.one_of(
    # from 60: the shortest auto_delete_after (a minute) and every other duration's least
    st.integers(60, 86400).map(str),
    st.builds("{}{}".format, st.integers(60, 600), st.sampled_from(["s", "m", "h", "S", "M"])),
    st.sampled_from(["1h30m", "1d", " 2h ", "1d 2h 3m 4s", "1.5h", "90.5"]),
)
SIZES = st.one_of(
    st.builds("{}{}".format, st.integers(32, 4096), st.sampled_from(["M", "m", "MiB", "MB"])),
    st.sampled_from(["1G", "1.5GiB", "4g", " 2G ", "33554432", "16G"]),
)
schemathesis.openapi.format(DURATION_FORMAT, DURATIONS)
schemathesis.openapi.format(SIZE_FORMAT, SIZES)

#: examples per operation and mode (positive, negative) in the fuzzing phase. The coverage
#: phase before it already sends every field's boundaries and negations, deterministically;
#: the fuzzing phase adds random combinations. 10 instead of 25 took the module from 76 s to
#: 55 s alone here (CPU: schemathesis's generation and the service's answers), and CI time is
#: the suite's tightest limit.
MAX_EXAMPLES = 10
#: scenarios of the stateful phase (each up to 6 linked calls)
STATEFUL_EXAMPLES = 20

load_all_checks()
ALL_CHECKS = CHECKS.get_all()


@pytest.fixture(scope="module")
def hub(hub_with):
    return hub_with(CONFIG)


@pytest.fixture(scope="module")
def auth(hub) -> dict[str, str]:
    """The fuzzer's token. (It has no secret when the document is read: a secret the
    fuzzer's own calls can list, replace and delete is state that made the stateful phase's
    replays differ, FlakyStrategyDefinition; test_the_document_is_the_callers has one.)"""
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
    methods) and fuzzing phases, positive and negative data, every check; except that a
    body within the schema that breaks a rule no JSON Schema can state (below) may be
    refused: positive_data_acceptance is left out for exactly that request."""
    case.call_and_validate(checks=checks_for(case), timeout=30)


def checks_for(case) -> list:
    """Every check, but positive_data_acceptance for a positive request beyond the schema."""
    meta = case.meta
    if meta is not None and meta.generation.mode.is_positive and beyond_the_schema(case):
        return [c for c in ALL_CHECKS if c.__name__ != "positive_data_acceptance"]
    return ALL_CHECKS


def beyond_the_schema(case) -> str | None:
    """The rule a request body breaks that JSON Schema cannot state, or None. Each is
    written in the operation's description (the schema's) and refused with a 400 naming the
    field: sums over several fields or entries, UTF-8 bytes where a cap counts them (a
    schema's maxLength counts characters), and what one list entry is to another (JSON
    Schema's uniqueItems compares whole entries, not one field of them)."""
    if (case.query or {}).get("cursor") is not None:
        return "cursor: one this service gave (a previous page's next)"
    body = case.body
    if not isinstance(body, dict):
        return None
    if _utf8(json.dumps(body, ensure_ascii=False)) > MAX_REQUEST_BODY:
        return "the body's size (a 413)"
    op = case.operation.definition.raw.get("operationId")
    if op == "putSecret":
        value = body.get("value")
        too_long = isinstance(value, str) and _utf8(value) > MAX_ENV_VALUE_BYTES
        return "value: its bytes" if too_long else None
    if op not in ("submitJob", "execInJob"):
        return None
    words = _command_words(body.get("command"))
    args = body.get("args") if op == "submitJob" else None
    words += [a for a in args or () if isinstance(a, str)]
    if len(words) > MAX_COMMAND_ITEMS or sum(_utf8(w) + 1 for w in words) > MAX_COMMAND_BYTES:
        return "command and args together"
    if op == "execInJob":
        return None
    env = body.get("env")
    if isinstance(env, list):
        entries = [e for e in env if isinstance(e, dict) and isinstance(e.get("name"), str)]
        if len(entries) != len({e["name"] for e in entries}):
            return "env: a name given twice"
        env = {e["name"]: e.get("value", e.get("secret")) for e in entries}
    if isinstance(env, dict):
        texts = {k: v for k, v in env.items() if isinstance(v, str)}
        if any(_utf8(v) > MAX_ENV_VALUE_BYTES for v in texts.values()):
            return "env: a value's bytes"
        # (a secret's name counts too, as the parser counts it)
        refs = [v.get("secret") if isinstance(v, dict) else v for v in env.values()]
        sizes = [_utf8(v) if isinstance(v, str) else 0 for v in refs]
        if sum(len(str(k)) + 1 for k in env) + sum(sizes) > MAX_ENV_BYTES:
            return "env: names and values together"
    array = _array_rule(body)
    if array:
        return array
    ports = [p for p in body.get("ports") or () if isinstance(p, dict)]
    for key in ("name", "port"):
        seen = [json.dumps(_whole(p.get(key))) for p in ports]
        if len(seen) != len(set(seen)):
            return f"ports: a {key} given twice"
    mounts = _mounts(body.get("volumes") or ())
    if _overlapping(mounts):
        return "volumes: the same or nested mount paths"
    paths = []
    for entry in body.get("git") or ():
        if isinstance(entry, dict) and isinstance(entry.get("url"), str):
            paths.append(entry.get("path") or _default_path(entry["url"]))
    if _overlapping(paths):
        return "git: the same or nested paths"
    if set(paths) & set(mounts):
        return "git: a path that is also a volume's mount"
    return None


def _array_rule(body: dict) -> str | None:
    """A job array's rules beyond the schema: completions against the parameter sets,
    parallelism against the tasks, keys that differ only in case, a set's and the list's
    size as JSON."""
    completions, parallelism = _whole(body.get("completions")), _whole(body.get("parallelism"))
    sets = body.get("parameters")
    n = len(sets) if isinstance(sets, list) else None
    if n is not None and completions is not None and completions != n:
        return "completions: not the number of parameter sets"
    tasks = completions if completions is not None else n
    if parallelism is not None and (tasks is None or parallelism > tasks):
        return "parallelism: over the tasks, or without an array"
    for entry in sets or ():
        if isinstance(entry, dict):
            if len({str(k).upper() for k in entry}) != len(entry):
                return "parameters: keys that differ only in case"
            if len(json.dumps(entry).encode()) > MAX_PARAMETER_SET_BYTES:
                return "parameters: a set's size"
    if n and len(json.dumps(sets).encode()) > MAX_PARAMETERS_BYTES:
        return "parameters: the list's size"
    return None


def _default_path(url: str) -> str:
    try:
        return default_path(url) or ""
    except ValueError:  # (not a URL urlsplit takes: refused for that, within the schema)
        return ""


def _whole(value):
    """45.0 as 45, as the parser reads a whole number."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _utf8(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _command_words(command) -> list[str]:
    if isinstance(command, str):
        return ["sh", "-c", command]
    return [w for w in command or () if isinstance(w, str)]


def _mounts(specs) -> list[str]:
    """Each volume's mount path as the parser normalizes it."""
    out = []
    for spec in specs:
        if isinstance(spec, str) and ":" in spec:
            mount = spec.strip().split(":")[1]
            out.append(posixpath.normpath("/" + mount.lstrip("/")))
    return out


def _overlapping(paths: list[str]) -> bool:
    return any(
        a == b or b.startswith(a.rstrip("/") + "/")
        for i, a in enumerate(paths)
        for j, b in enumerate(paths)
        if i != j
    )


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

        def setup(self):
            """Every scenario starts with none of the fuzzer's secrets: a secret one scenario
            (or the test before) stored changed what GET /api/secrets answered the next, and
            so which secret a later DELETE drew (FlakyStrategyDefinition on a replay)."""
            super().setup()
            base = f"{hub.url}/services/gpulab/api/secrets"
            listed = requests.get(base, headers=auth, timeout=30)
            for secret in listed.json().get("secrets", []) if listed.ok else []:
                name = quote(secret["name"], safe="")
                requests.delete(f"{base}/{name}", headers=auth, timeout=30)

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            case.validate_response(
                response,
                checks=checks_for(case),
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
    # the caller's grants and workspace; without a token, what everyone may mount
    volumes = re.compile(sub["properties"]["volumes"]["items"]["pattern"])
    theirs = re.compile(
        anyone["components"]["schemas"]["JobSubmission"]["properties"]["volumes"]["items"][
            "pattern"
        ]
    )
    for spec, mine_too, anyones in [
        ("team@local/vision/a:/data:rw", True, False),
        ("team@local/vision/a:/data", False, False),  # (ro: not granted)
        ("team@local/audio:/data:rw", False, False),
        ("gpulab-workspaces@local/workspaces/fuzz/p:/data:rwd", True, False),
        ("gpulab-workspaces@local/workspaces/else:/data", False, False),
        ("gpulab-workspaces@local/public/data/x:/data:rw", True, True),
        ("shared@local:/d", True, True),
        ("shared@local:/d:rw", False, False),
        ("scratch@other:/d", False, False),
        ("scratch@local:/d\n:rw", False, False),
    ]:
        assert (volumes.search(spec) is not None, theirs.search(spec) is not None) == (
            mine_too,
            anyones,
        ), spec
    assert sub["properties"]["resources"]["properties"]["gpus"]["maximum"] == 2
    assert anyone["paths"] == mine["paths"]
    token = auth["Authorization"].split()[-1]
    assert token not in json.dumps(mine)
    # the names of the caller's secrets (their env and git entries may refer to them), to
    # them only
    owner = {"Authorization": f"token {hub.create_user('keeper')}"}
    r = requests.put(
        f"{hub.url}/services/gpulab/api/secrets/wandb-key",
        json={"value": "s3cret"},
        headers=owner,
        timeout=30,
    )
    assert r.status_code == 201, r.text
    theirs = requests.get(url, headers=owner, timeout=30).json()["components"]["schemas"]
    env = theirs["JobSubmission"]["properties"]["env"]["oneOf"][0]["additionalProperties"]
    assert env["oneOf"][1]["properties"]["secret"] == {"enum": ["wandb-key"]}
    assert "wandb-key" not in json.dumps(anyone) + json.dumps(mine)
    assert "s3cret" not in json.dumps(theirs)


def test_an_unpaired_surrogate_is_a_documented_400(api_schema, hub, auth):
    """JSON's \\u escapes can write half a surrogate pair (no fuzzer sends one): a 400
    naming the body, where the parsers' UTF-8 byte counts were a 500."""
    op = api_schema["/api/jobs"]["POST"]
    for body in (b'{"command": "\\ud800"}', b'{"command": ["x"], "env": {"A": "\\udfff"}}'):
        r = requests.post(
            f"{hub.url}/services/gpulab/api/jobs",
            data=body,
            headers={**auth, "Content-Type": "application/json"},
            timeout=30,
        )
        assert r.status_code == 400 and r.json()["field"] == "body", r.text
        _conforms(op.Case(body={}), r)
