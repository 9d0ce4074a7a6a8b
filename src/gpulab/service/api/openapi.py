"""The OpenAPI description of the gpulab service's REST API.

Paths are listed next to their handlers in :data:`ROUTES` (service/app.py builds its routes from the
same table), so the document cannot name a path the service does not serve, nor miss one; a
test checks it. The job submission body is the JSON Schema kept beside its parser.
"""

from __future__ import annotations

from ... import __version__
from ...bounds import (
    MAX_COMMAND_BYTES,
    MAX_COMMAND_ITEMS,
    MAX_ENV_BYTES,
    MAX_ENV_VALUE_BYTES,
    MAX_LABELS,
    size_text,
)
from ...checks import LABEL_KEY_RE
from ...jobs import actions
from ...jobs.spec import JOB_SPEC_SCHEMA
from ...jobs.spec.array import MAX_PARAMETER_SET_BYTES, MAX_PARAMETERS_BYTES
from ...lifecycle import JobState, NotebookState
from ...notebooks.output import DEFAULT_TAIL_LINES, MAX_TAIL_BYTES, MAX_TAIL_LINES
from ...secrets import MAX_SECRETS
from ...snapshots import MAX_SNAPSHOT_NAME_CHARS, SNAPSHOT_NAME_PATTERN
from ..base import BaseHandler
from .components import (
    ALL,
    ENGINE_ERRORS,
    ERROR,
    EVENT,
    FAIR_SHARE,
    JOB_ID,
    LIVE_PUSH,
    PAGE_PARAMS,
    PUBLIC,
    RANK,
    SECRET_NAME,
    SECRET_PARAMS,
    SERVER,
    STATES,
    USER,
    _errors,
    _job,
    _json,
    _page,
    _ref,
)
from .exec import EXEC_DESCRIPTION, EXEC_REQUEST, EXEC_RESULT, MAX_TERMINAL_SIZE

#: the rules of a submission that JSON Schema cannot state (refused with a 400 naming the
#: field): tests/integration/test_api_contract.py leaves positive_data_acceptance out for
#: exactly the bodies that break one of them
SUBMISSION_BEYOND_THE_SCHEMA = (
    "Beyond the schema, a submission is also refused (400, naming the field) when: `command` "
    f"and `args` together hold more than {MAX_COMMAND_ITEMS} entries or "
    f"{size_text(MAX_COMMAND_BYTES)} in UTF-8 (a string command counts as sh, -c and it); an "
    f"env value is over {size_text(MAX_ENV_VALUE_BYTES)} in UTF-8, or names and values "
    f"together over {size_text(MAX_ENV_BYTES)}; env's list form names a variable twice; two "
    "ports share a name or a number; two volumes share a mount path or lie one inside the "
    "other; two repositories' paths (given, or /workspace/<name> from their URLs) are the "
    "same or nested, or one is a volume's mount path; `completions` is not the number of "
    "`parameters` sets, or `parallelism` is over the tasks (or given without either); two keys "
    f"of a parameter set differ only in case, or a set is over "
    f"{size_text(MAX_PARAMETER_SET_BYTES)} or the list over {size_text(MAX_PARAMETERS_BYTES)} "
    "as JSON; the body is over the service's "
    "max_request_body (413). The schema's maxLength counts characters where these caps "
    "count bytes."
)


def _label_filter(what: str) -> dict:
    """The ``?label=key=value`` filter of a list (repeatable)."""
    return {
        "name": "label",
        "in": "query",
        "style": "form",
        "explode": True,
        "schema": {"type": "array", "items": {"type": "string", "pattern": "="}},
        "description": f"key=value; repeat for several ({what} with all of them)",
    }


SNAPSHOT_NAME = {
    "type": "string",
    "pattern": SNAPSHOT_NAME_PATTERN,
    "maxLength": MAX_SNAPSHOT_NAME_CHARS,
}
SNAPSHOT_PARAM = {"name": "name", "in": "path", "required": True, "schema": SNAPSHOT_NAME}
SNAPSHOT_DESCRIPTION = (
    "A snapshot records every object of the workspace (key, SHA-256, size) in a manifest "
    "and keeps each content once, as a blob named by its SHA-256 under your own prefix of the "
    "workspace bucket: taking one copies (inside the store) only the contents none of your "
    "snapshots holds yet. 409: the name is taken, you have max_snapshots, the blobs would go "
    "over snapshot_quota, the workspace changed meanwhile, or no workspace store is "
    "configured, or a job's volume is read-only or on another store than the workspace's; "
    "404: no such notebook, job or job volume of yours; 403: no grant covers the job's volume "
    "now."
)


