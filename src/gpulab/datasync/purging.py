"""``purge``: delete every object under a (non-empty) prefix, in batched requests while the
listing goes on (a deleted notebook's workspace, for instance). Local directories are not
touched."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor, as_completed

from .backend import DELETE_BATCH, Remote
from .engine import ProgressCallback, SyncOptions, _reason, _Run
from .localtree import normalize_prefix
from .models import SyncReport


def purge(
    remote: Remote,
    prefix: str,
    *,
    progress: ProgressCallback | None = None,
    options: SyncOptions | None = None,
) -> SyncReport:
    """Delete every object under ``prefix`` (directory markers included), in batches of
    :data:`~.backend.DELETE_BATCH` keys deleted while the listing goes on.

    ``prefix`` is a directory: ``"data"`` purges ``data/...`` but not ``data-old/...``. An
    empty prefix is refused (ValueError), so a whole bucket is never wiped by mistake.
    Local directories and their manifests are not touched.
    """
    opts = options or SyncOptions()
    norm = normalize_prefix(prefix)
    if not norm:
        raise ValueError(
            "refusing to purge with an empty prefix (it would delete the whole bucket)"
        )
    report = SyncReport("purge", remote.bucket, norm, "purge")
    run = _Run(report, progress, opts.progress_interval_s)
    pending: dict[Future[list[tuple[str, str]]], list[str]] = {}

    def settle(fut: Future[list[tuple[str, str]]]) -> None:
        batch = pending.pop(fut)
        try:
            failed = fut.result()
        except Exception as exc:
            failed = [(key, _reason(exc)) for key in batch]
        for key, reason in failed:
            run.fail(key, f"not deleted: {reason}")
        for _ in range(len(batch) - len(failed)):
            run.deleted()
        run.emit()

    with ThreadPoolExecutor(max_workers=max(1, min(opts.workers, 4))) as pool:
        batch: list[str] = []
        try:
            for obj in remote.list(norm, markers=True):
                report.objects_total += 1
                batch.append(obj.key)
                if len(batch) == DELETE_BATCH:
                    pending[pool.submit(remote.delete_many, batch)] = batch
                    batch = []
                for fut in [f for f in pending if f.done()]:
                    settle(fut)
        except Exception as exc:
            run.fail("", f"cannot list {remote.bucket}/{norm}: {_reason(exc)}")
        if batch:
            pending[pool.submit(remote.delete_many, batch)] = batch
        for fut in as_completed(list(pending)):
            settle(fut)
    return run.finish()
