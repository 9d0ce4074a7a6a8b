"""The hot S3 requests (list, head bucket, get, put), signed with SigV4, sent by urllib3.

A sync moves thousands of small objects; for each, botocore's generic request pipeline
(event hooks, endpoint rules, user-agent assembly, response-shape parsing) costs about
2.5 ms of CPU, against about 1 ms for the same request signed with SigV4 alone and sent over
a urllib3 connection pool. (The signer is :mod:`.sigv4`, which agrees with botocore's
``S3SigV4Auth`` header for header and loads without botocore.) On a small host that shares
its cores with the workloads (or with the object store), that CPU is what limits objects
per second.

So the four requests a sync repeats per object or per page go this way, with urllib3's
``Retry`` (exponential backoff; connection errors, 429 and 5xx) as the retry policy.
Everything else (bucket creation, multipart and ranged transfers, deletes, objects whose
checksum only botocore can validate) stays with boto3. Only explicit endpoints with
path-style addressing use it; AWS's own endpoints go through boto3 entirely.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import os
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote, unquote_plus, urlencode, urlsplit

import urllib3
from botocore.exceptions import ClientError
from botocore.httpsession import get_cert_path
from urllib3.exceptions import HTTPError, MaxRetryError, ReadTimeoutError
from urllib3.util import Retry, Timeout

from .credentials import Credentials
from .hashing import open_target
from .models import IntegrityError, RemoteObject, RemoteUnavailable
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
#: the most keys S3 returns in one listing page (and its default)
S3_PAGE = 1000


def list_query(prefix: str, page_size: int, token: str | None = None) -> dict[str, str]:
    """The query of a ListObjectsV2 page (keys URL-encoded by the server, as boto3 asks too,
    so that any key survives XML)."""
    query = {"list-type": "2", "prefix": prefix, "encoding-type": "url"}
    if page_size != S3_PAGE:
        query["max-keys"] = str(page_size)
    if token:
        query["continuation-token"] = token
    return query


def encode_query(query: dict[str, str]) -> str:
    """``query`` sorted and percent-encoded as SigV4 signs it (``/`` included)."""
    return urlencode(sorted(query.items()), quote_via=quote)


def bucket_path(endpoint_url: str, bucket: str) -> str:
    """The path of ``bucket`` on a path-style endpoint."""
    return f"{urlsplit(endpoint_url).path.rstrip('/')}/{quote(bucket, safe='')}"


@dataclass(frozen=True)
class ObjectHeaders:
    """What a GET/PUT response says about the object, in boto3's names (see
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


class ChangedWhileSending(Exception):
    """The file being uploaded ended before the size announced (it changed meanwhile)."""


class SizedBody(io.RawIOBase):
    """An upload's body: exactly ``size`` bytes of ``f``.

    It stops at ``size`` and raises :class:`ChangedWhileSending` if the file ends before, so
    that a file cut short fails at once instead of leaving the server waiting for bytes that
    never come. It rewinds only to the start (as urllib3 does to retry).
    """

    def __init__(self, f: BinaryIO, size: int) -> None:
        self._f = f
        self._size = size
        self._sent = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._sent

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        if (pos, whence) != (0, io.SEEK_SET):
            raise io.UnsupportedOperation("only a rewind to the start")
        self._f.seek(0)
        self._sent = 0
        return 0

    def read(self, n: int | None = -1) -> bytes:
        left = self._size - self._sent
        if left <= 0:
            return b""
        data = self._f.read(left if n is None or n < 0 else min(n, left))
        if not data:
            raise ChangedWhileSending(f"the file ended after {self._sent} of {self._size} bytes")
        self._sent += len(data)
        return data


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


def _ns(root: ET.Element) -> str:
    return root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""


