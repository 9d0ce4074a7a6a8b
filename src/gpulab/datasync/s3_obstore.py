"""The direct requests (list, bucket check, GET and PUT below the multipart threshold) sent
by ``obstore`` (Rust's object_store: its own signer, connection pool and retries) instead of
gpulab's signed urllib3 requests: the library-only variant measured in bench/README.md.
Experimental: ``gpulab-sync --transport obstore``, with obstore installed."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from .credentials import Credentials
from .models import RemoteObject, RemoteUnavailable

#: attributes obstore reports that are not user metadata
_STANDARD = {
    "Content-Type",
    "Content-Encoding",
    "Content-Disposition",
    "Content-Language",
    "Cache-Control",
}


def _error(exc: Exception, what: str) -> Exception:
    from obstore.exceptions import NotFoundError, PermissionDeniedError, UnauthenticatedError

    if isinstance(exc, NotFoundError):
        return ClientError({"Error": {"Code": "NotFound", "Message": str(exc)}}, what)
    if isinstance(exc, PermissionDeniedError | UnauthenticatedError):
        return ClientError({"Error": {"Code": "AccessDenied", "Message": str(exc)}}, what)
    return RemoteUnavailable(f"{what}: {exc}")


class ObjectAnswer:
    """What a GET says about the object, in the names :class:`.s3.S3Remote` verifies with."""

    def __init__(self, result: Any) -> None:
        meta = result.meta
        self.result = result
        self.size = int(meta["size"])
        self.etag = (meta.get("e_tag") or "").strip('"')
        self.metadata = {k.lower(): v for k, v in result.attributes.items() if k not in _STANDARD}

    def as_response(self) -> dict[str, Any]:
        return {"Metadata": self.metadata}


class ObstoreS3:
    """One bucket through obstore's S3Store (path-style, as the direct requests)."""

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
        import obstore
        from obstore.store import S3Store

        self._ob = obstore
        kwargs: dict[str, Any] = {}
        if credentials is not None:
            kwargs["access_key_id"] = credentials.access_key_id
            kwargs["secret_access_key"] = credentials.secret_access_key
            if credentials.session_token:
                kwargs["session_token"] = credentials.session_token
        else:
            kwargs["skip_signature"] = True
        self.store = S3Store(
            bucket,
            endpoint=endpoint_url,
            region=region,
            virtual_hosted_style_request=False,
            unsigned_payload=True,  # as the direct requests: integrity from the checksums
            client_options={
                "allow_http": endpoint_url.startswith("http://"),
                "connect_timeout": timedelta(seconds=connect_timeout),
                "read_timeout": timedelta(seconds=read_timeout),
                "pool_max_idle_per_host": str(pool_size),
            },
            retry_config={"max_retries": max(0, max_attempts - 1)},
            **kwargs,
        )

    def bucket_exists(self) -> bool:
        try:
            self._ob.list_with_delimiter(self.store, prefix="gpulab-bucket-check/")
        except Exception as exc:  # noqa: BLE001 - mapped below
            if "<Code>NoSuchBucket</Code>" in str(exc):
                return False
            raise _error(exc, "HeadBucket") from exc
        return True

    def list(self, prefix: str) -> Iterator[RemoteObject]:
        try:
            for batch in self._ob.list(self.store, prefix=prefix or None, chunk_size=1000):
                for meta in batch:
                    yield RemoteObject(
                        meta["path"], int(meta["size"]), (meta.get("e_tag") or "").strip('"')
                    )
        except Exception as exc:  # noqa: BLE001 - mapped
            raise _error(exc, "ListObjectsV2") from exc

    def get(self, key: str) -> ObjectAnswer:
        try:
            return ObjectAnswer(self._ob.get(self.store, key))
        except Exception as exc:  # noqa: BLE001 - mapped
            raise _error(exc, "GetObject") from exc

    def put(self, key: str, src: Path, metadata: dict[str, str]) -> str:
        """One PUT of ``src``; the ETag the server answered."""
        try:
            result = self._ob.put(self.store, key, src, attributes=metadata, use_multipart=False)
        except Exception as exc:  # noqa: BLE001 - mapped
            raise _error(exc, "PutObject") from exc
        return (result.get("e_tag") or "").strip('"')
