"""The OpenAPI description of the gpulab service's REST API.

Paths are listed next to their handlers in :data:`ROUTES` (app.py builds its routes from the
same table), so the document cannot name a path the service does not serve, nor miss one; a
test checks it. The job submission body is the JSON Schema kept beside its parser.
"""

from __future__ import annotations

from .. import __version__
from ..bounds import MAX_ENV_VALUE_BYTES
from ..jobs.spec import JOB_SPEC_SCHEMA
from ..jobs.spec_fields import MAX_WORKERS
from ..lifecycle import JobState, NotebookState
from .app_base import DEFAULT_PAGE, MAX_OFFSET, MAX_PAGE
from .exec_api import EXEC_DESCRIPTION, EXEC_REQUEST, EXEC_RESULT, MAX_TERMINAL_SIZE

#: a worker of a distributed job (query parameter)
RANK = {
    "name": "rank",
    "in": "query",
    "description": "the worker of a distributed job (default 0)",
    "schema": {"type": "integer", "minimum": 0, "maximum": MAX_WORKERS - 1},
}

ERROR = {
    "type": "object",
    "required": ["status", "message"],
    "properties": {
        "status": {"type": "integer", "minimum": 400, "maximum": 599},
        "message": {"type": "string", "description": "what is wrong and what is allowed"},
        "field": {"type": "string", "description": "the input at fault, dotted for nested"},
    },
}

#: the error answers, by status (every one a JSON Error)
ERROR_TEXT = {
    400: "invalid input: the message says what is allowed, `field` names the input",
    401: "no valid credentials (none, or an unknown or expired token)",
    403: "the token lacks the scope this action needs (or asks for more than the caller may)",
    404: "not found (or not yours); also any path this service does not serve",
    409: "not allowed in the current state",
    413: "the request body is over the service's limit (the message names it)",
    429: "too many log streams open; close one first or try again later",
    502: "the object store failed",
    503: "not enabled on this platform (the message says what the admin must configure)",
}


#: a secret's name (gpulab/user_secrets.py)
SECRET_NAME = {"type": "string", "pattern": "^[a-z0-9][a-z0-9._-]{0,62}$", "maxLength": 63}
SECRET_PARAMS = [{"name": "name", "in": "path", "required": True, "schema": SECRET_NAME}]


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict, description: str, headers: dict | None = None) -> dict:
    out = {"description": description, "content": {"application/json": {"schema": schema}}}
    if headers:
        out["headers"] = headers
    return out


def _error(code: int) -> dict:
    if code == 401:
        challenge = {"schema": {"type": "string"}, "description": 'token realm="gpulab"'}
        return _json(_ref("Error"), ERROR_TEXT[code], {"WWW-Authenticate": challenge})
    return _json(_ref("Error"), ERROR_TEXT[code])


def _errors(*codes: int) -> dict:
    """Error answers of an authenticated operation: 401, 403 and 413 always, and ``codes``."""
    return {str(c): _error(c) for c in sorted({401, 403, 413, *codes})}


#: the Location of a created job
LOCATION = {
    "Location": {
        "schema": {"type": "string"},
        "description": "the new job's path",
        "required": True,
    }
}
#: what a client (or a stateful fuzzer) may do next with a job it got: the operations on it
JOB_LINKS = {
    name: {"operationId": op, "parameters": {"job_id": "$response.body#/id"}}
    for name, op in (
        ("GetJob", "getJob"),
        ("DeleteJob", "deleteJob"),
        ("GetJobEvents", "getJobEvents"),
        ("GetJobLogs", "getJobLogs"),
        ("JobAction", "jobAction"),
    )
}


def _job(description: str, created: bool = False) -> dict:
    """A Job answer, with the links to the operations on it (and Location, once created)."""
    return {**_json(_ref("Job"), description, LOCATION if created else None), "links": JOB_LINKS}