PATHS: dict[str, dict] = {
    "/api/health": {
        "get": {
            "operationId": "health",
            "summary": "liveness",
            "security": [],
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "required": ["status"],
                        "properties": {"status": {"const": "ok"}},
                    },
                    "ok",
                ),
                **PUBLIC,
            },
        }
    },
    "/api/openapi.json": {
        "get": {
            "operationId": "openapi",
            "summary": "this document",
            "security": [],
            "description": "With a token, the job submission schema is the caller's: their "
            "limits, quota and highest priority; without, a user's without overrides.",
            "responses": {"200": _json({"type": "object"}, "OpenAPI"), **PUBLIC},
        }
    },
    "/api/notebooks": {
        "get": {
            "operationId": "listNotebooks",
            "summary": "your notebooks (admins: ?user=NAME or ?all=true) with states and history",
            "parameters": [
                _label_filter("notebooks"),
                {"name": "user", "in": "query", "schema": {"type": "string"}},
                ALL,
                *PAGE_PARAMS,
                {
                    "name": "cursor",
                    "in": "query",
                    "description": "the page after the notebook this names (opaque: the "
                    "previous page's `next` carries it; `offset` then counts from there); one "
                    "this service did not give is a 400 naming `cursor`",
                    "schema": {"type": "string", "maxLength": 1024},
                },
            ],
            "responses": {
                "200": _json(
                    _page("notebooks", "Notebook"),
                    "notebooks",
                ),
                **_errors(400),
            },
        }
    },
    "/api/notebooks/{user}/{server}": {
        "get": {
            "operationId": "getNotebook",
            "summary": "one notebook",
            "parameters": [USER, SERVER],
            "responses": {"200": _json(_ref("Notebook"), "the notebook"), **_errors(404)},
        }
    },
    "/api/notebooks/{user}/{server}/logs": {
        "get": {
            "operationId": "getNotebookLogs",
            "summary": "the tail of a notebook's output (its editor's and kernels' messages), "
            "credentials scrubbed; its owner's and admins'",
            "description": "The last `tail` lines of the notebook container's log, at most "
            f"{MAX_TAIL_BYTES // 1024} KiB (whole lines), each line with tokens in URL "
            "queries, Authorization headers and cookies replaced by [secret]. A notebook's "
            "log goes with its container: a stopped notebook has none (409); a FAILED or ERROR "
            "one keeps its container until it is started again or deleted.",
            "parameters": [
                USER,
                SERVER,
                {
                    "name": "tail",
                    "in": "query",
                    "schema": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": MAX_TAIL_LINES,
                        "default": DEFAULT_TAIL_LINES,
                    },
                    "description": "lines, the last ones",
                },
            ],
            "responses": {
                "200": {
                    "description": "text",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                },
                **_errors(400, 404, 409),
                **ENGINE_ERRORS,
            },
        }
    },
    "/api/notebooks/{user}/{server}/push": {
        "post": {
            "operationId": "pushNotebook",
            "summary": "push a RUNNING notebook's workspace, home and writable volumes now (a "
            "live push: files unchanged for sync_settle and while read, nothing deleted), or "
            "retry the push of a SYNC_FAILED notebook; 409 in any other state and while a push "
            "is asked or runs",
            "parameters": [USER, SERVER],
            "responses": {
                "200": _json(_ref("Notebook"), "pushed: STOPPED"),
                "202": _json(_ref("Notebook"), "a live push asked: its live_push says how it went"),
                **_errors(404, 409, 502),
            },
        }
    },
    "/api/snapshots/{user}": {
        "get": {
            "operationId": "listSnapshots",
            "summary": "your workspace snapshots and the bytes they hold together",
            "parameters": [USER],
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "properties": {
                            "snapshots": {"type": "array", "items": _ref("Snapshot")},
                            "stored_bytes": {
                                "type": "integer",
                                "description": "their blobs together, each distinct content "
                                "once: what counts against the snapshot quota",
                            },
                            "quota_bytes": {"type": ["integer", "null"]},
                            "max_snapshots": {"type": "integer"},
                        },
                    },
                    "the snapshots, oldest first",
                ),
                **_errors(404, 409, 502),
            },
        },
        "post": {
            "operationId": "takeSnapshot",
            "summary": "take a snapshot of a notebook's workspace, or of a job's rw volume, as "
            "stored (its last push)",
            "description": SNAPSHOT_DESCRIPTION,
            "parameters": [USER],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "required": ["name"],
                            "additionalProperties": False,
                            "dependentRequired": {"job": ["volume"], "volume": ["job"]},
                            "not": {"required": ["notebook", "job"]},
                            "properties": {
                                "name": SNAPSHOT_NAME,
                                "job": {
                                    "type": "string",
                                    "pattern": "^[a-z0-9]{1,64}$",
                                    "description": "a job of yours, with volume: a snapshot of "
                                    "that job's rw/rwd volume (on the workspace store)",
                                },
                                "volume": {
                                    "type": "string",
                                    "pattern": "^/",
                                    "maxLength": 1024,
                                    "description": "the job volume's mount path",
                                },
                                "notebook": {
                                    "type": "string",
                                    "pattern": "^([^./][^/]*)?$",
                                    "maxLength": 255,
                                    "description": "the notebook (server) whose workspace; '' "
                                    "or absent: the default server",
                                },
                            },
                        }
                    }
                },
            },
            "responses": {
                "201": _json(_ref("Snapshot"), "taken"),
                **_errors(400, 404, 409, 502),
            },
        },
    },
    "/api/snapshots/{user}/{name}": {
        "get": {
            "operationId": "getSnapshot",
            "summary": "one snapshot",
            "parameters": [USER, SNAPSHOT_PARAM],
            "responses": {
                "200": _json(_ref("Snapshot"), "the snapshot"),
                **_errors(400, 404, 409, 502),
            },
        },
        "delete": {
            "operationId": "deleteSnapshot",
            "summary": "delete a snapshot and the blobs no other snapshot of yours refers to",
            "parameters": [USER, SNAPSHOT_PARAM],
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string"},
                            "deleted": {"type": "boolean"},
                            "freed_bytes": {"type": "integer"},
                        },
                    },
                    "deleted",
                ),
                **_errors(400, 404, 409, 502),
            },
        },
    },
    "/api/snapshots/{user}/{name}/restore": {
        "post": {
            "operationId": "restoreSnapshot",
            "summary": "make a new, STOPPED or DELETED notebook's workspace the snapshot's",
            "description": "The notebook's stored workspace becomes exactly the snapshot's "
            "(contents that differ copied from the snapshot's blobs inside the store, keys the "
            "snapshot lacks deleted); a STOPPED notebook's local copy (its workspace volume) is "
            "removed, so that its next start pulls the restored workspace. A notebook that "
            "runs, starts, stops or is SYNC_FAILED is refused (409).",
            "parameters": [USER, SNAPSHOT_PARAM],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "notebook": {
                                    "type": "string",
                                    "pattern": "^([^./][^/]*)?$",
                                    "maxLength": 255,
                                },
                            },
                        }
                    }
                },
            },
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string"},
                            "notebook": {"type": "string"},
                            "copied": {"type": "integer"},
                            "deleted": {"type": "integer"},
                            "unchanged": {"type": "integer"},
                        },
                    },
                    "restored",
                ),
                **_errors(400, 404, 409, 502),
            },
        }
    },
    "/api/jobs": {
        "get": {
            "operationId": "listJobs",
            "summary": "list jobs",
            "parameters": [
                STATES,
                _label_filter("jobs"),
                {"name": "user", "in": "query", "schema": {"type": "string"}},
                ALL,
                *PAGE_PARAMS,
                {
                    "name": "cursor",
                    "in": "query",
                    "description": "the page after the job this names (opaque: the previous "
                    "page's `next` carries it; `offset` then counts from there); one this "
                    "service did not give is a 400 naming `cursor`",
                    "schema": {"type": "string", "maxLength": 128},
                },
            ],
            "responses": {
                "200": _json(
                    _page("jobs", "Job"),
                    "jobs",
                ),
                **_errors(400),
            },
        },
        "post": {
            "operationId": "submitJob",
            "summary": "submit a job",
            "description": SUBMISSION_BEYOND_THE_SCHEMA,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref("JobSubmission")}},
            },
            "responses": {
                "201": _job("accepted: QUEUED", created=True),
                **_errors(400, 409),
            },
        },
    },
    "/api/jobs/{job_id}": {
        "get": {
            "operationId": "getJob",
            "summary": "one job with its history",
            "parameters": [JOB_ID],
            "responses": {"200": _job("the job"), **_errors(404)},
        },
        "delete": {
            "operationId": "deleteJob",
            "summary": "delete an ended job",
            "parameters": [JOB_ID],
            "responses": {
                "204": {"description": "deleted"},
                **_errors(404, 409),
                **ENGINE_ERRORS,
            },
        },
    },
    "/api/jobs/{job_id}/events": {
        "get": {
            "operationId": "getJobEvents",
            "summary": "the job's history: transitions, restarts and fault recoveries",
            "parameters": [JOB_ID],
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "required": ["id", "events"],
                        "properties": {
                            "id": {"type": "string"},
                            "events": {"type": "array", "items": EVENT},
                        },
                    },
                    "events",
                ),
                **_errors(404),
            },
        }
    },
    "/api/jobs/{job_id}/logs": {
        "get": {
            "operationId": "getJobLogs",
            "summary": "the job's output",
            "parameters": [
                JOB_ID,
                {"name": "follow", "in": "query", "schema": {"type": "boolean", "default": False}},
                {
                    **RANK,
                    "description": "one worker of a distributed job (default: every rank, "
                    "each line prefixed with [rank K])",
                },
            ],
            "responses": {
                "200": {
                    "description": "text, streamed with follow=true",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                },
                **_errors(400, 404, 429),
                **ENGINE_ERRORS,
            },
        }
    },
    "/api/jobs/{job_id}/exec": {
        "post": {
            "operationId": "execInJob",
            "summary": "run a command in a RUNNING job (its owner and admins; recorded in its "
            "events) and answer its output and exit code",
            "description": EXEC_DESCRIPTION,
            "parameters": [JOB_ID, RANK],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": EXEC_REQUEST}},
            },
            "responses": {
                "200": _json(EXEC_RESULT, "the command ran (to its end or its time-out)"),
                **_errors(400, 404, 409),
                "429": _json(_ref("Error"), "too many execs open (per user, or in all)"),
                **ENGINE_ERRORS,
            },
        }
    },
    "/api/jobs/{job_id}/shell": {
        "get": {
            "operationId": "shellInJob",
            "summary": "an interactive terminal in a RUNNING job, over a WebSocket (its owner "
            "and admins; recorded in its events)",
            "description": "Binary frames both ways carry the terminal's bytes; the client "
            'sends the text frame {"resize": [cols, rows]} when its size changes; when the '
            'shell exits the service sends {"exit": CODE} and closes. A browser\'s handshake '
            "must come from this host (Origin) and carry the page's XSRF token (_xsrf).",
            "parameters": [
                JOB_ID,
                RANK,
                *(
                    {
                        "name": name,
                        "in": "query",
                        "schema": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": MAX_TERMINAL_SIZE,
                            "default": default,
                        },
                        "description": f"the terminal's {what}",
                    }
                    for name, default, what in (("cols", 80, "columns"), ("rows", 24, "rows"))
                ),
                {
                    "name": "_xsrf",
                    "in": "query",
                    "schema": {"type": "string"},
                    "description": "a browser's XSRF token (not needed with a token)",
                },
            ],
            "responses": {
                "101": {"description": "switched to the WebSocket protocol"},
                **_errors(400, 404, 409),
                "429": _json(_ref("Error"), "too many shells open (per user, or in all)"),
                **ENGINE_ERRORS,
            },
        }
    },
    "/api/jobs/{job_id}/{action}": {
        "post": {
            "operationId": "jobAction",
            "summary": "interrupt (QUEUED or running), resume (INTERRUPTED), rerun (a copy), "
            "push (a RUNNING job: push its rw/rwd volumes now, a live push, 202; a SYNC_FAILED "
            "job: retry its push; 409 for any other state, while a push is asked or runs, or "
            "when it has no rw/rwd volume)",
            "parameters": [
                JOB_ID,
                {
                    "name": "action",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string", "enum": list(actions.ACTIONS)},
                },
            ],
            "responses": {
                "200": _job("done"),
                "201": _job("rerun: the copy", created=True),
                "202": _job("interruption under way; push: a live push asked"),
                **_errors(400, 404, 409, 502),
            },
        }
    },
    "/api/usage": {
        "get": {
            "operationId": "getUsage",
            "summary": "billed minutes (jobs and notebooks, per commenced minute)",
            "parameters": [{"name": "user", "in": "query", "schema": {"type": "string"}}],
            "responses": {"200": _json(_ref("Usage"), "usage"), **_errors()},
        }
    },
    "/api/usage/report": {
        "get": {
            "operationId": "getUsageReport",
            "summary": "one month's billed job minutes by user, from totals kept apart from "
            "the job records (deleting records never changes them): everyone's for an admin, "
            "the caller's own otherwise",
            "parameters": [
                {
                    "name": "month",
                    "in": "query",
                    "description": "YYYY-MM (UTC); default: this month, with live jobs' "
                    "running time so far",
                    "schema": {
                        "type": "string",
                        "pattern": "^(19[7-9][0-9]|[2-9][0-9]{3})-(0[1-9]|1[0-2])$",
                    },
                },
                {"name": "user", "in": "query", "schema": {"type": "string"}},
                PAGE_PARAMS[0],
                {
                    "name": "after",
                    "in": "query",
                    "description": "the page after this user's name (the cursor `next` carries)",
                    "schema": {"type": "string", "maxLength": 255},
                },
            ],
            "responses": {"200": _json(_ref("UsageReport"), "the report"), **_errors(400, 403)},
        }
    },
    "/api/secrets": {
        "get": {
            "operationId": "listSecrets",
            "summary": "your secrets' names (never their values)",
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "properties": {"secrets": {"type": "array", "items": _ref("Secret")}},
                    },
                    "your secrets",
                ),
                **_errors(503),
            },
        }
    },
    "/api/secrets/{name}": {
        "get": {
            "operationId": "getSecret",
            "parameters": SECRET_PARAMS,
            "summary": "one secret's name and times (never its value)",
            "responses": {"200": _json(_ref("Secret"), "the secret"), **_errors(400, 404, 503)},
        },
        "put": {
            "operationId": "putSecret",
            "parameters": SECRET_PARAMS,
            "summary": "store or replace a secret; a job refers to it as "
            '{"env": {"VAR": {"secret": NAME}}}',
            "description": f"The value is at most {MAX_ENV_VALUE_BYTES} bytes in UTF-8 (the "
            "schema's maxLength counts characters). At most "
            f"{MAX_SECRETS} secrets per user.",
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "required": ["value"],
                            "additionalProperties": False,
                            "properties": {
                                "value": {
                                    "type": "string",
                                    "minLength": 1,
                                    "maxLength": MAX_ENV_VALUE_BYTES,
                                    "pattern": "^[^\\x00]*$",
                                }
                            },
                        }
                    }
                },
            },
            "responses": {
                "200": _json(_ref("Secret"), "replaced"),
                "201": _json(_ref("Secret"), "created"),
                **_errors(400, 503),
            },
        },
        "delete": {
            "operationId": "deleteSecret",
            "parameters": SECRET_PARAMS,
            "summary": "delete a secret (jobs that refer to it then fail to start)",
            "responses": {"204": {"description": "deleted"}, **_errors(400, 404, 503)},
        },
    },
}


