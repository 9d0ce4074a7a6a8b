"""Fractional GPUs: which devices may be shared, in how many slots, and what a share is (pure).

The admin declares shareable devices and their slot count (``GpulabSettings.gpu_sharing``,
for example ``{"0": 4}``: device 0 in quarters). A notebook that asks for a fraction ``f`` of a
GPU takes ``f x slots`` slots of one shareable device; the ledger books one row per slot
(``share`` 1..slots), so the database's uniqueness on (device, share) keeps a device from
being handed out beyond its slots. A whole-GPU workload takes a device only when it has no row
at all, and a shared slot is never taken on a device a whole-GPU workload holds.

What the sharers get is the same as a whole GPU's (the device, by its ID) and their share
(``GPULAB_GPU_FRACTION``). Sharing is time-slicing, without isolation: the driver
time-slices the sharers' kernels and nothing holds one to its share; a sharer can use all of
the device's memory and compute. Isolation is a MIG device's, which the inventory lists as a
device of its own. The ``mps`` mode (NVIDIA MPS client variables) was removed: its limits were
environment variables a user could unset, and nothing ran the MPS control daemon
(:data:`MPS_REMOVED`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .inventory import GpuDevice

#: the most slots a device may be cut into (a share below 1/16 of a GPU is not useful work)
MAX_SLOTS = 16
#: the one way sharers share a device (``GpulabSettings.gpu_sharing_mode``)
SHARING_MODES = ("time-slicing",)
#: why a configuration that still asks for MPS is refused, and what to use instead
MPS_REMOVED = (
    "c.GpulabSettings.gpu_sharing_mode = 'mps' was removed: its limits were CUDA_MPS_* "
    "variables in the sharers' own environment, which a user can unset, and gpulab never "
    "started the MPS control daemon. Remove the line: shared GPUs (gpu_sharing) are "
    "time-sliced, without isolation (a sharer can use all of the device's memory and "
    "compute); for isolation use MIG devices, which gpulab lists as GPUs of their own "
    "(by their MIG-... UUID) and hands out whole (docs/gpus.md)"
)
_EPS = 1e-6


def check_sharing(config: Mapping) -> dict[str, int]:
    """``gpu_sharing`` as the admin wrote it ({device: slots}), checked: a ValueError names
    the entry at fault."""
    out: dict[str, int] = {}
    for key, slots in config.items():
        if isinstance(slots, bool) or not isinstance(slots, int) or not 2 <= slots <= MAX_SLOTS:
            raise ValueError(
                f"gpu_sharing[{key!r}] must be a whole number of slots from 2 to {MAX_SLOTS} "
                f"(a device in 1 slot is not shared), not {slots!r}"
            )
        out[str(key)] = slots
    return out


def slots_of(sharing: Mapping[str, int], device: GpuDevice) -> int:
    """How many slots ``device`` is shared in (0: not shareable). A key names a device by its
    ledger key ("node/id" on a cluster) or by its ID (then on every node)."""
    return sharing.get(device.key) or sharing.get(device.id) or 0


def is_fraction(gpus: float) -> bool:
    """A request for part of one GPU (0 < gpus < 1)."""
    return 0 < gpus < 1


def slots_for(fraction: float, slots: int) -> int | None:
    """The slots of a ``slots``-slot device that make ``fraction`` of it, or None when the
    fraction is not a whole number of them (0.5 of a 4-slot device: 2; 0.3: None)."""
    k = fraction * slots
    n = round(k)
    if abs(k - n) > _EPS or not 1 <= n < slots:
        return None
    return n


def offered_fractions(slot_counts: Sequence[int]) -> list[float]:
    """Every fraction some shareable device can give (k/slots, below 1), smallest first."""
    found = {round(k / s, 4) for s in set(slot_counts) if s >= 2 for k in range(1, s)}
    return sorted(found)


def fraction_refusal(gpus: float, slot_counts: Sequence[int]) -> str | None:
    """Why ``gpus`` (a number of GPUs a notebook asks for) cannot be had as asked, or None.

    Whole numbers are the ledger's ordinary business. A fraction must be one that a shareable
    device gives; more than one GPU must be whole (a fraction of a GPU is one device's)."""
    if gpus == int(gpus):
        return None
    if gpus > 1:
        return (
            f"gpus={gpus:g}: more than one GPU is a whole number (a fraction is part of one "
            "device); ask for 1, 2, ... or a fraction below 1"
        )
    offered = offered_fractions(slot_counts)
    if not offered:
        return (
            f"gpus={gpus:g}: this installation shares no GPU (the admin sets gpu_sharing); "
            "ask for a whole number"
        )
    if any(slots_for(gpus, s) for s in set(slot_counts)):
        return None
    return f"gpus={gpus:g} is not a share offered here; choose one of: " + ", ".join(
        f"{f:g}" for f in offered
    )


def pick_shared(
    free_slots: Mapping[str, int],
    slot_count: Mapping[str, int],
    fraction: float,
    spread: bool = False,
) -> tuple[str, int] | None:
    """(device key, slots to take) for ``fraction``: among the shareable devices with enough
    free slots, the fullest ('pack': keeps emptier devices for bigger shares and whole GPUs)
    or the emptiest ('spread'); None when none fits now."""
    fits = []
    for key, free in free_slots.items():
        need = slots_for(fraction, slot_count[key])
        if need is not None and free >= need:
            fits.append((free / slot_count[key], key, need))
    if not fits:
        return None
    _, key, need = (max if spread else min)(fits)
    return key, need


def share_of(share_rows: int, slots: int) -> float:
    """The fraction of a GPU that ``share_rows`` slots of a ``slots``-slot device are."""
    return round(share_rows / slots, 4) if slots else float(share_rows)


def sharing_mode_refusal(mode: str) -> str | None:
    """Why ``gpu_sharing_mode`` cannot be ``mode``, or None ('time-slicing')."""
    if mode in SHARING_MODES:
        return None
    if mode == "mps":
        return MPS_REMOVED
    return f"c.GpulabSettings.gpu_sharing_mode must be 'time-slicing' (the one mode), not {mode!r}"


def sharing_summary(
    devices: Sequence[GpuDevice], sharing: Mapping[str, int], used: Mapping[str, int]
) -> list[dict]:
    """Per shareable device: {device, slots, used, free} (used: slots booked now)."""
    out = []
    for d in devices:
        s = slots_of(sharing, d)
        if s:
            u = used.get(d.key, 0)
            out.append({"device": d.key, "slots": s, "used": u, "free": max(0, s - u)})
    return out


def share_environment(fraction: float) -> dict[str, str]:
    """The environment of a container given ``fraction`` of one shared device, on top of what
    :func:`gpulab.runtime.objects.gpu_request` gives it for the device itself: its share,
    ``GPULAB_GPU_FRACTION``, as advice (a framework may cap its own memory with it, e.g.
    ``torch.cuda.set_per_process_memory_fraction``); nothing enforces it."""
    return {"GPULAB_GPU_FRACTION": f"{fraction:g}"}