PAGE_PARAMS = [
    {
        "name": "limit",
        "in": "query",
        "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": DEFAULT_PAGE},
        "description": "items per page",
    },
    {
        "name": "offset",
        "in": "query",
        "schema": {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET, "default": 0},
        "description": "items to skip",
    },
]
ALL = {
    "name": "all",
    "in": "query",
    "schema": {"type": "boolean", "default": False},
    "description": "admins: everyone's",
}
#: the states filter: names, any case, separated by commas (blank: no filter)
_STATE_NAME = "|".join(
    "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else c for c in s.value) for s in JobState
)
_SP = "[\\t\\n\\v\\f\\r ]*"
STATES = {
    "name": "state",
    "in": "query",
    "schema": {
        "type": "string",
        "pattern": f"^({_SP}({_STATE_NAME}){_SP}(,{_SP}({_STATE_NAME}){_SP})*)?$",
    },
    "description": "comma-separated states (any case): " + ", ".join(s.value for s in JobState),
}


def _page(key: str, item: str) -> dict:
    """A page of a list: the items, how many there are in all, and the next page's URL."""
    return {
        "type": "object",
        "required": [key, "total", "limit", "offset", "next"],
        "properties": {
            key: {"type": "array", "items": _ref(item)},
            "total": {"type": "integer"},
            "limit": {"type": "integer"},
            "offset": {"type": "integer"},
            "next": {"type": ["string", "null"], "description": "path and query of the next page"},
        },
    }


# the patterns of the routes (app.py): a value outside them is a path this service does not serve
JOB_ID = {
    "name": "job_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^[a-z0-9]+$"},
}
USER = {
    "name": "user",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^[^/]+$"},
}
SERVER = {
    "name": "server",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^[^/]*$"},
    "description": "the named server ('' for the default server)",
}
PUBLIC = {"413": _error(413)}

EVENT = {
    "type": "object",
    "properties": {
        "at": {"type": "string", "format": "date-time"},
        "state": {"type": "string"},
        "kind": {"type": "string"},
        "reason": {"type": "string"},
        "message": {"type": "string"},
        "exit_code": {"type": ["integer", "null"]},
    },
}

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
                {"name": "user", "in": "query", "schema": {"type": "string"}},
                ALL,
                *PAGE_PARAMS,
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
    "/api/notebooks/{user}/{server}/push": {
        "post": {
            "operationId": "pushNotebook",
            "summary": "retry the push of a SYNC_FAILED notebook",
            "parameters": [USER, SERVER],
            "responses": {
                "200": _json(_ref("Notebook"), "pushed: STOPPED"),
                **_errors(404, 409, 502),
            },
        }
    },
    "/api/jobs": {
        "get": {
            "operationId": "listJobs",
            "summary": "list jobs",
            "parameters": [
                STATES,
                {
                    "name": "label",
                    "in": "query",
                    "style": "form",
                    "explode": True,
                    "schema": {"type": "array", "items": {"type": "string", "pattern": "="}},
                    "description": "key=value; repeat for several (jobs with all of them)",
                },
                {"name": "user", "in": "query", "schema": {"type": "string"}},
                ALL,
                *PAGE_PARAMS,
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
            "responses": {"204": {"description": "deleted"}, **_errors(404, 409)},
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
                "502": _json(_ref("Error"), "the container engine failed"),
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
                "502": _json(_ref("Error"), "the container engine failed"),
            },
        }
    },
    "/api/jobs/{job_id}/{action}": {
        "post": {
            "operationId": "jobAction",
            "summary": "interrupt (QUEUED or running), resume (INTERRUPTED), rerun (a copy), "
            "push (retry a SYNC_FAILED push)",
            "parameters": [
                JOB_ID,
                {
                    "name": "action",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string", "enum": ["interrupt", "resume", "rerun", "push"]},
                },
            ],
            "responses": {
                "200": _job("done"),
                "201": _job("rerun: the copy", created=True),
                "202": _job("interruption under way"),
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
                        "billed_minutes": {"type": "integer"},
                        "billed_gpu_minutes": {
                            "type": "integer",
                            "description": "billed minutes x GPUs of all its workers",
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
                        "spec": {"type": "object"},
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
                                }
                            },
                        },
                        "history": {"type": "array", "items": EVENT},
                    },
                },
                "Usage": {
                    "type": "object",
                    "properties": {
                        "user": {"type": "string"},
                        "billed_minutes": {"type": "integer"},
                        "jobs_billed_minutes": {"type": "integer"},
                        "notebooks_billed_minutes": {"type": "integer"},
                    },
                },
            },
        },
    }
