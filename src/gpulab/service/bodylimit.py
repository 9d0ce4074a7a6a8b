"""The request body cap of the gpulab service, answered as a JSON 413 that names the limit.

Three layers, from the cheapest:

- a body that declares (Content-Length) more than ``max_request_body`` is routed, as soon as
  its headers are read, to :class:`BodyTooLargeHandler`, which reads and discards it chunk by
  chunk (nothing is buffered or parsed) and answers 413. Reading it to the end, rather than
  closing the connection at once, is what lets the hub's proxy relay the 413: a connection
  closed under a request that is still being sent reaches the client as a 503;
- a body without a declared length (chunked) is buffered up to the HTTP server's limit, four
  times the cap (``__main__.py``), and refused by ``BaseHandler.prepare`` with the same 413;
- beyond that (a chunked body over four times the cap, or a declared one over
  :data:`DISCARD_FACTOR` times) tornado stops reading and closes the connection.
"""

from __future__ import annotations

import json

from tornado import httputil, web

from ..bounds import MAX_REQUEST_BODY, body_too_large

#: declared bodies up to this many times the cap are read and discarded for a clean 413
DISCARD_FACTOR = 64


def request_cap(settings: dict) -> int:
    """``GpulabSettings.max_request_body`` of the application (the default without one)."""
    gpulab = settings.get("gpulab")
    return gpulab.max_request_body if gpulab is not None else MAX_REQUEST_BODY


@web.stream_request_body
class BodyTooLargeHandler(web.RequestHandler):
    """Discards a body declared over the cap, then answers 413 (any method)."""

    def initialize(self, cap: int, size: int) -> None:
        self.cap, self.size = cap, size

    def data_received(self, chunk: bytes) -> None:
        pass  # discarded: never buffered, never parsed

    def _refuse(self, *args, **kwargs) -> None:
        self.set_status(413)
        self.set_header("Content-Type", "application/json")
        why = body_too_large(self.size, self.cap)
        self.finish(json.dumps({"status": 413, "field": "body", "message": why}))

    get = head = post = put = patch = delete = options = _refuse


class BoundedApplication(web.Application):
    """A tornado Application that routes over-cap declared bodies to
    :class:`BodyTooLargeHandler` before their body is read."""

    def find_handler(self, request: httputil.HTTPServerRequest, **kwargs):
        cap = request_cap(self.settings)
        declared = request.headers.get("Content-Length", "")
        if declared.isdigit() and len(declared) < 19 and cap < int(declared):
            size = int(declared)
            if size <= cap * DISCARD_FACTOR and request.connection is not None:
                # read it all (discarding) so that the 413 reaches the client through the proxy
                request.connection.set_max_body_size(size)  # type: ignore[attr-defined]
                return self.get_handler_delegate(
                    request, BodyTooLargeHandler, {"cap": cap, "size": size}
                )
        return super().find_handler(request, **kwargs)
