"""The layout's rules (ARCHITECTURE.md), checked on the import graph of ``src/gpulab``.

The graph is read from the source's syntax tree, so every import counts: at the top of a
module, inside a function, under ``TYPE_CHECKING``, and ``importlib.import_module`` of a
constant name. An edge goes from a module to each gpulab module it names (``from . import x``
names the submodule ``x`` when there is one, not the package) and to the first component of
each third-party or standard module it imports. Circles are looked for between modules, and
between the children (modules and subpackages taken whole) of every package at every depth;
``test_the_graph_sees_a_circle_in_every_form_and_at_every_depth`` plants one of each form.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from functools import cache
from pathlib import Path

#: the tree under test (not whatever ``import gpulab`` finds: a shared editable install could
#: point at another checkout)
SRC = Path(__file__).resolve().parents[2] / "src" / "gpulab"
ROOT = "gpulab"

#: the pure core: values in, values out (LAYOUT.md, "core")
CORE = {
    "errors",
    "imagerefs",
    "bounds",
    "lifecycle",
    "durations",
    "billing",
    "names",
    "resources",
    "frameworks",
    "volumes",
    "storage",
    "idle",
    "checks",
    "disk_quota",
    "cuda",
    "identity",
    "forwarded",
    "fairshare",
    "notices",
    "live_push",
    "snapshots",
}
#: what the core may never import: a database, an engine, the network, a web framework
IO_MODULES = {
    "sqlalchemy",
    "docker",
    "dockerspawner",
    "boto3",
    "botocore",
    "requests",
    "tornado",
    "jupyterhub",
    "urllib3",
    "socket",
    "subprocess",
    "pynvml",
}
#: the domains, the engine and the adapters: nothing in the core reaches up to them
UPPER_PACKAGES = ("gpus", "jobs", "notebooks", "service", "runtime", "data")
#: the two domains, over what both share (gpus/, data/, runtime/, settings, db, secrets, ...)
DOMAINS = ("notebooks", "jobs")
#: the service's REST API and pages, over the domains
ADAPTERS = ("service",)
#: the operator's programs (``gpulab doctor``, ``gpulab admin``): run as processes of their
#: own, imported by nobody, importing no domain
PROGRAMS = ("doctor", "admin")
#: gpulab's layers, bottom to top (ARCHITECTURE.md, rule 1), each with the top-level modules
#: and packages in it; every one is in exactly one, and no import reaches a higher layer
LAYERS: list[tuple[str, frozenset[str]]] = [
    ("the pure core", frozenset(CORE)),
    (
        "shared: the foundations",
        frozenset(
            {
                "db",
                "migrations",
                "secrets",
                "disk_ledger",
                "metrics",
                "statelog",
                "logscrub",
                "faults",
                "hub_process",
                "datasync",
                "notifier",
            }
        ),
    ),
    ("shared: the GPUs", frozenset({"gpus"})),
    ("shared: the runtime", frozenset({"runtime"})),
    ("shared: a workload's data", frozenset({"data"})),
    ("shared: the configuration", frozenset({"settings", "hub_login", "loopwatch"})),
    ("the operator's programs", frozenset(PROGRAMS)),
    ("the domains", frozenset(DOMAINS)),
    ("the service", frozenset(ADAPTERS)),
    ("the CLI", frozenset({"cli"})),
]
#: what of runtime/ the layers above it may import: make_runtime and the interface's values
#: (``gpulab.runtime``), the interface (``base``), the notebook images' availability (``images``)
RUNTIME_SURFACE = {f"{ROOT}.runtime", f"{ROOT}.runtime.base", f"{ROOT}.runtime.images"}


def _modules_under(src: Path) -> dict[str, Path]:
    """module name -> its file, for every module of the package at ``src``."""
    out = {}
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


@cache
def _modules() -> dict[str, Path]:
    return _modules_under(SRC)


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    base = module.split(".")
    if not is_package:
        base.pop()
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


@cache
def _tree(module: str) -> ast.Module:
    path = _modules()[module]
    return ast.parse(path.read_text(), str(path))


def _dynamic_import(node: ast.AST, module: str, is_package: bool) -> str | None:
    """The module named by ``importlib.import_module("x")``, ``import_module(".x", __name__)``
    (or ``__package__``) or ``__import__("x")`` with a constant name; None for any other node
    (a name computed at run time is not seen: gpulab/datasync/__init__.py, which loads its
    names so, imports each of them under ``TYPE_CHECKING`` too)."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    first = node.args[0]
    if called not in ("import_module", "__import__") or not isinstance(first, ast.Constant):
        return None
    if not isinstance(first.value, str):
        return None
    name = first.value.lstrip(".")
    level = len(first.value) - len(name)
    if not level:
        return name
    # relative to the package argument: __name__ is the module itself (a package's name in
    # its __init__), __package__ the package it is in
    anchor = node.args[1] if len(node.args) > 1 else None
    as_package = is_package or (isinstance(anchor, ast.Name) and anchor.id == "__name__")
    return _resolve(module, as_package, level, name or None)


