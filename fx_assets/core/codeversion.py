"""Code versions of the stages, derived from the code itself (no hand-typed numbers).

A stage's code version is a hash of the normalised source of every top-level definition inside
``fx_assets`` that its computation can reach: starting from the stage's entry points (its asset
function, plus resources such as the device loader that shape its result), every function,
class and module-level assignment it names is followed, across modules through their imports
(``from fx_assets.core.bars import build_bars``, ``ofi_core.compute_ofi_features``, imports
inside functions), transitively. Statements of a reached module that bind no name (a registry
filled at import, say) are included too, as is a whole module used as a value. The walk is
static (the source is parsed, never imported), so it costs one ``ast.parse`` per module, once
per process (:func:`stage_versions` is cached).

Normalised: the hash is taken over ``ast.dump`` of each definition with docstrings and
pydantic ``Field(description=...)`` texts removed, so comments, docstrings, descriptions and
formatting never change a version, while any change to code or to a constant does. An entry
point's own decorators (Dagster wiring: description, deps, code_version) are left out.

The versions enter the cache keys (:mod:`fx_assets.core.lineage`) and are the Dagster
``code_version`` of each asset, so an upgrade that changes a kernel rebuilds exactly the files
of the stages that use it (and, through the chained keys, everything downstream) and the UI
shows those assets as unsynced. Hand-typed numbers remain only for on-disk layouts (sidecar,
table and fxcache format versions). The ``ast.dump`` form depends on the Python minor version,
so a new Python rebuilds the caches once. Library versions (numpy, numba, torch) are not part
of the versions.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from fx_assets.core.atomic import atomic_write_text

PACKAGE = "fx_assets"

#: Entry points of each stage: ``module:qualified.name`` (a nested name is a function defined
#: inside the outer one, e.g. an asset defined in its factory). The asset functions are the
#: stage's computation as Dagster runs it; the device loader shapes the trained model too.
STAGE_ENTRIES: dict[str, tuple[str, ...]] = {
    "predecoded": ("fx_assets.assets.ingest:_make_predecoded_asset._asset",),
    "roll_calendar": ("fx_assets.assets.ingest:make_ingest_assets.roll_calendar",),
    "bars": ("fx_assets.assets.features:make_feature_assets.bars",),
    "bar_features": ("fx_assets.assets.features:make_feature_assets.bar_features",),
    "ofi_features": ("fx_assets.assets.features:make_feature_assets.ofi_features",),
    "fxcache": ("fx_assets.assets.features:make_feature_assets.fxcache",),
    "fold_ranges": ("fx_assets.assets.training:make_training_assets.fold_ranges",),
    "trained_model": (
        "fx_assets.assets.training:make_training_assets.trained_model",
        "fx_assets.resources.training:DeviceFxCacheLoader",
    ),
    "walk_forward_report": ("fx_assets.assets.training:make_training_assets.walk_forward_report",),
    "signal_report": ("fx_assets.assets.research:make_research_assets.signal_report",),
    "signal_report_stitched": ("fx_assets.assets.research:make_research_assets.signal_report_stitched",),
}

VERSION_CHARS = 16  # hex digits of a version (64 bits)


# --- normalised source ----------------------------------------------------------------------


_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")  # fields holding statements


def _child_statements(node: ast.AST) -> Iterator[ast.AST]:
    for name in _BLOCKS:
        yield from getattr(node, name, None) or ()


def _is_field_call(value: ast.expr | None) -> bool:
    if not isinstance(value, ast.Call):
        return False
    f = value.func
    return (isinstance(f, ast.Name) and f.id == "Field") or (
        isinstance(f, ast.Attribute) and f.attr == "Field"
    )


def _strip_docs(tree: ast.AST) -> None:
    """Remove docstrings and the ``description=`` of class-level ``Field(...)`` in place (they
    do not compute). Walks statements only, not expressions: it runs over the whole package."""
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    node.body = body[1:] or [ast.Pass()]
        if isinstance(node, ast.ClassDef):
            for st in node.body:
                value = st.value if isinstance(st, ast.Assign | ast.AnnAssign) else None
                if _is_field_call(value):
                    assert isinstance(value, ast.Call)
                    value.keywords = [k for k in value.keywords if k.arg != "description"]
        todo.extend(_child_statements(node))


def _bound_names(stmt: ast.stmt) -> set[str]:
    """Module-level names a statement binds or mutates (``X = ..``, ``X[k] = ..``, ``def X``)."""
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {stmt.name}
    out: set[str] = set()

    def root(t: ast.expr) -> None:
        while isinstance(t, ast.Attribute | ast.Subscript | ast.Starred):
            t = t.value
        if isinstance(t, ast.Name):
            out.add(t.id)
        elif isinstance(t, ast.Tuple | ast.List):
            for e in t.elts:
                root(e)

    for node in _walk_scope(stmt):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                root(t)
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            root(node.target)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            f = node.value.func  # X.append(..), X.update(..): a mutation of X
            if isinstance(f, ast.Attribute):
                root(f.value)
    return out


def _walk_scope(stmt: ast.stmt) -> Iterator[ast.AST]:
    """A module-level statement and the statements nested in its blocks (if / try / for / with),
    not descending into function or class bodies."""
    todo: list[ast.AST] = [stmt]
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            todo.extend(_child_statements(node))  # a def binds its name only


Ref = tuple[str, str | None]  # (module, attribute or None for the module itself)


@dataclass
class _Module:
    name: str
    is_package: bool
    stmts: list[ast.stmt]
    dumps: dict[int, str] = field(default_factory=dict)
    bindings: dict[str, list[int]] = field(default_factory=dict)
    prelude: list[int] = field(default_factory=list)
    aliases: dict[str, Ref] = field(default_factory=dict)
    star: list[str] = field(default_factory=list)


def _import_refs(
    node: ast.Import | ast.ImportFrom, module: str, is_package: bool
) -> Iterator[tuple[str, Ref]]:
    """(local name, what it refers to) for the ``fx_assets`` names an import binds."""
    if isinstance(node, ast.Import):
        for a in node.names:
            if a.name == PACKAGE or a.name.startswith(PACKAGE + "."):
                if a.asname:
                    yield a.asname, (a.name, None)
                else:
                    top = a.name.split(".")[0]
                    yield top, (top, None)
        return
    if node.level:
        parts = module.split(".")
        base_parts = parts if is_package else parts[:-1]
        base_parts = base_parts[: len(base_parts) - (node.level - 1)]
        base = ".".join(base_parts + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    if base != PACKAGE and not base.startswith(PACKAGE + "."):
        return
    for a in node.names:
        if a.name == "*":
            yield "*", (base, None)
        else:
            yield a.asname or a.name, (base, a.name)


class _Source:
    """The parsed ``fx_assets`` package under ``root`` (modules parsed on first use)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._modules: dict[str, _Module | None] = {}

    def _file(self, name: str) -> tuple[Path, bool] | None:
        rel = Path(*name.split("."))
        pkg = self.root / rel / "__init__.py"
        if pkg.is_file():
            return pkg, True
        mod = self.root / rel.with_suffix(".py")
        return (mod, False) if mod.is_file() else None

    def dump(self, node: tuple[str, int]) -> str:
        mod = self.module(node[0])
        assert mod is not None
        if node[1] not in mod.dumps:
            mod.dumps[node[1]] = ast.dump(mod.stmts[node[1]])
        return mod.dumps[node[1]]

    def module(self, name: str) -> _Module | None:
        if name not in self._modules:
            self._modules[name] = self._parse(name)
        return self._modules[name]

    def _parse(self, name: str) -> _Module | None:
        found = self._file(name)
        if found is None:
            return None
        path, is_package = found
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        _strip_docs(tree)
        mod = _Module(name, is_package, list(tree.body))
        for i, stmt in enumerate(mod.stmts):
            imports = [n for n in _walk_scope(stmt) if isinstance(n, ast.Import | ast.ImportFrom)]
            for imp in imports:
                for local, ref in _import_refs(imp, name, is_package):
                    if local == "*":
                        mod.star.append(ref[0])
                    else:
                        mod.aliases[local] = ref
            if isinstance(stmt, ast.Import | ast.ImportFrom) or (
                isinstance(stmt, ast.If | ast.Try) and imports and not _bound_names(stmt)
            ):
                continue
            names = _bound_names(stmt)
            for n in names:
                mod.bindings.setdefault(n, []).append(i)
            if not names:
                mod.prelude.append(i)
        return mod