def document(job_submission: dict | None = None) -> dict:
    """The document; ``job_submission``: the JobSubmission schema (default: the generic one,
    :data:`JOB_SPEC_SCHEMA`; the service serves its deployment's, :func:`job_spec_schema`)."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "gpulab",
            "version": __version__,
            "description": "Notebooks and training jobs on JupyterHub. Authenticate with "
            "a hub token (Authorization: token ...) or the hub's OAuth in a browser.",
        },
        "servers": [{"url": "/services/gpulab"}],
        "security": [{"hubToken": []}],
        "paths": PATHS,
        "components": {
            "securitySchemes": {
                "hubToken": {"type": "apiKey", "in": "header", "name": "Authorization"}
            },
            "schemas": {
                "Error": ERROR,
                "JobSubmission": job_submission or JOB_SPEC_SCHEMA,
                "Job": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string"},
                        "name": {"type": "string"},
                        "owner": {"type": "string"},
                        "kind": {
                            "type": "string",
                            "enum": ["job", "array", "task"],
                            "description": "job; array: a sweep (completions, parameters), "
                            "which runs in its tasks and whose state is derived from theirs "
                            "(QUEUED until one starts, RUNNING while any is unfinished, "
                            "INTERRUPTING once stopped, then DONE when all are DONE, else "
                            "FAILED, ERROR, SYNC_FAILED or INTERRUPTED); task: one of an "
                            "array's, a job of its own (its retries, its logs)",
                        },
                        "array": {
                            "type": ["string", "null"],
                            "description": "a task's array (its job id)",
                        },
                        "task_index": {
                            "type": ["integer", "null"],
                            "description": "a task's index in its array (GPULAB_TASK_INDEX)",
                        },
                        "task_counts": {
                            "type": "object",
                            "additionalProperties": {"type": "integer"},
                            "description": "an array's tasks in each state (lists too)",
                        },
                        "tasks": {
                            "type": "array",
                            "description": "in GET /api/jobs/{job_id} of an array only: its "
                            "tasks in index order (each a job: GET /api/jobs/{id}, its logs)",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "index": {"type": "integer"},
                                    "id": {"type": "string"},
                                    "name": {"type": "string"},
                                    "state": {
                                        "type": "string",
                                        "enum": [s.value for s in JobState],
                                    },
                                    "reason": {"type": "string"},
                                    "message": {"type": "string"},
                                    "exit_code": {"type": ["integer", "null"]},
                                    "restarts": {"type": "integer"},
                                    "node": {"type": "string"},
                                    "devices": {"type": "array", "items": {"type": "string"}},
                                    "parameters": {"type": "object"},
                                    "billed_minutes": {"type": "integer"},
                                    "billed_gpu_minutes": {"type": "integer"},
                                },
                            },
                        },
                        "state": {"type": "string", "enum": [s.value for s in JobState]},
                        "reason": {"type": "string"},
                        "message": {"type": "string"},
                        "exit_code": {"type": ["integer", "null"]},
                        "devices": {"type": "array", "items": {"type": "string"}},
                        "node": {
                            "type": "string",
                            "description": "the cluster node it runs on (empty on one host; "
                            "a distributed job's: each worker's, comma-separated by rank)",
                        },
                        "restarts": {"type": "integer"},
                        "hang_restarts": {"type": "integer"},
                        "billed_minutes": {
                            "type": "integer",
                            "description": "an array's: its tasks' together",
                        },
                        "billed_gpu_minutes": {
                            "type": "integer",
                            "description": "billed minutes x GPUs of all its workers (an "
                            "array's: its tasks' together)",
                        },
                        "workers": {
                            "type": "array",
                            "description": "its workers (one unless a distributed job)",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "rank": {"type": "integer"},
                                    "container": {"type": "string"},
                                    "node": {"type": "string"},
                                    "devices": {"type": "array", "items": {"type": "string"}},
                                },
                            },
                        },
                        "gpu_usage": {
                            "type": "array",
                            "description": "in GET /api/jobs/{job_id} only: what each GPU of "
                            "a RUNNING job does now, read with NVML on the service's host; "
                            "empty when it cannot be read (no NVIDIA driver there, workers on "
                            "a Swarm's nodes) or the job is not RUNNING",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "rank": {"type": "integer"},
                                    "device": {"type": "string"},
                                    "utilization": {
                                        "type": ["integer", "null"],
                                        "description": "percent of NVML's last sample period "
                                        "a kernel ran; null for a MIG device (NVML has none)",
                                    },
                                    "memory_used": {"type": "integer", "description": "bytes"},
                                    "memory_total": {"type": "integer", "description": "bytes"},
                                },
                            },
                        },
                        "spec": {"type": "object"},
                        "push_requested": {
                            "type": ["string", "null"],
                            "format": "date-time",
                            "description": "when its owner asked for a push now that has not "
                            "started yet (POST /api/jobs/{job_id}/push)",
                        },
                        "live_push": LIVE_PUSH,
                        "ports": {
                            "type": "array",
                            "description": "its exposed ports and where they open",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "name": {"type": "string"},
                                    "port": {"type": "integer"},
                                    "url": {"type": "string"},
                                },
                            },
                        },
                        "history": {"type": "array", "items": EVENT},
                    },
                },
                "Secret": {
                    "type": "object",
                    "properties": {
                        "name": SECRET_NAME,
                        "created": {"type": "string", "format": "date-time"},
                        "updated": {"type": "string", "format": "date-time"},
                    },
                },
                "Notebook": {
                    "type": "object",
                    "properties": {
                        "user": {"type": "string"},
                        "server": {"type": "string"},
                        "state": {"type": "string", "enum": [s.value for s in NotebookState]},
                        "options": {
                            "type": "object",
                            "properties": {
                                "idle_timeout": {
                                    "type": "number",
                                    "description": "seconds without activity after which it "
                                    "is stopped (reason IDLE in its history); 0: never. From "
                                    "its flavor or the admin's default, not from the user",
                                },
                                "gpu_unused_timeout": {
                                    "type": "number",
                                    "description": "seconds its GPUs may go unused (under 1 % "
                                    "busy) before it is stopped (reason IDLE); 0: never. From "
                                    "its flavor or the admin's policy, not from the user",
                                },
                                "labels": {
                                    "type": "object",
                                    "additionalProperties": {"type": "string"},
                                    "description": "the user's labels (user_options "
                                    "`labels`, checked as a job's: at most "
                                    f"{MAX_LABELS}, keys {LABEL_KEY_RE.pattern}); "
                                    "?label=key=value filters the list on them",
                                },
                            },
                        },
                        "push_requested": {
                            "type": ["string", "null"],
                            "format": "date-time",
                            "description": "when its owner asked for a push now that has not "
                            "started yet",
                        },
                        "live_push": LIVE_PUSH,
                        "history": {"type": "array", "items": EVENT},
                    },
                },
                "Snapshot": {
                    "type": "object",
                    "properties": {
                        "name": SNAPSHOT_NAME,
                        "created": {"type": "string", "format": "date-time"},
                        "source": {
                            "type": "object",
                            "additionalProperties": {"type": "string"},
                            "description": "what it was taken of: kind notebook, its name",
                        },
                        "objects": {"type": "integer"},
                        "bytes": {"type": "integer", "description": "its files' sizes together"},
                        "new_bytes": {
                            "type": "integer",
                            "description": "when taken: the bytes of blobs it added (the "
                            "rest it shares with your other snapshots)",
                        },
                    },
                },
                "Usage": {
                    "type": "object",
                    "properties": {
                        "user": {"type": "string"},
                        "billed_minutes": {"type": "integer"},
                        "jobs_billed_minutes": {"type": "integer"},
                        "notebooks_billed_minutes": {"type": "integer"},
                        "fair_share": FAIR_SHARE,
                    },
                },
                "UsageReport": {
                    "type": "object",
                    "properties": {
                        "month": {"type": "string"},
                        "limit": {"type": "integer"},
                        "next": {
                            "type": ["string", "null"],
                            "description": "path and query of the next page of users",
                        },
                        "users": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "user": {"type": "string"},
                                    "jobs_billed_minutes": {"type": "integer"},
                                    "jobs_billed_gpu_minutes": {"type": "integer"},
                                },
                            },
                        },
                    },
                },
            },
        },
    }


class OpenAPIHandler(BaseHandler):
    """The OpenAPI document, with the job submission schema of this deployment (its catalog,
    flavors, GPUs and limits): the caller's with a valid token (their limits, quota and
    highest priority), else that of a user without overrides. No token is needed."""

    async def get(self):
        me = self.current_user
        user, groups = (me["name"], list(me.get("groups") or [])) if me else ("", [])
        submission = await actions.submission_schema(
            self.supervisor,
            self.settings["gpulab"],
            owner=user,
            groups=groups,
            admin=bool(me) and self.is_admin(me),
        )
        self.write_json(document(submission))
