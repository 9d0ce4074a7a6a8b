"""Single-request GETs (objects below the multipart threshold), signed with SigV4, sent by
urllib3: the one hand-written S3 request gpulab keeps.

A pull moves thousands of objects; through botocore's generic request pipeline (event hooks,
endpoint rules, response-shape parsing) each GET cost about twice the client CPU, and large
pulls were 1.4-1.8x slower (bench/README.md). So GETs of objects below the multipart threshold
go this way, with urllib3's ``Retry`` (exponential backoff; connection errors, 429 and 5xx)
as the retry policy, the body read into one reused buffer per thread. Everything else
(listings, bucket checks and creation, PUTs, multipart and ranged transfers, deletes, objects
whose checksum only botocore can validate) goes through boto3: measured, gpulab's own
listing and PUT were less than 1.3x faster. Only explicit endpoints with path-style addressing
use it; AWS's own endpoints go through boto3 entirely.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import urllib3
from botocore.exceptions import ClientError
from botocore.httpsession import get_cert_path
from urllib3.exceptions import HTTPError, MaxRetryError, ReadTimeoutError
from urllib3.util import Retry, Timeout

from .credentials import Credentials
from .hashing import open_target
from .models import IntegrityError, RemoteUnavailable
from .sigv4 import host_header, signer_for

_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
_STATUS_CODES = {301: "PermanentRedirect", 400: "BadRequest", 403: "AccessDenied", 404: "NotFound"}
_META_PREFIX = "x-amz-meta-"
_CHECKSUM_PREFIX = "x-amz-checksum-"
_CHECKSUM_NAMES = {
    "crc32": "ChecksumCRC32",
    "crc32c": "ChecksumCRC32C",
    "crc64nvme": "ChecksumCRC64NVME",
    "sha1": "ChecksumSHA1",
    "sha256": "ChecksumSHA256",
}


@dataclass(frozen=True)
class ObjectHeaders:
    """What a GET response says about the object, in boto3's names (see
    :meth:`as_response`) so that one verification routine serves both paths."""

    size: int
    etag: str
    metadata: dict[str, str]
    checksums: dict[str, str]

    @classmethod
    def parse(cls, headers: Mapping[str, str]) -> ObjectHeaders:
        metadata: dict[str, str] = {}
        checksums: dict[str, str] = {}
        for name, value in headers.items():
            low = name.lower()
            if low.startswith(_META_PREFIX):
                metadata[low[len(_META_PREFIX) :]] = value
            elif low.startswith(_CHECKSUM_PREFIX) and low[len(_CHECKSUM_PREFIX) :] in (
                _CHECKSUM_NAMES
            ):
                checksums[_CHECKSUM_NAMES[low[len(_CHECKSUM_PREFIX) :]]] = value
        return cls(
            size=int(headers.get("Content-Length") or 0),
            etag=(headers.get("ETag") or "").strip('"'),
            metadata=metadata,
            checksums=checksums,
        )

    def as_response(self) -> dict[str, Any]:
        return {"Metadata": self.metadata, **self.checksums}


def _client_error(status: int, body: bytes, operation: str) -> ClientError:
    """The ClientError boto3 would raise for this error response."""
    code = _STATUS_CODES.get(status, str(status))
    message = f"HTTP {status}"
    with contextlib.suppress(ET.ParseError):
        if body:  # S3 explains itself in an XML body, except for HEAD requests
            root = ET.fromstring(body)
            code = root.findtext("Code") or code
            message = root.findtext("Message") or message
    error = {"Code": code, "Message": message}
    return ClientError({"Error": error, "ResponseMetadata": {"HTTPStatusCode": status}}, operation)


class DirectS3:
    """Signed GETs from one bucket of an S3 endpoint with path-style addressing."""

    def __init__(
        self,
        endpoint_url: str,
        bucket: str,
        *,
        region: str,
        credentials: Credentials | None,
        max_attempts: int,
        connect_timeout: float,
        read_timeout: float,
        pool_size: int,
    ) -> None:
        parts = urlsplit(endpoint_url)
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.bucket = bucket
        self._bucket_path = f"{parts.path.rstrip('/')}/{quote(bucket, safe='')}"
        self._host = host_header(endpoint_url)
        self._signer = signer_for(credentials, region)
        self._retry = Retry(
            total=max(0, max_attempts - 1),
            backoff_factor=0.25,
            backoff_jitter=0.25,
            status_forcelist=_RETRY_STATUS,
            allowed_methods=None,  # GETs only: idempotent
            raise_on_status=False,
            respect_retry_after_header=True,
        )
        tls: dict[str, Any] = {}
        if parts.scheme == "https":
            tls["ca_certs"] = os.environ.get("AWS_CA_BUNDLE") or get_cert_path(True)
        self._pool = urllib3.PoolManager(
            num_pools=4,
            maxsize=pool_size,
            block=False,
            timeout=Timeout(connect=connect_timeout, read=read_timeout),
            **tls,
        )

    # -- plumbing ------------------------------------------------------------------------

    def _path(self, key: str = "") -> str:
        path = self._bucket_path
        if key:
            path += "/" + quote(key, safe="/~")
        return path

    def _request(
        self, method: str, path: str, *, headers: dict[str, str]
    ) -> urllib3.BaseHTTPResponse:
        send = dict(headers)
        if self._signer is not None:
            send = self._signer.sign(method, self._host, path, send)
        try:
            return self._pool.request(
                method,
                self.origin + path,
                headers=send,
                retries=self._retry,
                preload_content=False,
                redirect=False,
            )
        except HTTPError as exc:  # retries spent (MaxRetryError names the last cause)
            cause = exc.reason if isinstance(exc, MaxRetryError) else exc
            raise RemoteUnavailable(f"{method} {path}: {cause}") from exc

    # -- the request -------------------------------------------------------------------

    def get(self, key: str) -> urllib3.BaseHTTPResponse:
        """A streamed GET with the object's checksums asked for; raises ClientError."""
        resp = self._request("GET", self._path(key), headers={"x-amz-checksum-mode": "ENABLED"})
        if resp.status != 200:
            data = resp.read()
            resp.release_conn()
            raise _client_error(resp.status, data, "GetObject")
        return resp


