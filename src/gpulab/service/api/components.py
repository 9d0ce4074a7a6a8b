"""The components of the service's OpenAPI document (:mod:`gpulab.service.api.openapi`):
the error body, the job and page shapes, and the parameters several paths share."""

from __future__ import annotations

from ...bounds import DEFAULT_PAGE, MAX_OFFSET, MAX_PAGE
from ...checks import MAX_SECRET_NAME_CHARS, SECRET_NAME_PATTERN
from ...jobs.spec import MAX_WORKERS
from ...lifecycle import JobState

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


#: a secret's name (gpulab/secrets.py)
SECRET_NAME = {"type": "string", "pattern": SECRET_NAME_PATTERN, "maxLength": MAX_SECRET_NAME_CHARS}
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


#: the answers of an operation that calls the container engine (jobs.refusals.engine_refusal)
ENGINE_ERRORS = {
    "502": _json(_ref("Error"), "the container engine failed"),
    "503": _json(
        _ref("Error"), "the container engine does not answer (the message names its address)"
    ),
}


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

#: one user's or group's standing in the fair share (gpulab.fairshare.Standing.to_json)
STANDING = {
    "gpu_hours": {"type": "number", "minimum": 0},
    "used": {"type": "number", "minimum": 0, "maximum": 1},
    "share": {"type": "number", "minimum": 0, "maximum": 1},
    "factor": {"type": "number", "minimum": 0, "maximum": 1},
}

#: a user's place in the fair share (gpulab.jobs.queue.share_of)
FAIR_SHARE = {
    "type": "object",
    "description": "the user's place in the fair share: their recent GPU-hours (decayed with "
    "the half-life), their part of everyone's recent usage and their entitled share (0 to "
    "1), their factor (1 unused, 0.5 at their share, less beyond it), the same for the group "
    "that judges them (null when in no group), and the place in line of each of their queued "
    "jobs and notebooks waiting for GPUs (at most 100 listed; queued_mine counts them all)",
    "properties": {
        **STANDING,
        "group": {
            "type": ["object", "null"],
            "properties": {"name": {"type": "string"}, **STANDING},
        },
        "half_life_hours": {"type": "number"},
        "queued": {
            "type": "array",
            "maxItems": 100,
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "description": "a queued job's"},
                    "notebook": {
                        "type": "string",
                        "description": "a notebook waiting for GPUs: its server's name",
                    },
                    "place": {"type": "integer", "minimum": 1},
                },
            },
        },
        "queued_mine": {"type": "integer", "minimum": 0},
        "queued_total": {"type": "integer", "minimum": 0},
    },
}

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

#: the last live push of a running workload's volumes (gpulab.live_push), on a job's and a
#: notebook's record; null until the first
LIVE_PUSH = {
    "type": ["object", "null"],
    "description": "its last live push (its writable volumes pushed while it runs: every "
    "sync_interval, or when its owner asks): files unchanged for 10 s and while read are "
    "sent, nothing is deleted until the stop's push; null until the first",
    "properties": {
        "running": {"type": "boolean", "description": "one runs now"},
        "trigger": {"type": "string", "enum": ["interval", "request"]},
        "started": {"type": ["string", "null"], "format": "date-time"},
        "at": {
            "type": ["string", "null"],
            "format": "date-time",
            "description": "when the last one ended",
        },
        "ok": {"type": ["boolean", "null"]},
        "message": {
            "type": ["string", "null"],
            "description": "what it sent per volume, or its error",
        },
        "files": {"type": ["integer", "null"], "description": "files sent"},
        "bytes": {"type": ["integer", "null"], "description": "bytes sent"},
    },
}