class DirectS3:
    """Signed requests to one bucket of an S3 endpoint with path-style addressing."""

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
        self._bucket_path = bucket_path(endpoint_url, bucket)
        self._host = host_header(endpoint_url)
        self._signer = signer_for(credentials, region)
        self._retry = Retry(
            total=max(0, max_attempts - 1),
            backoff_factor=0.25,
            backoff_jitter=0.25,
            status_forcelist=_RETRY_STATUS,
            allowed_methods=None,  # every request here is idempotent (GET, HEAD, PUT)
            raise_on_status=False,
            respect_retry_after_header=True,
        )
        tls: dict[str, Any] = {}
        if parts.scheme == "https":
            tls["ca_certs"] = os.environ.get("AWS_CA_BUNDLE") or get_cert_path(True)
        # a large send block: http.client's default of 8 KiB means 32,768 reads per 256 MiB
        self._pool = urllib3.PoolManager(
            num_pools=4,
            maxsize=pool_size,
            block=False,
            timeout=Timeout(connect=connect_timeout, read=read_timeout),
            blocksize=1024 * 1024,
            **tls,
        )

    # -- plumbing ------------------------------------------------------------------------

    def _path(self, key: str = "") -> str:
        path = self._bucket_path
        if key:
            path += "/" + quote(key, safe="/~")
        return path

    def _request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        body: BinaryIO | None = None,
        stream: bool = False,
    ) -> urllib3.BaseHTTPResponse:
        url = path + ("?" + encode_query(query) if query else "")
        send = dict(headers or {})
        if self._signer is not None:  # bodies unsigned: integrity comes from the checksums
            send = self._signer.sign(method, self._host, url, send, has_body=body is not None)
        try:
            return self._pool.request(
                method,
                self.origin + url,
                headers=send,
                body=body,
                retries=self._retry,
                preload_content=not stream,
                redirect=False,
            )
        except HTTPError as exc:  # retries spent (MaxRetryError names the last cause)
            cause = exc.reason if isinstance(exc, MaxRetryError) else exc
            raise RemoteUnavailable(f"{method} {path}: {cause}") from exc

    # -- the four requests ---------------------------------------------------------------

    def bucket_exists(self) -> bool:
        resp = self._request("HEAD", self._path())
        if resp.status == 200:
            return True
        if resp.status == 404:
            return False
        raise _client_error(resp.status, b"", "HeadBucket")

    def list(self, prefix: str, *, page_size: int = S3_PAGE) -> Iterator[RemoteObject]:
        """ListObjectsV2 pages, parsed with ElementTree (keys URL-encoded by the server).

        A ``page_size`` above S3's 1,000 is valid S3 (a server returns at most what it
        allows); a server that refuses it with a 400 is asked again for 1,000 a page."""
        token: str | None = None
        while True:
            resp = self._request("GET", self._path(), query=list_query(prefix, page_size, token))
            status, data = resp.status, resp.data
            if status == 400 and page_size > S3_PAGE:
                page_size = S3_PAGE
                continue
            if status != 200:
                raise _client_error(status, data, "ListObjectsV2")
            root = ET.fromstring(data)
            ns = _ns(root)
            encoded = (root.findtext(f"{ns}EncodingType") or "").lower() == "url"
            for item in root.iterfind(f"{ns}Contents"):
                key = item.findtext(f"{ns}Key") or ""
                yield RemoteObject(
                    unquote_plus(key) if encoded else key,
                    int(item.findtext(f"{ns}Size") or 0),
                    (item.findtext(f"{ns}ETag") or "").strip('"'),
                )
            if (root.findtext(f"{ns}IsTruncated") or "").lower() != "true":
                return
            token = root.findtext(f"{ns}NextContinuationToken")
            if not token:
                raise IntegrityError("listing truncated without a continuation token")

    def get(self, key: str) -> urllib3.BaseHTTPResponse:
        """A streamed GET with the object's checksums asked for; raises ClientError."""
        resp = self._request(
            "GET", self._path(key), headers={"x-amz-checksum-mode": "ENABLED"}, stream=True
        )
        if resp.status != 200:
            data = resp.read()
            resp.release_conn()
            raise _client_error(resp.status, data, "GetObject")
        return resp

    def put(self, key: str, body: BinaryIO, size: int, headers: dict[str, str]) -> ObjectHeaders:
        """PUT ``size`` bytes read from ``body`` (rewound by urllib3 on a retry)."""
        all_headers = {"Content-Length": str(size), **headers}
        resp = self._request("PUT", self._path(key), headers=all_headers, body=body)
        if resp.status != 200:
            raise _client_error(resp.status, resp.data, "PutObject")
        return ObjectHeaders.parse(resp.headers)


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
