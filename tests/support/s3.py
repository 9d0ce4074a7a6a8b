"""Real S3-speaking HTTP servers for the sync tests and benchmark (loopback only).

- :class:`MotoS3Server`: moto's S3 server (the same app as ``ThreadedMotoServer``) on
  127.0.0.1 and a free port. ``stop()`` also cuts keep-alive connections, so clients really
  see the server go away; ``start()`` again serves on the same port (moto keeps its state in
  the process, so objects survive a restart, as with a persistent store).
- :class:`CheckingS3Server`: the same server in a process of its own, checking credentials
  (a wrong key or secret is refused as S3 refuses it).
- :class:`FaultyProxy`: an HTTP proxy in front of a server that can corrupt or cut short the
  bodies of object GETs, to test that bad downloads are detected, and hold every request
  until a gate opens; it records each request's session token header. With
  ``verify_sha256`` it also does what S3 does and moto does not with a PUT's
  ``x-amz-checksum-sha256``: checks it (400 BadDigest) and returns it.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import boto3
from botocore.config import Config
from moto.server import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import BaseWSGIServer, make_server

from .ports import free_port

TEST_ACCESS_KEY = "AKIATESTGPULAB000001"
TEST_SECRET_KEY = "gpulab-test-secret-7f3a9c1e5b2d4f60"


class _TrackingHandler(MotoRequestHandler):
    def log_request(self, *args: object, **kwargs: object) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self.server.live_connections.add(self.connection)  # type: ignore[attr-defined]

    def finish(self) -> None:
        self.server.live_connections.discard(self.connection)  # type: ignore[attr-defined]
        with contextlib.suppress(OSError):
            super().finish()


class MotoS3Server:
    """moto's S3 server on loopback; restartable on the same port."""

    def __init__(self, port: int | None = None, host: str = "127.0.0.1") -> None:
        # ``host``: another address of this machine for clients elsewhere (a swarm's nodes)
        self.host = host
        self.port = port or free_port()
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def boto_client(self):
        """A boto3 S3 client of this server, with the test credentials."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=TEST_ACCESS_KEY,
            aws_secret_access_key=TEST_SECRET_KEY,
        )

    def start(self) -> MotoS3Server:
        app = DomainDispatcherApplication(create_backend_app)
        server = make_server(self.host, self.port, app, True, request_handler=_TrackingHandler)
        server.live_connections = set()  # type: ignore[attr-defined]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and cut every open connection (like a crashed server)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        for conn in list(server.live_connections):  # type: ignore[attr-defined]
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread:
            self._thread.join(timeout=10)

    def __enter__(self) -> MotoS3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class CheckingS3Server:
    """moto's S3 server that checks credentials, in a process of its own (moto's IAM check is
    a switch for its whole process, which :class:`MotoS3Server`'s share with the tests). Its
    first three requests make an IAM user that may do anything with S3 and its access key
    (``access_key``, ``secret_key``); from then on a request signed with anything else is
    refused as S3 refuses it (InvalidAccessKeyId, SignatureDoesNotMatch)."""

    #: the requests that make the user, its policy and its key before the check starts
    SETUP_REQUESTS = 3

    def __init__(self) -> None:
        self.port = free_port()
        self.access_key = ""
        self.secret_key = ""
        self._proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> CheckingS3Server:
        env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(self.SETUP_REQUESTS)}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 1),
            ):
                break
            if time.monotonic() > deadline or self._proc.poll() is not None:
                self.stop()
                raise RuntimeError("moto's S3 server did not start")
            time.sleep(0.2)
        iam = boto3.client(
            "iam",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="setup",
            aws_secret_access_key="setup",
        )
        iam.create_user(UserName="gpulab")
        iam.put_user_policy(
            UserName="gpulab",
            PolicyName="s3",
            PolicyDocument=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
                }
            ),
        )
        key = iam.create_access_key(UserName="gpulab")["AccessKey"]
        self.access_key, self.secret_key = key["AccessKeyId"], key["SecretAccessKey"]
        return self

    def boto_client(self):
        """A boto3 S3 client of this server, with the key that may."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def __enter__(self) -> CheckingS3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


Fault = Literal["none", "flip", "cut", "short"]


