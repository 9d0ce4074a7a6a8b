"""The OpenAPI description of the gpulab service's REST API.

Paths are listed next to their handlers in :data:`ROUTES` (app.py builds its routes from the
same table), so the document cannot name a path the service does not serve, nor miss one; a
test checks it. The job submission body is the JSON Schema kept beside its parser.
"""

from __future__ import annotations

from .. import __version__
from ..jobs.spec import JOB_SPEC_SCHEMA
from ..lifecycle import JobState, NotebookState
from .app_base import DEFAULT_PAGE, MAX_PAGE

ERROR = {
    "type": "object",
    "required": ["status", "message"],
    "properties": {
        "status": {"type": "integer"},
        "message": {"type": "string", "description": "what is wrong and what is allowed"},
        "field": {"type": "string", "description": "the input at fault, dotted for nested"},
    },
}


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict:
    """Error answers of an authenticated operation: 401 and 403 always, and ``codes``."""
    text = {
        400: "invalid input",
        401: "no valid credentials (none, or an unknown or expired token)",
        403: "the token lacks the scope this action needs",
        404: "not found (or not yours)",
        409: "not allowed in the current state",
        502: "the object store failed",
    }
    return {str(c): _json(_ref("Error"), text[c]) for c in sorted({401, 403, *codes})}


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
        "schema": {"type": "integer", "minimum": 0, "default": 0},
        "description": "items to skip",
    },
]


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


JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}
USER = {"name": "user", "in": "path", "required": True, "schema": {"type": "string"}}
SERVER = {
    "name": "server",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
    "description": "the named server ('' for the default server)",
}

PATHS: dict[str, dict] = {
    "/api/health": {
        "get": {
            "summary": "liveness",
            "security": [],
            "responses": {"200": _json({"type": "object"}, "ok")},
        }
    },
    "/api/openapi.json": {
        "get": {
            "summary": "this document",
            "security": [],
            "responses": {"200": _json({"type": "object"}, "OpenAPI")},
        }
    },
    "/api/notebooks": {
        "get": {
            "summary": "your notebooks (admins: ?user=NAME or ?all=true) with states and history",
            "parameters": [
                {"name": "user", "in": "query", "schema": {"type": "string"}},
                {"name": "all", "in": "query", "schema": {"type": "boolean"}},
                *PAGE_PARAMS,
            ],
            "responses": {
                "200": _json(
                    _page("notebooks", "Notebook"),
                    "notebooks",
                ),
                **_errors(403),
            },
        }
    },
    "/api/notebooks/{user}/{server}": {
        "get": {
            "summary": "one notebook",
            "parameters": [USER, SERVER],
            "responses": {"200": _json(_ref("Notebook"), "the notebook"), **_errors(404)},
        }
    },
    "/api/notebooks/{user}/{server}/push": {
        "post": {
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
            "summary": "list jobs",
            "parameters": [
                {
                    "name": "state",
                    "in": "query",
                    "schema": {"type": "string"},
                    "description": "comma-separated states",
                },
                {
                    "name": "label",
                    "in": "query",
                    "schema": {"type": "string"},
                    "description": "key=value; repeat for several",
                },
                {"name": "user", "in": "query", "schema": {"type": "string"}},
                {"name": "all", "in": "query", "schema": {"type": "boolean"}},
                *PAGE_PARAMS,
            ],
            "responses": {
                "200": _json(
                    _page("jobs", "Job"),
                    "jobs",
                ),
                **_errors(400, 403),
            },
        },
        "post": {
            "summary": "submit a job",
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref("JobSubmission")}},
            },
            "responses": {"201": _json(_ref("Job"), "accepted: QUEUED"), **_errors(400, 403, 409)},
        },
    },
    "/api/jobs/{job_id}": {
        "get": {
            "summary": "one job with its history",
            "parameters": [JOB_ID],
            "responses": {"200": _json(_ref("Job"), "the job"), **_errors(404)},
        },
        "delete": {
            "summary": "delete an ended job",
            "parameters": [JOB_ID],
            "responses": {"204": {"description": "deleted"}, **_errors(404, 409)},
        },
    },
    "/api/jobs/{job_id}/events": {
        "get": {
            "summary": "the job's history: transitions, restarts and fault recoveries",
            "parameters": [JOB_ID],
            "responses": {"200": _json({"type": "object"}, "events"), **_errors(404)},
        }
    },
    "/api/jobs/{job_id}/logs": {
        "get": {
            "summary": "the job's output",
            "parameters": [
                JOB_ID,
                {"name": "follow", "in": "query", "schema": {"type": "boolean"}},
            ],
            "responses": {
                "200": {
                    "description": "text, streamed with follow=true",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                },
                **_errors(404),
            },
        }
    },
    "/api/jobs/{job_id}/{action}": {
        "post": {
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
                "200": _json(_ref("Job"), "done"),
                "201": _json(_ref("Job"), "rerun"),
                "202": _json(_ref("Job"), "interruption under way"),
                **_errors(404, 409, 502),
            },
        }
    },
    "/api/usage": {
        "get": {
            "summary": "billed minutes (jobs and notebooks, per commenced minute)",
            "parameters": [{"name": "user", "in": "query", "schema": {"type": "string"}}],
            "responses": {"200": _json(_ref("Usage"), "usage"), **_errors(403)},
        }
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


def document() -> dict:
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
                "JobSubmission": JOB_SPEC_SCHEMA,
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
                        "restarts": {"type": "integer"},
                        "hang_restarts": {"type": "integer"},
                        "billed_minutes": {"type": "integer"},
                        "spec": {"type": "object"},
                        "history": {"type": "array", "items": EVENT},
                    },
                },
                "Notebook": {
                    "type": "object",
                    "properties": {
                        "user": {"type": "string"},
                        "server": {"type": "string"},
                        "state": {"type": "string", "enum": [s.value for s in NotebookState]},
                        "options": {"type": "object"},
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
