"""The rule of a live push (a push while the workload runs and may be writing): which files it
takes, and when a file it was reading is "in flux". Pure: values in, values out.

A live push never sends a half-written file as complete:

- it takes a file only when it has been unchanged for ``settle_s`` seconds at the scan (its
  mtime at least that old): a file being written is left for the next push;
- it takes a file only when the file's identity (inode), size and mtime are the same at the
  scan, once opened, and once hashed: a file that changed in between is in flux, left for the
  next push. What is uploaded is verified against that hash (the store checks the checksum
  sent with it, or the engine checks the ETag), so a change during the upload itself fails
  the upload instead of storing the change; a failed upload of a file that changed meanwhile
  is in flux too, not a failure;
- a file in flux is never entered in the manifest and its remote object is left as it was
  where the store checks the SHA-256 sent with an upload before storing it (S3, MinIO, the
  filesystem store); where the check comes after storing (a multipart upload; a store that
  ignores the checksum, whose ETag is checked after), the object keeps the SHA-256 of the
  hashed content in its metadata, which a pull verifies: it is refused, never taken as
  complete, and the next push sends the file again;
- it never deletes a remote object (not even for an ``rwd`` volume): a file deleted during a
  run may be a program's temporary step, and the final push at the stop mirrors deletions
  as it always did.

The final push (at the stop, the workload gone) takes every file as it is, as before.
"""

from __future__ import annotations

from typing import NamedTuple

#: seconds a file must have been unchanged before a live push takes it (``--settle-seconds``)
SETTLE_S = 10.0


class FileState(NamedTuple):
    """What is compared of a file before and after it is read."""

    ino: int
    size: int
    mtime_ns: int


def state_of(st) -> FileState:
    """The :class:`FileState` of an ``os.stat_result``."""
    return FileState(st.st_ino, st.st_size, st.st_mtime_ns)


def unsettled(mtime_ns: int, now_ns: int, settle_s: float) -> str | None:
    """Why a live push leaves a file whose mtime is ``mtime_ns`` alone at ``now_ns`` (it was
    written less than ``settle_s`` seconds ago), else None. An mtime in the future counts as
    just written."""
    age_s = (now_ns - mtime_ns) / 1e9
    if age_s >= settle_s:
        return None
    if age_s < 0:
        return "modified in the future (its clock is ahead): left for the final push"
    return f"written {age_s:.1f} s ago (under {settle_s:g} s): left for the next push"


def changed(before: FileState, after: FileState, when: str) -> str | None:
    """Why a file is in flux: its identity, size or mtime differ ``when`` (e.g. "while it
    was hashed"), else None."""
    if before == after:
        return None
    if before.ino != after.ino:
        what = "replaced"
    elif before.size != after.size:
        what = f"its size changed ({before.size} -> {after.size} bytes)"
    else:
        what = "modified"
    return f"{what} {when}: left for the next push"