class FaultyProxy:
    """Forward HTTP to ``upstream``; damage the body of object GETs according to ``fault``.

    ``flip``: one byte changed (same length); ``cut``: the full Content-Length is announced but
    the connection closes half-way; ``short``: half the body, with a matching Content-Length.
    Listing requests (``?list-type``) and other methods pass through untouched. Ranged GETs
    (206) are damaged too. While ``gate`` is cleared, every request waits for it.
    ``verify_sha256``: see the module's docstring; ``bad_digests`` counts the refusals.
    """

    def __init__(
        self, upstream: str, fault: Fault = "none", *, verify_sha256: bool = False
    ) -> None:
        self.upstream = urlsplit(upstream)
        self.fault: Fault = fault
        self.verify_sha256 = verify_sha256
        self.bad_digests = 0
        self.damaged = 0
        self.requests: list[str] = []  # "METHOD /path?query", in order
        #: (method, its X-Amz-Security-Token header or "") of each request, in order: what
        #: session token the client was configured with
        self.tokens: list[tuple[str, str]] = []
        self.gate = threading.Event()
        self.gate.set()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                proxy.gate.wait(timeout=60)
                proxy.requests.append(f"{self.command} {self.path}")
                proxy.tokens.append((self.command, self.headers.get("X-Amz-Security-Token", "")))
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                sent_sha = self.headers.get("x-amz-checksum-sha256")
                if proxy.verify_sha256 and self.command == "PUT" and sent_sha:
                    actual = base64.b64encode(hashlib.sha256(body or b"").digest()).decode()
                    if actual != sent_sha:
                        proxy.bad_digests += 1
                        error = b"<Error><Code>BadDigest</Code><Message>SHA256</Message></Error>"
                        self.send_response(400)
                        self.send_header("Content-Length", str(len(error)))
                        self.end_headers()
                        self.wfile.write(error)
                        return
                else:
                    sent_sha = None
                conn = http.client.HTTPConnection(
                    proxy.upstream.hostname, proxy.upstream.port, timeout=30
                )
                headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                is_object_get = (
                    self.command == "GET"
                    and resp.status in (200, 206)
                    and "list-type" not in self.path
                    and self.path.strip("/").count("/") >= 1
                    and len(data) > 1
                )
                fault = proxy.fault if is_object_get else "none"
                send = data
                if fault == "flip":
                    mid = len(data) // 2
                    send = data[:mid] + bytes([data[mid] ^ 0xFF]) + data[mid + 1 :]
                elif fault in ("cut", "short"):
                    send = data[: len(data) // 2]
                if fault != "none":
                    proxy.damaged += 1
                self.send_response(resp.status)
                for name, value in resp.getheaders():
                    if name.lower() in ("content-length", "connection", "transfer-encoding"):
                        continue
                    self.send_header(name, value)
                if sent_sha and resp.status == 200:
                    self.send_header("x-amz-checksum-sha256", sent_sha)
                announced = len(data) if fault in ("cut", "none", "flip") else len(send)
                if self.command == "HEAD":
                    announced = int(resp.getheader("Content-Length") or 0)
                self.send_header("Content-Length", str(announced))
                if fault == "cut":
                    self.send_header("Connection", "close")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(send)
                if fault == "cut":
                    self.wfile.flush()
                    self.close_connection = True

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FaultyProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def credentials_file(directory) -> Path:
    """A store credentials file (mode 0600) for the test server's key, in ``directory``."""
    path = Path(directory) / "s3-credentials"
    path.touch(mode=0o600)
    path.write_text(
        f"AWS_ACCESS_KEY_ID={TEST_ACCESS_KEY}\nAWS_SECRET_ACCESS_KEY={TEST_SECRET_KEY}\n"
    )
    return path


def workspace_store_config(server: MotoS3Server, credentials: Path, bucket: str) -> str:
    """Hub configuration lines: the object store "s3" at ``server``, workspaces in ``bucket``."""
    return f"""
c.GpulabSettings.object_stores = {{
    "s3": {{
        "endpoint_url": "{server.endpoint}",
        "region": "us-east-1",
        "credentials": {{"file": "{credentials}"}},
    }},
}}
c.GpulabSettings.workspace_store = "s3"
c.GpulabSettings.workspace_bucket = "{bucket}"
"""


def raw_client(endpoint: str, **config):
    """A plain boto3 client of the test server, with the test credentials."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=TEST_ACCESS_KEY,
        aws_secret_access_key=TEST_SECRET_KEY,
        config=Config(s3={"addressing_style": "path"}, **config),
    )