_BUFFER_SIZE = 1024 * 1024
_buffers = threading.local()


def _read_into(raw: http.client.HTTPResponse, view: memoryview) -> int:
    """``raw.readinto(view)`` with the read errors in the engine's terms (write errors, such
    as a full disk, are not the response's fault and pass as they are)."""
    try:
        return raw.readinto(view)
    except TimeoutError as exc:  # socket.timeout: the read timeout passed
        raise RemoteUnavailable(f"reading the response: {exc}") from exc
    except (OSError, http.client.HTTPException) as exc:  # reset, bad chunking: cut short
        raise IntegrityError(f"truncated, response body cut short ({exc})") from exc


@contextlib.contextmanager
def _releasing(resp: urllib3.BaseHTTPResponse, raw: http.client.HTTPResponse) -> Iterator[None]:
    """Give the connection back to the pool if the body was read to its end, else drop it."""
    complete = False
    try:
        yield
        complete = True
    finally:
        if complete and raw.isclosed():
            resp.release_conn()  # back to the pool for keep-alive servers
        else:
            resp.close()  # half-read or cut short: the connection cannot be reused


def stream_body(resp: urllib3.BaseHTTPResponse, sink: Callable[[memoryview], object]) -> int:
    """Feed the body of a streamed response to ``sink`` in pieces of up to 1 MiB; return the
    number of bytes read (a body cut short just ends early: compare with the size expected).

    The bytes stored are read as they are (no content decoding) into one buffer per thread,
    reused: reading through urllib3 makes a new bytes object per piece and copies it twice,
    and measured on a 2-core VM, 4 x 256 MiB with SHA-256 to disk took 1.2 s of CPU this way
    against 2.1-4.0 s. ``sink`` must not keep the view it is given.
    """
    raw = getattr(resp, "_fp", None)  # the http.client response under urllib3's
    if not isinstance(raw, http.client.HTTPResponse):
        n = 0
        for data in read_body(resp, _BUFFER_SIZE):
            sink(memoryview(data))
            n += len(data)
        return n
    buf = getattr(_buffers, "buf", None)
    if buf is None:
        buf = _buffers.buf = bytearray(_BUFFER_SIZE)
    view = memoryview(buf)
    total = 0
    with _releasing(resp, raw):
        while n := _read_into(raw, view):
            sink(view[:n])
            total += n
    return total


def receive_file(
    resp: urllib3.BaseHTTPResponse,
    dest: Path,
    on_piece: Callable[[memoryview], object],
    *,
    fd: int | None = None,
) -> int:
    """Write the body of a streamed response to ``dest`` (created or emptied; through ``fd``,
    an empty file's descriptor of ``dest``, when given, left open), passing each piece to
    ``on_piece`` (the hasher) as it arrives; return the number of bytes received."""
    with open_target(dest, fd) as f:

        def write(piece: memoryview) -> None:
            f.write(piece)
            on_piece(piece)

        return stream_body(resp, write)


def read_body(resp: urllib3.BaseHTTPResponse, chunk: int) -> Iterator[bytes]:
    """The body of a streamed response; a body cut short raises IntegrityError."""
    complete = False
    try:
        while data := resp.read(chunk, decode_content=False):  # the bytes as stored
            yield data
        complete = True
    except ReadTimeoutError as exc:
        raise RemoteUnavailable(f"reading the response: {exc}") from exc
    except HTTPError as exc:  # IncompleteRead, reset: a body cut short
        raise IntegrityError(f"truncated, response body cut short ({exc})") from exc
    finally:
        if complete:
            resp.release_conn()  # back to the pool for keep-alive servers
        else:
            resp.close()  # half-read: the connection cannot be reused
