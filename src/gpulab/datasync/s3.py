"""S3 backend (boto3): adaptive/standard retries, multipart/ranged transfers, verification.

Verification, strongest first:
- uploads send the precomputed SHA-256 (``ChecksumSHA256``), which S3 checks server-side;
  the result is verified from the checksum the server returns or, when it returns none
  (moto), from the ETag, which is the MD5 of what the server received (single part) or the
  MD5 of the parts' MD5s (multipart, recomputed locally from the same part size);
- downloads are verified against the ``gpulab-sha256`` metadata written by uploads, else
  the object's full SHA-256/CRC checksum, else its (single- or multi-part) MD5 ETag.
A size mismatch or a body cut short always fails the object.
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit

from botocore.config import Config
from botocore.exceptions import (
    ClientError,
    FlexibleChecksumError,
    HTTPClientError,
    IncompleteReadError,
    ReadTimeoutError,
    ResponseStreamingError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from .backend import DELETE_BATCH, DeleteOutcome
from .credentials import Credentials
from .hashing import FileDigest, StreamHasher, hash_bytes, hash_file, open_target
from .models import IntegrityError, RemoteObject, RemoteUnavailable, Transferred
from .s3_settings import S3Settings

META_SHA256 = "gpulab-sha256"
#: the permission bits kept with an object (octal digits, e.g. ``755``)
META_MODE = "gpulab-mode"
#: ``symlink`` for a symbolic link, whose body is its target
META_TYPE = "gpulab-type"
_MD5_RE = re.compile(r"^[0-9a-f]{32}$")
_MULTIPART_RE = re.compile(r"^[0-9a-f]{32}-(\d+)$")
_BOTO_VALIDATED = ("ChecksumCRC32", "ChecksumCRC32C", "ChecksumCRC64NVME", "ChecksumSHA1")
_NOT_FOUND = {"404", "NoSuchBucket", "NotFound", "NoSuchKey"}
_CHUNK = 1024 * 1024


class ChangedWhileSending(Exception):
    """The file being uploaded ended before the size announced (it changed meanwhile)."""


class SizedBody(io.RawIOBase):
    """An upload's body: exactly ``size`` bytes of ``f``.

    It stops at ``size`` and raises :class:`ChangedWhileSending` if the file ends before, so
    that a file cut short fails at once instead of leaving the server waiting for bytes that
    never come. It rewinds only to the start (as botocore does to retry).
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


def _retries_exceeded() -> type[Exception]:
    # s3transfer is imported on first need (multipart and ranged transfers only)
    from s3transfer.exceptions import RetriesExceededError

    return RetriesExceededError


def _upload_failed() -> type[Exception]:
    from boto3.exceptions import S3UploadFailedError

    return S3UploadFailedError


@contextlib.contextmanager
def _translated(what: str) -> Iterator[None]:
    """Map botocore/s3transfer errors onto the engine's error classes."""
    try:
        yield
    except (BotoConnectionError, ReadTimeoutError) as exc:
        raise RemoteUnavailable(f"{what}: {exc}") from exc
    except (ResponseStreamingError, IncompleteReadError) as exc:
        raise IntegrityError(f"{what}: truncated, response body cut short ({exc})") from exc
    except FlexibleChecksumError as exc:
        raise IntegrityError(f"{what}: {exc}") from exc
    except _retries_exceeded() as exc:
        last = exc.last_exception
        if isinstance(last, BotoConnectionError | ReadTimeoutError):
            raise RemoteUnavailable(f"{what}: {last}") from exc
        raise IntegrityError(f"{what}: download failed after retries ({last})") from exc
    except _upload_failed() as exc:
        cause = exc.__context__
        if isinstance(cause, BotoConnectionError | ReadTimeoutError):
            raise RemoteUnavailable(f"{what}: {cause}") from exc
        raise


