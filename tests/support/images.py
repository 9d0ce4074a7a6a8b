"""Small images a test builds for itself, from a Dockerfile's text (no context)."""

from __future__ import annotations

import io
import tarfile


def build_from(docker_client, dockerfile: str, tag: str) -> str:
    """Build ``dockerfile`` (a Dockerfile's text, nothing to copy) as ``tag``; returns the tag."""
    data = dockerfile.encode()
    ctx = io.BytesIO()
    with tarfile.open(fileobj=ctx, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    ctx.seek(0)
    docker_client.images.build(fileobj=ctx, custom_context=True, tag=tag, rm=True)
    return tag


def labelled(base: str, labels: dict[str, str]) -> str:
    """A Dockerfile that is ``base`` with ``labels`` (nothing else: it builds in a second)."""
    pairs = " ".join(f'{k}="{v}"' for k, v in labels.items())
    return f"FROM {base}\nLABEL {pairs}\n"