Node = tuple[str, int]  # (module, index of a top-level statement)


class _Graph:
    """Definitions of the package and what each one names (edges cached: shared by stages)."""

    def __init__(self, src: _Source) -> None:
        self.src = src
        self._edges: dict[Node, frozenset[Node]] = {}
        self._imported: dict[str, frozenset[Node]] = {}

    def _mod(self, name: str) -> _Module:
        mod = self.src.module(name)
        assert mod is not None, name
        return mod

    def whole(self, name: str) -> set[Node]:
        """A whole module (used as a value, or ``import *``)."""
        mod = self.src.module(name)
        return set() if mod is None else {(name, i) for i in range(len(mod.stmts))}

    def imported(self, name: str) -> frozenset[Node]:
        """What importing the module runs that no name reaches: the name-less statements of it
        and of its packages, and the modules it star-imports."""
        got = self._imported.get(name)
        if got is None:
            out: set[Node] = set()
            parts = name.split(".")
            for k in range(1, len(parts) + 1):
                mod = self.src.module(".".join(parts[:k]))
                if mod is not None:
                    out.update((mod.name, i) for i in mod.prelude)
                    for star in mod.star:
                        out |= self.whole(star)
            got = self._imported[name] = frozenset(out)
        return got

    def resolve(self, ref: Ref, attrs: list[str]) -> set[Node]:
        """``module.attr.attr2...`` -> the definitions it names (a whole module if unresolved)."""
        module, name = ref
        chain = ([name] if name is not None else []) + attrs
        while True:
            mod = self.src.module(module)
            if mod is None:
                return set()
            if not chain:
                return self.whole(module)
            head = chain[0]
            if head in mod.bindings:
                return {(module, i) for i in mod.bindings[head]}
            if head in mod.aliases:  # re-exported by the module (``from .x import y`` there)
                return self.resolve(mod.aliases[head], chain[1:])
            if self.src.module(f"{module}.{head}") is not None:
                module, chain = f"{module}.{head}", chain[1:]
                continue
            return self.whole(module)  # not found statically: the whole module, to be safe

    def targets(self, mod: _Module, tree: ast.AST) -> set[Node]:
        """The definitions a piece of ``mod``'s code names (imports inside functions included)."""
        local: dict[str, Ref] = {}
        out: set[Node] = set()
        imports: list[ast.Import | ast.ImportFrom] = []
        refs = list(_refs(tree, imports))
        for n in imports:
            for name, ref in _import_refs(n, mod.name, mod.is_package):
                if name == "*":
                    out |= self.whole(ref[0])
                else:
                    local[name] = ref
        for name, attrs in refs:
            found: Ref | None = local.get(name) or mod.aliases.get(name)
            if found is not None:
                out |= self.resolve(found, attrs)
            elif name in mod.bindings:
                out.update((mod.name, i) for i in mod.bindings[name])
        return out

    def edges(self, node: Node) -> frozenset[Node]:
        got = self._edges.get(node)
        if got is None:
            mod = self._mod(node[0])
            got = self._edges[node] = frozenset(
                self.targets(mod, mod.stmts[node[1]]) | self.imported(node[0])
            )
        return got

    def closure(self, start: Iterable[Node]) -> set[Node]:
        seen: set[Node] = set()
        todo = list(start)
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo.extend(self.edges(n) - seen)
        return seen