def _named(name: str, root: str, modules: Iterable[str]) -> str:
    """What an import of the dotted ``name`` reaches: its deepest module of the package
    (``a.b.c``: the module a.b.c, else a.b, which defines c), or a foreign one's top name."""
    if name != root and not name.startswith(root + "."):
        return name.split(".")[0]
    while name not in modules and "." in name:
        name = name.rpartition(".")[0]
    return name


def import_graph(src: Path) -> dict[str, frozenset[str]]:
    """module -> the modules it imports, for the package at ``src`` (its own modules by full
    name, others by their top name): every ``import``, ``from ... import`` (relative at any
    level; ``from . import x`` names the submodule ``x`` when there is one, else the package
    that defines ``x``) and ``import_module``/``__import__`` of a constant name, wherever it
    stands (inside a function or a class, under ``if TYPE_CHECKING``, in a ``try``)."""
    root = src.name
    modules = _modules_under(src)
    out: dict[str, frozenset[str]] = {}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    found.add(_named(alias.name, root, modules))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    target = _resolve(module, is_package, node.level, node.module)
                else:
                    target = node.module or ""
                for alias in node.names:  # a submodule, or a name the target defines
                    name = target if alias.name == "*" else f"{target}.{alias.name}"
                    found.add(_named(name, root, modules))
            elif (name := _dynamic_import(node, module, is_package)) is not None:
                found.add(_named(name, root, modules))
        found.discard(module)
        out[module] = frozenset(found)
    return out


@cache
def graph() -> dict[str, frozenset[str]]:
    """module -> the modules it imports (gpulab's by full name, others by their top name)."""
    return import_graph(SRC)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def _internal(targets: Iterable[str]) -> set[str]:
    return {t for t in targets if t in _modules()}


def _child_of(module: str, package: str) -> str | None:
    """The child of ``package`` (a module or a subpackage directly in it) that ``module`` is
    or lies in; None when it lies outside, or is the package's own __init__."""
    if not module.startswith(package + "."):
        return None
    return package + "." + module[len(package) + 1 :].split(".")[0]


def package_cycles(g: dict[str, frozenset[str]]) -> dict[str, list[list[str]]]:
    """In every package, at every depth (gpulab, gpulab.jobs, gpulab.jobs.supervisor, ...),
    the circles among its children, each subpackage taken whole with all its modules: what
    imports what between two children, wherever in them (package -> its circles)."""
    packages = {m for m in g if any(t.startswith(m + ".") for t in g)}
    found = {}
    for package in sorted(packages):
        edges: dict[str, set[str]] = {}
        for module, targets in g.items():
            mine = _child_of(module, package)
            if mine is None:
                continue
            edges.setdefault(mine, set()).update(
                theirs
                for t in targets
                if (theirs := _child_of(t, package)) is not None and theirs != mine
            )
        if cycles := _cycles(edges):
            found[package] = cycles
    return found


def _under(module: str, *packages: str) -> bool:
    return any(module == f"{ROOT}.{p}" or module.startswith(f"{ROOT}.{p}.") for p in packages)


def _is_cli(module: str) -> bool:
    """The CLI: top-level ``cli*.py`` modules, or a ``cli`` package."""
    parts = module.split(".")
    return len(parts) >= 2 and parts[1].startswith("cli")


def _layer(module: str) -> int:
    """The module's layer: its position in :data:`LAYERS` (0 the pure core, ... the CLI)."""
    top = module.split(".")[1]
    for i, (_, names) in enumerate(LAYERS):
        if top in names:
            return i
    raise LookupError(f"{module} is in no layer (LAYERS, ARCHITECTURE.md rule 1)")


def _layer_of(name: str) -> int:
    return next(i for i, (what, _) in enumerate(LAYERS) if what == name)


def _upward(g: dict[str, frozenset[str]]) -> list[tuple[str, str]]:
    """The imports that reach a higher layer (the version module, gpulab/__init__, aside)."""
    return sorted(
        (m, t)
        for m, targets in g.items()
        for t in _internal(targets)
        if t != ROOT and _layer(t) > _layer(m)
    )


