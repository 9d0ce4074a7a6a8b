"""The sync helper's image holds only some of gpulab's modules (scripts/build-images.sh's
build_sync copies them): every gpulab module those import, at any depth, must be among them,
or the image's build fails (its check imports gpulab.datasync.cli and gpulab.gpus.agent)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
SCRIPT = SRC.parent / "scripts" / "build-images.sh"


def _copied() -> set[str]:
    """The module names build_sync copies into the image."""
    body = SCRIPT.read_text().split("build_sync() {", 1)[1].split("\n}", 1)[0]
    out: set[str] = set()
    for path in re.findall(r'\$ROOT"?/src/(gpulab/[^"\s]+)', body):
        if path.endswith("*.py"):
            out |= {
                ".".join(p.relative_to(SRC).with_suffix("").parts)
                for p in (SRC / path).parent.glob("*.py")
            }
        elif "{" in path:
            head, names = path.split("{")
            for name in names.rstrip("}.py").rstrip("}").split(","):
                out.add((head + name.removesuffix(".py")).replace("/", "."))
        else:
            out.add(path.removesuffix(".py").replace("/", "."))
    return {m.removesuffix(".__init__") for m in out}


def _imports(module: str) -> set[str]:
    path = SRC / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = SRC / module.replace(".", "/") / "__init__.py"
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("gpulab"):
                found.add(target)
                for alias in node.names:  # "from . import x": a module, if one is there
                    candidate = f"{target}.{alias.name}"
                    if (SRC / (candidate.replace(".", "/") + ".py")).exists():
                        found.add(candidate)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("gpulab")}
    return found


def test_the_sync_image_holds_every_module_its_programs_import():
    copied = _copied()
    assert {"gpulab.volumes", "gpulab.datasync.cli", "gpulab.gpus.agent"} <= copied, copied
    todo = ["gpulab.datasync.cli", "gpulab.datasync.gitclone", "gpulab.gpus.agent"]
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        assert module in copied, f"{module} is imported in the sync image but not copied there"
        todo.extend(_imports(module))