def _refs(tree: ast.AST, imports: list[ast.Import | ast.ImportFrom]) -> Iterator[tuple[str, list[str]]]:
    """Every name the tree reads, with the attributes read from it (``a.b.c`` -> a, [b, c]);
    the import statements met are appended to ``imports``."""
    todo: list[ast.AST] = [tree]
    while todo:
        n = todo.pop()
        if isinstance(n, ast.Attribute):
            attrs: list[str] = []
            v: ast.expr = n
            while isinstance(v, ast.Attribute):
                attrs.append(v.attr)
                v = v.value
            if isinstance(v, ast.Name):
                yield v.id, attrs[::-1]
            else:
                todo.append(v)
        elif isinstance(n, ast.Name):
            yield n.id, []
        else:
            if isinstance(n, ast.Import | ast.ImportFrom):
                imports.append(n)
            todo.extend(ast.iter_child_nodes(n))


def _nested(stmt: ast.stmt, path: list[str]) -> ast.FunctionDef | ast.AsyncFunctionDef:
    """The function at ``path`` inside ``stmt`` (an asset defined in its factory function)."""
    node: ast.AST = stmt
    for part in path:
        found = [
            n
            for n in ast.walk(node)
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and n.name == part
            and n is not node
        ]
        if len(found) != 1:
            raise LookupError(f"{part!r} defined {len(found)} times inside {getattr(node, 'name', '?')!r}")
        node = found[0]
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        raise LookupError(f"{'.'.join(path)} is not a function")
    return node


