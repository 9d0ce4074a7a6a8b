"""An image's CUDA needs against a host's NVIDIA driver (pure).

Images say what they are with two labels (``scripts/build-images.sh`` sets them):
``org.gpulab.flavour`` is ``cuda`` or ``cpu``, and a CUDA image's ``org.gpulab.cuda`` is the
CUDA version its wheels were built for (``12.8``). A driver supports CUDA up to the version NVML
reports (``nvmlSystemGetCudaDriverVersion``: ``12.4``). CUDA's minor version compatibility lets
a program built for 12.8 run on a 12.x driver for most of its work, but not what needs the
newer driver (PTX compiled just in time, some newer APIs); a program built for a newer major
version does not start at all. So a driver older in the minor version is a warning, older in
the major version a refusal: ``gpulab doctor`` says so of each image, and a GPU workload on an
image the driver cannot run is refused before it starts (:func:`cuda_refusal`, the one rule the
notebook options and the job submission share).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: the image's build: "cuda" or "cpu"
FLAVOUR_LABEL = "org.gpulab.flavour"
#: the CUDA version a CUDA image's wheels need ("12.8"); absent on a CPU image
CUDA_LABEL = "org.gpulab.cuda"

CUDA = "cuda"
CPU = "cpu"


def parse_cuda(text: str | None) -> tuple[int, int] | None:
    """``"12.8"`` (or ``"12"``, ``"12.8.1"``) as ``(12, 8)``; None when it is no version."""
    parts = (text or "").strip().split(".")
    try:
        major = int(parts[0])
        minor = int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None
    if major < 0 or minor < 0:
        return None
    return major, minor


def cuda_gap(needed: str | None, supported: str | None) -> str:
    """How far a driver that supports CUDA ``supported`` falls short of an image that needs
    ``needed``: ``""`` (it does not, or either version is unknown), ``"minor"`` (same major
    version, older minor: most of it runs) or ``"major"`` (an older major version: nothing
    built for CUDA runs)."""
    want, have = parse_cuda(needed), parse_cuda(supported)
    if want is None or have is None or have >= want:
        return ""
    return "major" if have[0] < want[0] else "minor"


def cuda_shortfall(image: str, needed: str | None, supported: str | None) -> str | None:
    """Why ``image`` (built for CUDA ``needed``) does not fully work with a driver that
    supports CUDA ``supported``, with what to do; None when it does (or a version is unknown)."""
    gap = cuda_gap(needed, supported)
    if not gap:
        return None
    if gap == "major":
        return (
            f"{image} needs CUDA {needed} and the driver supports CUDA {supported} only: its "
            "CUDA code will not run. Install an NVIDIA driver that supports CUDA "
            f"{needed} or newer, or build the image for CUDA {supported}"
        )
    return (
        f"{image} needs CUDA {needed} and the driver supports CUDA {supported}: minor version "
        "compatibility runs most of it, but not code compiled just in time (PTX) for newer "
        f"GPUs. Upgrade the driver to one that supports CUDA {needed}, or build the image "
        f"for CUDA {supported}"
    )


@dataclass(frozen=True)
class ImageBuild:
    """What an image's labels say of its build: ``flavour`` "cuda", "cpu" or "" (not
    labelled: an image gpulab did not build, or built before the labels), and ``cuda``, the
    CUDA version it needs ("" none or unknown)."""

    flavour: str = ""
    cuda: str = ""

    @classmethod
    def from_labels(cls, labels: Mapping[str, str] | None) -> ImageBuild:
        labels = labels or {}
        return cls(
            flavour=str(labels.get(FLAVOUR_LABEL) or "").strip().lower(),
            cuda=str(labels.get(CUDA_LABEL) or "").strip(),
        )

    def describe(self) -> str:
        """As a catalog shows it: "CUDA 12.8", "CPU", or "" when the labels say nothing."""
        if self.flavour == CUDA or self.cuda:
            return f"CUDA {self.cuda}" if self.cuda else "CUDA"
        return "CPU" if self.flavour == CPU else ""


def cuda_refusal(
    image: str, needed: str | None, gpus: float, supported: str | None, where: str = "this host"
) -> str | None:
    """Why a workload of ``gpus`` GPUs may not run ``image``, built for CUDA ``needed``, on
    ``where``, whose NVIDIA driver supports CUDA ``supported``: the driver's major version is
    older, so nothing the image built for CUDA runs. None when it may: no GPU asked for, an
    image that needs no particular CUDA (a CPU image, one not labelled), a driver whose CUDA
    version is unknown (configured GPUs, no NVML: nothing to compare with), a driver new enough,
    or one older only in the minor version (minor version compatibility runs it; ``gpulab
    doctor`` and the admin page warn)."""
    if not gpus or gpus <= 0 or cuda_gap(needed, supported) != "major":
        return None
    return (
        f"image {image} needs CUDA {needed}, newer than CUDA {supported}, the newest the "
        f"NVIDIA driver of {where} supports: upgrade the driver to one for CUDA {needed} or "
        f"later, or choose an image built for CUDA {supported} (or no GPU)"
    )