def _above_runtime_reaching_in(g: dict[str, frozenset[str]]) -> list[tuple[str, str]]:
    """Imports of runtime/ modules, from outside it, past make_runtime and the interface."""
    return sorted(
        (m, t)
        for m, targets in g.items()
        if not _under(m, "runtime")
        for t in _internal(targets)
        if _under(t, "runtime") and t not in RUNTIME_SURFACE
    )


BACKENDS = {"docker", "swarm"}


def _runtime_like(node: ast.AST) -> bool:
    """``runtime``, ``rt``, ``self.runtime``, ``nb.runtime``: an expression naming a Runtime."""
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
    return name in ("runtime", "rt", "_runtime")


def _strings(node: ast.AST) -> set[str]:
    """The string constants ``node`` is or holds (a tuple, list or set of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set().union(*(_strings(e) for e in node.elts))
    return set()


def backend_questions(tree: ast.AST) -> list[int]:
    """The lines that ask which backend runs: ``<...>.runtime`` compared with (or matched
    against) a string, ``<a runtime>.kind`` read at all, any comparison with "docker" or
    "swarm"."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "kind" and _runtime_like(node.value):
            lines.append(node.lineno)
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            texts = set().union(*(_strings(s) for s in sides))
            about_runtime = any(isinstance(s, ast.Attribute) and s.attr == "runtime" for s in sides)
            if (about_runtime and texts) or texts & BACKENDS:
                lines.append(node.lineno)
        elif isinstance(node, ast.Match):
            subject = node.subject
            if isinstance(subject, ast.Attribute) and subject.attr == "runtime":
                lines.append(node.lineno)
    return sorted(set(lines))


# --- the graph itself --------------------------------------------------------------------