def _stage_nodes(graph: _Graph, entries: Iterable[str]) -> tuple[set[Node], list[str]]:
    """(definitions reached from the entries, normalised source of nested entry functions)."""
    start: set[Node] = set()
    extra: list[str] = []
    for entry in entries:
        module, _, qual = entry.partition(":")
        mod = graph.src.module(module)
        if mod is None:
            raise LookupError(f"code version entry {entry}: no module {module} under {graph.src.root}")
        top, *inner = qual.split(".")
        if top not in mod.bindings:
            raise LookupError(f"code version entry {entry}: {module} defines no {top}")
        if not inner:
            start.update((module, i) for i in mod.bindings[top])
            continue
        outer = mod.stmts[mod.bindings[top][-1]]
        scope = _nested(outer, inner[:-1]) if len(inner) > 1 else outer
        fn = _nested(outer, inner)
        body = ast.Module(body=list(fn.body), type_ignores=[])  # without its (wiring) decorators
        returns = ast.dump(fn.returns) if fn.returns is not None else ""
        extra.append(f"{entry}|{ast.dump(fn.args)}|{returns}|{ast.dump(body)}")
        parts: list[ast.AST] = [fn.args, body, *([fn.returns] if fn.returns is not None else [])]
        start |= graph.imported(module)
        # Names bound in the enclosing function (a helper defined in the factory) are followed
        # there: their statements count, and what they name in turn.
        local: dict[str, list[ast.stmt]] = {}
        for st in getattr(scope, "body", []):
            for name in _bound_names(st):
                if name != fn.name:
                    local.setdefault(name, []).append(st)
        done: set[str] = set()
        while parts:
            tree = parts.pop()
            start |= graph.targets(mod, tree)
            for name, _ in _refs(tree, []):
                if name in local and name not in done:
                    done.add(name)
                    for st in local[name]:
                        extra.append(f"{entry}|local|{ast.dump(st)}")
                        parts.append(st)
    return graph.closure(start), extra


