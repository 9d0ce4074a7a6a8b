"""The per-user disk quota on what workloads pull onto a node (pure: values in, values out).

What counts: the bytes a user's workloads bring onto a node's disk through gpulab, i.e. each
volume pulled from an object store (a job's or a notebook's data volumes, read-only or
writable, and a notebook's workspace: the objects' total size under the volume's prefix) and
each git clone of a job (the pack received and the files checked out). One booking per Docker
volume and node, held in the database (:mod:`gpulab.disk_ledger`) from before the pull until
the volume is removed. What a running workload writes into its volumes is not counted.

The quota of a user is their own (``user_disk_quotas``), else the most generous of their
groups' (``group_disk_quotas``), else the default (``disk_quota``), as for GPUs and jobs;
``None`` means unlimited.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .resources import ResourceError, most_generous, own_else_groups, parse_memory

KiB, MiB, GiB = 1024, 1024**2, 1024**3
#: the default quota of a user (``c.GpulabSettings.disk_quota``)
DEFAULT_DISK_QUOTA = "200G"
#: the default cap of one git repository (``c.GpulabSettings.git_max_bytes``)
DEFAULT_GIT_MAX_BYTES = "10G"
#: git sources are the one kind of booking whose size is not known before it is fetched:
#: they book at most this many times the per-repository cap (pack and checkout are capped
#: separately, so a clone within its cap may take twice it on disk)
GIT_DISK_FACTOR = 2


def parse_size(value, name: str) -> int | None:
    """A quota or cap as the operator writes it (``"200G"``, ``"512M"``, a byte count, or
    None for unlimited) in bytes; ValueError naming the setting otherwise."""
    if value is None:
        return None
    try:
        return parse_memory(value, name)
    except ResourceError as e:
        raise ValueError(str(e)) from None


def disk_quota_for(
    user: str,
    groups: Iterable[str],
    default: int | None,
    per_user: Mapping[str, int | None],
    per_group: Mapping[str, int | None],
) -> int | None:
    """The user's own quota wins; else the most generous of their groups'; else the default."""
    return own_else_groups(user, groups, default, per_user, per_group, most_generous)


def human(n: int | float) -> str:
    """Bytes as a person reads them: 512 B, 3.0 KiB, 1.5 MiB, 200.0 GiB."""
    n = max(0, n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


@dataclass(frozen=True)
class DiskCheck:
    """The outcome of checking one booking against a quota."""

    allowed: bool
    #: bytes the booking gets (what was asked, or for a git clone what is left, if less)
    granted: int
    #: bytes the owner's other bookings hold
    held: int
    #: what the quota leaves besides those (None: unlimited)
    left: int | None


def check_booking(
    want: int, held: int, quota: int | None, *, up_to: bool = False, least: int = 1
) -> DiskCheck:
    """May a booking of ``want`` bytes be added to ``held`` bytes under ``quota``?

    ``up_to`` (a git clone, whose size is not known before it arrives): the booking gets what
    the quota leaves if that is less than ``want``, as long as it is at least ``least``."""
    want = max(0, int(want))
    if quota is None:
        return DiskCheck(True, want, held, None)
    left = max(0, quota - held)
    if want <= left:
        return DiskCheck(True, want, held, left)
    if up_to and left >= least:
        return DiskCheck(True, left, held, left)
    return DiskCheck(False, 0, held, left)


_WHAT_TO_DO = (
    "delete the notebooks you no longer need, wait for your ended jobs' volumes to be "
    "removed, or ask an administrator for a larger quota"
)


def pull_refusal(label: str, size: int, quota: int, held: int) -> str:
    """Why volume ``label`` (``size`` bytes in its store) was not pulled."""
    left = max(0, quota - held)
    return (
        f"volume {label} was not pulled: it holds {human(size)}, more than the {human(left)} "
        f"left of your disk quota of {human(quota)} (your workloads' volumes and git clones "
        f"hold {human(held)}); {_WHAT_TO_DO}"
    )


def clone_refusal(what: str, quota: int, held: int) -> str:
    """Why the clone of ``what`` was not even started: nothing is left of the quota."""
    return (
        f"clone of {what} was not started: your disk quota of {human(quota)} is used up "
        f"(your workloads' volumes and git clones hold {human(held)}); {_WHAT_TO_DO}"
    )


def clone_over(what: str, granted: int, quota: int, held: int) -> str:
    """A clone that grew past what the quota left for it while it arrived."""
    return (
        f"clone of {what} failed: the repository is larger than the {human(granted)} left of "
        f"your disk quota of {human(quota)} (your workloads' volumes and git clones hold "
        f"{human(held)}); nothing of it was kept; {_WHAT_TO_DO}"
    )