def test_the_graph_sees_every_kind_of_import():
    g = graph()
    assert f"{ROOT}.lifecycle" in g[f"{ROOT}.billing"]  # from .lifecycle import JobState
    assert f"{ROOT}.gpus.placement" in g[f"{ROOT}.gpus.ledger"]  # from . import placement
    assert "sqlalchemy" in g[f"{ROOT}.db"]
    # an import inside a function counts (gpulab/db.py, gpulab/gpus/inventory.py: pynvml)
    assert "pynvml" in g[f"{ROOT}.gpus.inventory"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


#: a package with a circle of each form the graph must see (file -> its text)
PLANTED = {
    "__init__.py": "",
    "core.py": "",
    "jobs/__init__.py": "",
    # `from . import x` one way, `from .x import name` inside a function the other
    "jobs/actions.py": "from . import records\n",
    "jobs/records.py": "def load():\n    from .actions import submit\n",
    # `from .. import x` from a sub-subpackage, an absolute `import a.b.c as d` back
    "jobs/supervisor/__init__.py": "",
    "jobs/supervisor/life.py": "from .. import usage\n",
    "jobs/usage.py": "import pkg.jobs.supervisor.life as life\n",
    # an import under TYPE_CHECKING, and import_module of a constant name back
    "jobs/supervisor/ending.py": (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .engine import Engine\n"
    ),
    "jobs/supervisor/engine.py": (
        "import importlib\nclass Engine:\n    def end(self):\n"
        "        return importlib.import_module('.ending', __package__)\n"
    ),
    # no circle between modules, one between two sub-subpackages: spec/ -> gang/ -> spec/
    "jobs/spec/__init__.py": "",
    "jobs/spec/fields.py": "from ..gang.ranks import RANKS\n",
    "jobs/spec/base.py": "",
    "jobs/gang/__init__.py": "",
    "jobs/gang/ranks.py": "",
    "jobs/gang/env.py": "try:\n    from pkg.jobs.spec import base\nexcept ImportError:\n    pass\n",
    # one between two top-level subpackages, through their __init__ modules: jobs <-> service
    "service/__init__.py": "from pkg.jobs import records\n",
    "jobs/hooks.py": "from ..service import *\n",
}


def test_the_graph_sees_a_circle_in_every_form_and_at_every_depth(tmp_path):
    for name, text in PLANTED.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    g = import_graph(tmp_path / "pkg")
    edges = {m: {t for t in targets if t in g} for m, targets in g.items()}
    assert _cycles(edges) == [
        ["pkg.jobs.actions", "pkg.jobs.records"],
        ["pkg.jobs.supervisor.ending", "pkg.jobs.supervisor.engine"],
        ["pkg.jobs.supervisor.life", "pkg.jobs.usage"],
    ]
    assert (
        "typing" in g["pkg.jobs.supervisor.ending"]
        and "importlib" in g["pkg.jobs.supervisor.engine"]
    )
    assert package_cycles(g) == {
        "pkg": [["pkg.jobs", "pkg.service"]],
        "pkg.jobs": [
            ["pkg.jobs.actions", "pkg.jobs.records"],
            ["pkg.jobs.gang", "pkg.jobs.spec"],
            ["pkg.jobs.supervisor", "pkg.jobs.usage"],
        ],
        "pkg.jobs.supervisor": [["pkg.jobs.supervisor.ending", "pkg.jobs.supervisor.engine"]],
    }


# --- the rules ---------------------------------------------------------------------------


def test_no_import_circle_between_modules():
    edges = {m: _internal(t) for m, t in graph().items()}
    assert _cycles(edges) == []


def test_no_circle_between_subpackages():
    """Between the subpackages and modules of every package, at every depth: gpulab's
    (jobs/ and gpus/), jobs/'s (spec/ and supervisor/), service/'s (api/ and pages/) ..."""
    assert package_cycles(graph()) == {}


def test_the_core_is_pure_and_imports_only_the_core():
    core = {f"{ROOT}.{m}" for m in CORE}
    assert core <= set(graph()), sorted(core - set(graph()))  # every core module exists
    for module in sorted(core):
        targets = graph()[module]
        assert not targets & IO_MODULES, (module, sorted(targets & IO_MODULES))
        upward = sorted(t for t in _internal(targets) if _under(t, *UPPER_PACKAGES))
        assert upward == [], module
        assert _internal(targets) <= core | {ROOT}, (module, sorted(_internal(targets) - core))


def test_gpus_never_import_a_domain_or_an_adapter():
    for module, targets in graph().items():
        if _under(module, "gpus"):
            bad = sorted(
                t for t in _internal(targets) if _under(t, "jobs", "notebooks", "service", "data")
            )
            assert bad == [], module


def test_the_domains_never_import_each_other():
    for module, targets in graph().items():
        for mine, other in (("jobs", "notebooks"), ("notebooks", "jobs")):
            if _under(module, mine):
                bad = sorted(t for t in _internal(targets) if _under(t, other))
                assert bad == [], module


def test_the_services_api_and_pages_never_import_each_other():
    """service/api/ and service/pages/ are two doors on the same domain functions: what both
    need is service/base.py's or the domain's, never the other door's."""
    for module, targets in graph().items():
        for mine, other in (("service.api", "service.pages"), ("service.pages", "service.api")):
            if _under(module, mine):
                bad = sorted(t for t in _internal(targets) if _under(t, other))
                assert bad == [], module


def test_the_cli_imports_nothing_of_gpulab_outside_itself():
    found = [m for m in graph() if _is_cli(m)]
    assert found
    for module in found:
        bad = sorted(t for t in _internal(graph()[module]) if t != ROOT and not _is_cli(t))
        assert bad == [], module


def test_the_jobs_know_the_runtime_interface_and_no_engine():
    """jobs/ (the supervisor included) holds a Runtime: of runtime/ it imports base.py only
    (Runtime, WorkloadSpec, HelperSpec, WorkloadState, gpulab's EngineError), never the
    Docker SDK, a backend, its networks or its Docker configs."""
    for module, targets in graph().items():
        if not _under(module, "jobs"):
            continue
        bad = sorted(
            t
            for t in targets
            if t == "docker" or (_under(t, "runtime") and t != f"{ROOT}.runtime.base")
        )
        assert bad == [], module


def test_nothing_above_runtime_imports_the_docker_sdk_or_a_backend():
    for module, targets in graph().items():
        if _under(module, "runtime"):
            continue
        bad = sorted(
            t
            for t in targets
            if t == "docker"
            or _under(t, "runtime.docker")
            or t.startswith(f"{ROOT}.runtime.swarm")  # swarm.py, swarm_*.py or swarm/
        )
        assert bad == [], module


def test_every_module_is_in_one_named_layer():
    """A new top-level module or package is placed in a layer (here and in ARCHITECTURE.md)
    before it lands, not left to fall into one."""
    tops = {m.split(".")[1] for m in graph() if m != ROOT}
    named = [n for _, names in LAYERS for n in names]
    assert sorted(named) == sorted(set(named)), "a name in two layers"
    assert tops == set(named), (sorted(tops - set(named)), sorted(set(named) - tops))


def test_imports_follow_the_layers():
    """core < what both domains share, in its own order (the foundations: db, secrets,
    metrics, datasync/, ... < gpus/ < runtime/ < data/ < settings) < the operator's programs <
    the domains (notebooks/, jobs/) < the service < the CLI: no import reaches a higher layer,
    so runtime/, data/, gpus/ and settings never import notebooks/, jobs/ or service/, gpus/
    never imports runtime/ or data/, and runtime/ never data/ or settings."""
    assert _layer(f"{ROOT}.lifecycle") == _layer_of("the pure core") == 0
    assert _layer(f"{ROOT}.db") == _layer(f"{ROOT}.secrets") == _layer_of("shared: the foundations")
    assert _layer(f"{ROOT}.datasync.engine") == _layer_of("shared: the foundations")
    assert _layer(f"{ROOT}.gpus.ledger") < _layer(f"{ROOT}.runtime.docker")
    assert _layer(f"{ROOT}.runtime.base") < _layer(f"{ROOT}.data.sync")
    assert _layer(f"{ROOT}.data.sync") < _layer(f"{ROOT}.settings")
    assert _layer(f"{ROOT}.settings") < _layer(f"{ROOT}.doctor.checks")
    assert _layer(f"{ROOT}.doctor.checks") < _layer(f"{ROOT}.jobs.supervisor.life")
    assert _layer(f"{ROOT}.jobs.supervisor.life") == _layer(f"{ROOT}.notebooks.life")
    assert _layer(f"{ROOT}.notebooks.life") < _layer(f"{ROOT}.service.app")
    assert _layer(f"{ROOT}.service.app") < _layer(f"{ROOT}.cli.commands") == len(LAYERS) - 1
    assert _upward(graph()) == []
    # and it sees one: settings asking the jobs' scheduler (an arrow the issue found), the
    # runtime reading the settings, the GPU ledger asking the data sync
    for module, target in (
        ("settings", "jobs.scheduler"),
        ("runtime.docker", "settings"),
        ("gpus.ledger", "data.sync"),
    ):
        planted = {**graph(), f"{ROOT}.{module}": frozenset({f"{ROOT}.{target}"})}
        assert _upward(planted) == [(f"{ROOT}.{module}", f"{ROOT}.{target}")]


def test_nobody_imports_the_operators_programs():
    """doctor/ and admin/ run as programs of their own (the CLI starts them: cli/host.py)."""
    for module, targets in graph().items():
        if not _under(module, *PROGRAMS):
            bad = sorted(t for t in _internal(targets) if _under(t, *PROGRAMS))
            assert bad == [], module


def test_above_runtime_only_make_runtime_and_the_interface_are_imported():
    """Outside runtime/, of runtime/ only ``gpulab.runtime`` (make_runtime and the names it
    re-exports), ``runtime.base`` (the interface) and ``runtime.images`` are imported: never
    a backend, its objects, networks, gateway or exec sessions."""
    assert _above_runtime_reaching_in(graph()) == []
    planted = {**graph(), f"{ROOT}.service.api.exec": frozenset({f"{ROOT}.runtime.execution"})}
    assert _above_runtime_reaching_in(planted) == [
        (f"{ROOT}.service.api.exec", f"{ROOT}.runtime.execution")
    ]


def test_nothing_above_runtime_asks_which_backend_runs():
    """The backend is chosen in one place, make_runtime (runtime/__init__.py); above
    runtime/ what differs is asked as a placement fact (``Runtime.clustered``)."""
    asked = {
        m: lines
        for m in graph()
        if not _under(m, "runtime") and (lines := backend_questions(_tree(m)))
    }
    assert asked == {}
    # make_runtime itself asks (the one place), and the check sees each way of asking
    assert backend_questions(_tree(f"{ROOT}.runtime"))
    for planted in (
        'if s.runtime != "docker":\n    pass',
        'ok = self.settings.runtime in ("swarm",)',
        'match settings.runtime:\n    case "swarm":\n        pass',
        'if self.runtime.kind == "swarm":\n    pass',
        "name = nb.runtime.kind",
        'clustered = backend == "swarm"',
    ):
        assert backend_questions(ast.parse(planted)) == [1], planted
    # and leaves the other kinds alone: a store's, a ledger row's, a placement fact
    for fine in ('store.kind != "s3"', 'a["kind"] == "job"', "if runtime.clustered: pass"):
        assert backend_questions(ast.parse(fine)) == [], fine