def _digest(graph: _Graph, nodes: set[Node], extra: list[str]) -> str:
    parts = sorted(f"{m}|{graph.src.dump((m, i))}" for m, i in nodes)
    h = hashlib.sha256()
    for p in [*sorted(extra), *parts]:
        h.update(p.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()[:VERSION_CHARS]


def package_root() -> Path:
    """The directory holding the ``fx_assets`` package being run (its parent)."""
    import fx_assets

    return Path(fx_assets.__file__).resolve().parent.parent


def compute_stage_versions(
    root: Path | None = None, entries: dict[str, tuple[str, ...]] | None = None
) -> dict[str, str]:
    """Version of every stage in ``entries`` from the source under ``root`` (uncached)."""
    graph = _Graph(_Source(root or package_root()))
    return {stage: _digest(graph, *_stage_nodes(graph, e)) for stage, e in (entries or STAGE_ENTRIES).items()}


def stage_modules(stage: str, root: Path | None = None) -> dict[str, int]:
    """Modules whose code the stage's version covers, with the number of definitions of each."""
    nodes, _ = _stage_nodes(_Graph(_Source(root or package_root())), STAGE_ENTRIES[stage])
    out: dict[str, int] = {}
    for m, _ in nodes:
        out[m] = out.get(m, 0) + 1
    return dict(sorted(out.items()))


def tree_fingerprint(base: Path, *, content: bool = True) -> str:
    """Hash of every ``*.py`` under ``base`` and the Python minor version: each file's relative
    path, then its content, or with ``content=False`` its size and modification time (stat
    calls only, no file read)."""
    h = hashlib.sha256(f"py{sys.version_info[0]}.{sys.version_info[1]}".encode())
    for p in sorted(base.rglob("*.py")):
        h.update(str(p.relative_to(base)).encode("utf-8") + b"\0")
        if content:
            h.update(p.read_bytes() + b"\0")
        else:
            st = p.stat()
            h.update(f"{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:32]


def source_fingerprint(root: Path | None = None) -> str:
    """Content hash of every source file of the package (and the Python minor version): the
    versions are a function of it alone."""
    return tree_fingerprint((root or package_root()) / PACKAGE)


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fx_assets"


_CACHE_KEEP = 32  # cached version sets kept (one per source state: worktrees, upgrades)


@functools.cache
def package_fingerprint() -> str:
    """:func:`source_fingerprint` of the package's own sources, once per process: the stage
    versions and the verification records (:mod:`fx_assets.core.verified`) both key on it, so a
    process reads and hashes its sources once (~30 ms on the 2-core VM), not once each."""
    return source_fingerprint(package_root())


@functools.cache
def stage_versions() -> dict[str, str]:
    """The code version of every stage, computed once per process.

    Parsing the package takes ~0.5 s on the 2-core VM, so the result is also kept in
    ``~/.cache/fx_assets/`` under the fingerprint of the sources (:func:`source_fingerprint`,
    ~5 ms): a definitions load reads it back instead; any source change misses it.
    """
    root = package_root()
    path = _cache_dir() / f"codeversions-{package_fingerprint()}.json"
    try:
        got = json.loads(path.read_text(encoding="utf-8"))
        if (
            isinstance(got, dict)
            and set(got) == set(STAGE_ENTRIES)
            and all(isinstance(v, str) and len(v) == VERSION_CHARS for v in got.values())
        ):
            return got
    except (OSError, ValueError):
        pass
    versions = compute_stage_versions(root)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(versions, sort_keys=True))
        old = sorted(path.parent.glob("codeversions-*.json"), key=lambda p: p.stat().st_mtime_ns)
        for stale in old[:-_CACHE_KEEP]:
            stale.unlink(missing_ok=True)
    except OSError:
        pass  # a read-only home: computed again by the next process
    return versions


def stage_version(stage: str) -> str:
    """The code version of one stage (see :data:`STAGE_ENTRIES`)."""
    versions = stage_versions()
    if stage not in versions:
        raise KeyError(f"unknown stage {stage!r} (known: {', '.join(versions)})")
    return versions[stage]