def meta_fields(metadata: dict[str, str] | None) -> tuple[int | None, bool]:
    """``(mode, link)`` an object's user metadata says: a mode that is not octal
    permission bits, or a type that is not ``symlink``, is none."""
    metadata = metadata or {}
    raw = metadata.get(META_MODE, "")
    mode = int(raw, 8) if re.fullmatch(r"[0-7]{1,4}", raw) else None
    return mode, metadata.get(META_TYPE) == "symlink"


def _client_error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


class S3Remote:
    """A bucket on an S3-compatible endpoint."""

    def __init__(
        self,
        bucket: str,
        *,
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        credentials: Credentials | None = None,
        settings: S3Settings | None = None,
        store_name: str | None = None,
        verify: bool | str = True,
    ) -> None:
        """``store_name``, when given, names the store in :attr:`identity` instead of the
        endpoint URL, so that a manifest stays valid if the store's address changes.
        ``verify``: the server's TLS certificate is checked against the system's CAs (True),
        the CA bundle at this path (a store behind a private CA), or not at all (False)."""
        self.bucket = bucket
        self.store_name = store_name
        self.endpoint_url = endpoint_url
        self.region = region
        self.settings = settings or S3Settings()
        self._credentials = credentials
        self.verify = verify
        #: the server answered a PUT with the SHA-256 it verified (see :meth:`digest`)
        self.server_verifies_sha256 = False

    @functools.cached_property
    def transfer_config(self) -> Any:
        """boto3's transfer manager settings, for objects above the multipart threshold."""
        from boto3.s3.transfer import TransferConfig

        s = self.settings
        return TransferConfig(
            multipart_threshold=s.multipart_threshold,
            multipart_chunksize=s.multipart_chunksize,
            max_concurrency=s.transfer_concurrency,
            use_threads=True,
        )

    @functools.cached_property
    def client(self) -> Any:
        """The boto3 client, made on first use (loading its service model takes ~0.2 s)."""
        import boto3
        import botocore.session

        s, credentials = self.settings, self._credentials
        # timestamps (LastModified) are never used: leaving them unparsed makes parsing a
        # listing page of 1000 keys about twice as cheap (the "nothing changed" pull is
        # mostly listing)
        core = botocore.session.get_session()
        core.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=str)
        session = boto3.session.Session(
            botocore_session=core,
            aws_access_key_id=credentials.access_key_id if credentials else None,
            aws_secret_access_key=credentials.secret_access_key if credentials else None,
            aws_session_token=credentials.session_token if credentials else None,
            region_name=self.region,
        )
        config = Config(
            retries={"mode": s.retry_mode, "max_attempts": s.max_attempts},
            max_pool_connections=s.max_pool_connections,
            connect_timeout=s.connect_timeout,
            read_timeout=s.read_timeout,
            tcp_keepalive=True,
            # the engine verifies every upload end to end (SHA-256 sent as x-amz-checksum-sha256,
            # checked against what the server reports); signing the payload too would make
            # botocore read every body once more before sending it on http:// endpoints
            s3={"addressing_style": s.addressing_style, "payload_signing_enabled": False},
            request_checksum_calculation="when_supported",
            response_checksum_validation="when_supported",
        )
        return session.client(
            "s3", endpoint_url=self.endpoint_url, config=config, verify=self.verify
        )

    def __repr__(self) -> str:
        return f"S3Remote({self.identity!r})"

    @property
    def identity(self) -> str:
        if self.store_name:
            return f"store:{self.store_name}/{self.bucket}"
        if self.endpoint_url:
            parts = urlsplit(self.endpoint_url)
            host = parts.hostname or ""
            port = f":{parts.port}" if parts.port else ""
            return f"s3+{parts.scheme}://{host}{port}/{self.bucket}"
        return f"s3://{self.region}/{self.bucket}"

    # -- buckets and listing -------------------------------------------------------------

    def ensure_bucket(self) -> bool:
        with _translated(f"bucket {self.bucket}"):
            try:
                self.client.head_bucket(Bucket=self.bucket)
                return False
            except ClientError as exc:
                if _client_error_code(exc) not in _NOT_FOUND:
                    raise
            kwargs: dict[str, Any] = {"Bucket": self.bucket}
            if self.region and self.region != "us-east-1":
                kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
            try:
                self.client.create_bucket(**kwargs)
            except ClientError as exc:
                if _client_error_code(exc) != "BucketAlreadyOwnedByYou":
                    raise
                return False
            return True

    def list(self, prefix: str, *, markers: bool = False) -> Iterator[RemoteObject]:
        paginator = self.client.get_paginator("list_objects_v2")
        with _translated(f"listing {self.bucket}/{prefix}"):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                for item in page.get("Contents", ()):
                    key = item["Key"]
                    if markers or not key.endswith("/"):
                        yield RemoteObject(key, int(item["Size"]), item["ETag"].strip('"'))

    def part_size_for(self, size: int) -> int | None:
        if size < self.settings.multipart_threshold:
            return None
        from s3transfer.utils import ChunksizeAdjuster

        return ChunksizeAdjuster().adjust_chunksize(self.settings.multipart_chunksize, size)

    # -- downloads -----------------------------------------------------------------------

    def download(self, obj: RemoteObject, dest: Path, fd: int | None = None) -> Transferred:
        """Ranged downloads go by name (boto3 writes ``<dest>.<random>``, then renames it);
        the others write through ``fd`` when given (see :func:`.hashing.open_target`)."""
        with _translated(f"get {obj.key}"):
            if obj.size >= self.settings.multipart_threshold:
                return self._download_ranged(obj.key, dest)
            return self._download_single(obj.key, dest, fd)

    def _hasher_for(
        self, key: str, etag: str, resp: dict[str, Any], *, streamed: bool
    ) -> StreamHasher | None:
        """A hasher computing SHA-256 plus whatever :meth:`_verify_download` will need;
        None if only botocore can verify this object (a CRC-32C/CRC-64/SHA-1 checksum and
        an ETag that is no MD5) and the body is not streamed through botocore."""
        if (resp.get("Metadata") or {}).get(META_SHA256):
            return StreamHasher()
        if _MULTIPART_RE.match(etag):
            part = self.client.head_object(Bucket=self.bucket, Key=key, PartNumber=1)
            return StreamHasher(part_size=int(part["ContentLength"]))
        full_sha = resp.get("ChecksumSHA256")
        if full_sha and "-" not in full_sha:
            return StreamHasher()
        if streamed and any(resp.get(name) for name in _BOTO_VALIDATED):
            return StreamHasher()
        crc = resp.get("ChecksumCRC32")
        if crc and "-" not in crc:
            return StreamHasher(crc32=True)
        if _MD5_RE.match(etag):
            return StreamHasher(md5=True)
        return None if not streamed else StreamHasher(md5=True)

    def _download_single(self, key: str, dest: Path, fd: int | None) -> Transferred:
        """One GET; the body is hashed as it is written (no second pass over the file)."""
        resp = self.client.get_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED")
        expected = int(resp["ContentLength"])
        etag = resp["ETag"].strip('"')
        body = resp["Body"]
        try:
            hasher = self._hasher_for(key, etag, resp, streamed=True)
            assert hasher is not None  # streamed: botocore validates what we cannot
            with open_target(dest, fd) as f:
                for chunk in body.iter_chunks(_CHUNK):
                    f.write(chunk)
                    hasher.update(chunk)
        finally:
            body.close()
        digest = hasher.digest()
        if digest.size != expected:
            raise IntegrityError(f"truncated: received {digest.size} of {expected} bytes")
        self._verify_download(digest, etag, resp, streamed=True)
        mode, link = meta_fields(resp.get("Metadata"))
        return Transferred(key, digest.size, etag, digest.sha256, mode, link)

    def _download_ranged(self, key: str, dest: Path) -> Transferred:
        head = self.client.head_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED")
        expected = int(head["ContentLength"])
        etag = head["ETag"].strip('"')
        hasher = self._hasher_for(key, etag, head, streamed=False)
        if hasher is None:
            raise IntegrityError(
                "cannot verify: the object has only a checksum botocore validates on whole "
                "GETs and no MD5 ETag; raise the multipart threshold above its size"
            )
        self.client.download_file(
            self.bucket, key, str(dest), ExtraArgs={}, Config=self.transfer_config
        )
        size = dest.stat().st_size
        if size != expected:
            raise IntegrityError(f"truncated: received {size} of {expected} bytes")
        mode, link = meta_fields(head.get("Metadata"))
        # parts arrive out of order: one sequential pass, computing only what is verified
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        with open(dest, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                hasher.update(view[:n])
        digest = hasher.digest()
        self._verify_download(digest, etag, head, streamed=False)
        return Transferred(key, size, etag, digest.sha256, mode, link)

    def _verify_download(
        self, digest: FileDigest, etag: str, resp: dict[str, Any], *, streamed: bool
    ) -> None:
        """Raise IntegrityError unless the content matches the strongest checksum known."""
        claimed = (resp.get("Metadata") or {}).get(META_SHA256)
        if claimed:
            if claimed != digest.sha256:
                raise IntegrityError("checksum mismatch: SHA-256 differs from the uploaded one")
            return
        if _MULTIPART_RE.match(etag):
            if digest.multipart_etag != etag:
                raise IntegrityError("checksum mismatch: multipart ETag differs")
            return
        full_sha = resp.get("ChecksumSHA256")
        if full_sha and "-" not in full_sha:
            if full_sha != digest.sha256_b64:
                raise IntegrityError("checksum mismatch: SHA-256 differs from the server's")
            return
        if streamed and any(resp.get(name) for name in _BOTO_VALIDATED):
            return  # botocore validated this checksum while the body was read
        crc = resp.get("ChecksumCRC32")
        if crc and "-" not in crc and digest.crc32 is not None:
            if crc != digest.crc32_b64:
                raise IntegrityError("checksum mismatch: CRC-32 differs from the server's")
            return
        if _MD5_RE.match(etag):
            if etag != digest.md5:
                raise IntegrityError("checksum mismatch: MD5 differs from the ETag")
            return
        raise IntegrityError("cannot verify: the server reports no usable checksum")

    # -- uploads and deletes -------------------------------------------------------------

    def digest(self, path: Path, size: int) -> FileDigest:
        """Hash ``path`` for :meth:`upload` in one read: SHA-256 (sent as the checksum and
        the ``gpulab-sha256`` metadata) and the MD5 (single PUT) or the part MD5s
        (multipart), which the ETag the server computes must match when it returns no
        checksum of its own. (Hashing while sending instead was measured: no faster on a
        small host, where the CPU, not the wait, is what runs out.)

        Once the server has answered a PUT with the SHA-256 it verified (S3 and MinIO do;
        moto does not), single PUTs skip the MD5: that proof is the server's, and MD5, at
        0.65 GB/s here against 1.6 GB/s for SHA-256, was most of the hashing CPU."""
        part_size = self.part_size_for(size)
        if part_size is not None:
            return hash_file(path, part_size=part_size)
        return hash_file(path, md5=not self.server_verifies_sha256)

    def upload(
        self, key: str, src: Path, digest: FileDigest, mode: int | None = None
    ) -> Transferred:
        metadata = {META_SHA256: digest.sha256}
        if mode is not None:
            metadata[META_MODE] = f"{mode:o}"
        with _translated(f"put {key}"):
            part_size = self.part_size_for(digest.size)
            if part_size is None:
                return self._upload_single(key, src, digest, metadata, mode)
            self.client.upload_file(
                str(src),
                self.bucket,
                key,
                ExtraArgs={"ChecksumAlgorithm": "SHA256", "Metadata": metadata},
                Config=self.transfer_config,
            )
            head = self.client.head_object(Bucket=self.bucket, Key=key)
            etag = head["ETag"].strip('"')
            if int(head["ContentLength"]) != digest.size:
                raise IntegrityError(
                    f"size mismatch: server has {head['ContentLength']} bytes, "
                    f"local file {digest.size}"
                )
            if etag != digest.multipart_etag:
                raise IntegrityError(
                    "server stored different content (multipart ETag differs): the file may "
                    "have changed during the upload"
                )
            return Transferred(key, digest.size, etag, digest.sha256, mode)

    def upload_link(self, key: str, target: bytes) -> Transferred:
        """One PUT whose body is the link's target, verified as a file's single PUT."""
        digest = hash_bytes(target)
        metadata = {META_SHA256: digest.sha256, META_TYPE: "symlink"}
        with _translated(f"put {key}"):
            resp = self.client.put_object(
                Bucket=self.bucket,
                Key=key,
                Body=target,
                ContentLength=digest.size,
                ChecksumSHA256=digest.sha256_b64,
                Metadata=metadata,
            )
        etag = resp["ETag"].strip('"')
        self._verify_upload(Path("/nonexistent"), digest, etag, resp.get("ChecksumSHA256"))
        return Transferred(key, digest.size, etag, digest.sha256, None, True)

    def _upload_single(
        self,
        key: str,
        src: Path,
        digest: FileDigest,
        metadata: dict[str, str],
        mode: int | None = None,
    ) -> Transferred:
        """One PUT of ``src``, whose SHA-256 and MD5 were computed in the same read pass. The
        server verifies the SHA-256 sent with it (S3 does; then it returns it) or computes the
        MD5 ETag, which must match: either way a file changed since it was hashed fails, and
        one cut short fails at once (:class:`SizedBody`)."""
        with open(src, "rb") as f:
            try:
                resp = self.client.put_object(
                    Bucket=self.bucket,
                    Key=key,
                    Body=SizedBody(f, digest.size),
                    ContentLength=digest.size,
                    ChecksumSHA256=digest.sha256_b64,
                    Metadata=metadata,
                )
            except (ChangedWhileSending, HTTPClientError) as exc:
                cause = exc.kwargs.get("error") if isinstance(exc, HTTPClientError) else exc
                if not isinstance(cause, ChangedWhileSending):
                    raise
                raise IntegrityError(f"the file changed during the upload: {cause}") from exc
        etag = resp["ETag"].strip('"')
        self._verify_upload(src, digest, etag, resp.get("ChecksumSHA256"))
        return Transferred(key, digest.size, etag, digest.sha256, mode)

    def _verify_upload(
        self, src: Path, digest: FileDigest, etag: str, returned: str | None
    ) -> None:
        """Raise IntegrityError unless the server stored what ``digest`` describes: by the
        SHA-256 it returns (it verified the one sent), else by its MD5 ETag."""
        if returned:
            if returned != digest.sha256_b64:
                raise IntegrityError("server stored different content (SHA-256 differs)")
            self.server_verifies_sha256 = True
            return
        md5 = digest.md5
        if md5 is None:  # hashed without MD5, but this answer has no checksum: read again
            again = hash_file(src, md5=True)
            if again.sha256 != digest.sha256:
                raise IntegrityError("the file changed during the upload")
            md5 = again.md5
        if etag != md5:
            raise IntegrityError(
                "server stored different content (MD5 ETag differs): the file may have "
                "changed during the upload"
            )

    def delete(self, key: str, expected_etag: str) -> DeleteOutcome:
        with _translated(f"delete {key}"):
            try:
                head = self.client.head_object(Bucket=self.bucket, Key=key)
            except ClientError as exc:
                if _client_error_code(exc) in _NOT_FOUND:
                    return "missing"
                raise
            if head["ETag"].strip('"') != expected_etag:
                return "changed"
            self.client.delete_object(Bucket=self.bucket, Key=key)
            return "deleted"

    def delete_many(self, keys: Sequence[str]) -> list[tuple[str, str]]:
        if len(keys) > DELETE_BATCH:
            raise ValueError(f"at most {DELETE_BATCH} keys per DeleteObjects call")
        if not keys:
            return []
        with _translated(f"delete {len(keys)} objects"):
            resp = self.client.delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True},
            )
        return [
            (str(e.get("Key", "")), f"{e.get('Code', 'error')}: {e.get('Message', '')}".strip())
            for e in resp.get("Errors", ())
        ]
