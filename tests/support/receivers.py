"""Real receivers of notices for tests, run in the test's process: a webhook receiver (an
HTTP server in a thread of its own) and an SMTP server (aiosmtpd's, in its own thread too).

    with WebhookReceiver(fail_first=2) as hooks: ... hooks.url("/x") ... hooks.posts
    with MailServer() as mail: ... mail.port ... mail.messages

Each records what it received; the webhook receiver can answer 500 to its first requests,
or wait before answering, to play a receiver that is down or hangs.
"""

from __future__ import annotations

import json
import threading
import time
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .ports import free_port


class WebhookReceiver:
    def __init__(self, *, fail_first: int = 0, delay: float = 0.0, status: int = 204):
        self.fail_first, self.delay, self.status = fail_first, delay, status
        #: every request received: {"path", "headers", "body" (parsed JSON), "status"}
        self.posts: list[dict] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                size = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(size)
                with receiver.lock:
                    failing = len(receiver.posts) < receiver.fail_first
                    status = 500 if failing else receiver.status
                    receiver.posts.append(
                        {
                            "path": self.path,
                            "headers": dict(self.headers),
                            "body": json.loads(body or b"null"),
                            "status": status,
                        }
                    )
                if receiver.delay:
                    time.sleep(receiver.delay)
                self.send_response(status)
                if status == 302:
                    self.send_header("Location", receiver.url("/elsewhere"))
                self.send_header("Content-Length", "0" if status == 204 else "2")
                self.end_headers()
                if status != 204:
                    self.wfile.write(b"ok")

            def log_message(self, format, *args):  # noqa: A002 - the base class's name
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def delivered(self) -> list[dict]:
        """The bodies of the requests answered with a success."""
        with self.lock:
            return [p["body"] for p in self.posts if p["status"] < 300]

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


class MailServer:
    """aiosmtpd's SMTP server on a loopback port, keeping every message it is handed."""

    def __init__(self) -> None:
        from aiosmtpd.controller import Controller

        #: (envelope sender, recipients, the parsed message)
        self.messages: list[tuple[str, list[str], Message]] = []
        server = self

        class Handler:
            async def handle_DATA(self, smtp, session, envelope):  # noqa: N802 - aiosmtpd's
                server.messages.append(
                    (
                        envelope.mail_from,
                        list(envelope.rcpt_tos),
                        message_from_bytes(envelope.original_content or envelope.content),
                    )
                )
                return "250 OK"

        self.port = free_port()
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)

    def __enter__(self) -> MailServer:
        self.controller.start()
        return self

    def __exit__(self, *exc) -> None:
        self.controller.stop()
