"""The framework catalog: framework -> versions -> image, and the editors each offers.

Configured by the admin as plain data (lists of dicts) and validated here. Which images the
engine has is the caller's to find out: the catalog only turns the missing ones into reasons
(a version whose image is missing is shown unavailable and refused, never failed at spawn).
The first version of a framework is its default. An editor is a named way to reach the
notebook (JupyterLab's ``/lab``; a second editor such as VS Code is one more entry with its own
URL and the images that carry it), so adding one needs no redesign.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from .errors import FieldError


class CatalogError(FieldError):
    """A choice outside the catalog; ``field`` names the option at fault."""


@dataclass(frozen=True)
class Editor:
    id: str
    title: str
    default_url: str  # path inside the notebook server, e.g. /lab


@dataclass(frozen=True)
class FrameworkVersion:
    id: str
    image: str
    title: str


@dataclass(frozen=True)
class Framework:
    id: str
    title: str
    versions: tuple[FrameworkVersion, ...]
    editors: tuple[str, ...]

    @property
    def default_version(self) -> FrameworkVersion:
        return self.versions[0]

    def version(self, version_id: str | None) -> FrameworkVersion:
        if version_id is None:
            return self.default_version
        for v in self.versions:
            if v.id == str(version_id):
                return v
        raise CatalogError(
            "version",
            f"{self.id} has no version {version_id!r}; "
            f"choose one of: {', '.join(v.id for v in self.versions)}",
        )


@dataclass(frozen=True)
class Catalog:
    frameworks: dict[str, Framework]
    editors: dict[str, Editor]
    default_framework: str

    @classmethod
    def from_config(
        cls,
        frameworks: Sequence[Mapping],
        editors: Mapping[str, Mapping],
        default_framework: str = "",
    ) -> Catalog:
        eds = {
            k: Editor(id=k, title=str(v.get("title", k)), default_url=str(v["default_url"]))
            for k, v in editors.items()
        }
        fws: dict[str, Framework] = {}
        for f in frameworks:
            fid = str(f["id"])
            versions = tuple(
                FrameworkVersion(
                    id=str(v["id"]), image=str(v["image"]), title=str(v.get("title", v["id"]))
                )
                for v in f["versions"]
            )
            if not versions:
                raise ValueError(f"framework {fid!r} has no versions")
            f_editors = tuple(f.get("editors") or list(eds)[:1])
            unknown = [e for e in f_editors if e not in eds]
            if unknown:
                raise ValueError(f"framework {fid!r} names unknown editors {unknown}")
            fws[fid] = Framework(fid, str(f.get("title", fid)), versions, f_editors)
        if not fws:
            raise ValueError("the catalog has no framework")
        default = default_framework or next(iter(fws))
        if default not in fws:
            raise ValueError(f"default framework {default!r} is not in the catalog")
        return cls(fws, eds, default)

    def framework(self, framework_id: str | None) -> Framework:
        fid = framework_id or self.default_framework
        if fid not in self.frameworks:
            raise CatalogError(
                "framework",
                f"unknown framework {fid!r}; choose one of: {', '.join(self.frameworks)}",
            )
        return self.frameworks[fid]

    def editor(self, framework: Framework, editor_id: str | None) -> Editor:
        eid = editor_id or framework.editors[0]
        if eid not in framework.editors:
            raise CatalogError(
                "editor",
                f"{framework.id} offers editors: {', '.join(framework.editors)}; not {eid!r}",
            )
        return self.editors[eid]

    def images(self) -> set[str]:
        return {v.image for f in self.frameworks.values() for v in f.versions}

    def unavailable(self, missing: Collection[str], where: str) -> dict[str, str]:
        """{image: why it cannot be chosen} for the catalog's images in ``missing`` (those the
        engine does not have), each reason naming the framework version, the image and who
        builds it."""
        out: dict[str, str] = {}
        for f in self.frameworks.values():
            for v in f.versions:
                if v.image in missing and v.image not in out:
                    out[v.image] = (
                        f"{f.title} {v.id} is unavailable: its image {v.image} is missing "
                        f"{where} (the admin builds it: make images)"
                    )
        return out

    def unavailable_frameworks(self, unavailable: Collection[str]) -> set[str]:
        """The frameworks none of whose versions' images is there."""
        return {
            f.id
            for f in self.frameworks.values()
            if all(v.image in unavailable for v in f.versions)
        }
