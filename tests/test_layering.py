"""The import direction between specserve's layers, read statically (`ast`: nothing is imported),
and no import cycle between its modules. Every import counts, at module level and inside
functions; policies also stay light through everything they import at module level."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "specserve"

# libraries a light module must not load (directly or through what it imports)
HEAVY = ("torch", "transformers", "peft", "safetensors", "gguf", "ray", "redis", "fastapi")
HEAVY += ("starlette", "uvicorn", "matplotlib", "scipy")


@dataclass(frozen=True)
class Rule:
    """Modules under `layer` import nothing under `forbidden`, except what is under `allowed`."""

    layer: str
    forbidden: tuple[str, ...]
    allowed: tuple[str, ...] = ()


RULES = (
    Rule("specserve.engine", ("specserve",), allowed=("specserve.engine",)),
    Rule(
        "specserve.policies",
        ("specserve", *HEAVY),
        allowed=("specserve.policies", "specserve.engine.drafters.specs"),
    ),
    Rule(
        "specserve.models",
        ("specserve",),
        allowed=("specserve.models", "specserve.engine", "specserve.paths", "specserve.files"),
    ),
    Rule(
        "specserve.adapters",
        ("specserve.platform", "specserve.training", "specserve.cli", "specserve.tools")
        + ("specserve.deploy", "specserve.policies"),
    ),
    Rule(
        "specserve.training",
        ("specserve.platform", "specserve.cli", "specserve.tools", "specserve.deploy"),
    ),
    Rule("specserve.platform", ("specserve.cli", "specserve.tools", "specserve.deploy")),
    Rule("specserve.deploy", ("specserve",), allowed=("specserve.deploy", "specserve.paths")),
    Rule("specserve.tools", ("specserve.cli", "specserve.deploy")),
)
LIGHT_LAYERS = ("specserve.policies",)  # nothing in HEAVY is loaded by importing them


@dataclass(frozen=True)
class Import:
    """One imported name, as absolute dotted path (`from a import b` -> `a.b`), where it stands,
    and whether it runs when its module is imported (module or class level, not TYPE_CHECKING)."""

    name: str
    path: Path
    line: int
    at_import: bool

    def where(self) -> str:
        return f"{self.path.relative_to(PACKAGE.parent)}:{self.line}"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + is_package]
    return ".".join(base + ([node.module] if node.module else []))


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path, source: str | None = None) -> list[Import]:
    """Every import in the module at `path` (read from `source` if given)."""
    tree = ast.parse(source if source is not None else path.read_text(), str(path))
    module, is_package = module_name(path), path.name == "__init__.py"
    found: list[Import] = []

    def visit(node: ast.AST, at_import: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend(Import(a.name, path, node.lineno, at_import) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, module, is_package)
            found.extend(
                Import(f"{base}.{a.name}", path, node.lineno, at_import) for a in node.names
            )
        deferred = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        deferred |= isinstance(node, ast.If) and _is_type_checking(node)
        for child in ast.iter_child_nodes(node):
            visit(child, at_import and not deferred)

    visit(tree, True)
    return found


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations(rule: Rule, paths: list[Path]) -> list[str]:
    return [
        f"{found.where()}: {module_name(found.path)} imports {found.name}"
        f" (not allowed in {rule.layer}: {prefix})"
        for path in paths
        if under(module_name(path), rule.layer)
        for found in imports_of(path)
        for prefix in rule.forbidden
        if under(found.name, prefix) and not any(under(found.name, a) for a in rule.allowed)
    ]


def module_files(name: str) -> list[Path]:
    """The files that `import name` runs inside specserve: each package's __init__ on the way,
    then the module itself (none for a name that is an attribute, not a module)."""
    parts, files = name.split("."), []
    for depth in range(1, len(parts) + 1):
        base = PACKAGE.parent.joinpath(*parts[:depth])
        for candidate in (base / "__init__.py", base.with_suffix(".py")):
            if candidate.is_file():
                files.append(candidate)
    return files


def heavy_loads(start: Path) -> list[str]:
    """Each import of a HEAVY library that importing `start` runs, with the chain that gets there."""
    chains, queue, found = {start: module_name(start)}, [start], []
    while queue:
        path = queue.pop()
        for item in imports_of(path):
            if not item.at_import:
                continue
            if any(under(item.name, lib) for lib in HEAVY):
                found.append(f"{chains[path]} -> {item.where()} imports {item.name}")
            for file in module_files(item.name) if under(item.name, "specserve") else ():
                if file not in chains:
                    chains[file] = f"{chains[path]} -> {item.where()}"
                    queue.append(file)
    return found


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.layer.removeprefix("specserve."))
def test_layer_imports_point_inward(rule):
    paths = modules()
    assert any(under(module_name(p), rule.layer) for p in paths), f"no modules in {rule.layer}"
    bad = violations(rule, paths)
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


@pytest.mark.parametrize("layer", LIGHT_LAYERS)
def test_light_layers_load_nothing_heavy(layer):
    paths = [p for p in modules() if under(module_name(p), layer)]
    bad = sorted({chain for path in paths for chain in heavy_loads(path)})
    assert not bad, f"{layer} loads a heavy library when imported:\n" + "\n".join(bad)


def _target(name: str) -> Path | None:
    """The file that defines `name` inside specserve (the deepest module on its path)."""
    files = module_files(name)
    return files[-1] if files else None


def import_graph(paths: list[Path]) -> dict[Path, set[Path]]:
    """module file -> the module files it imports (anywhere in it), leaving out its own packages,
    whose __init__ Python runs first anyway."""
    graph: dict[Path, set[Path]] = {path: set() for path in paths}
    for path in paths:
        for item in imports_of(path):
            target = _target(item.name) if under(item.name, "specserve") else None
            if target is None or target == path:
                continue
            if target.name == "__init__.py" and path.is_relative_to(target.parent):
                continue
            graph[path].add(target)
    return graph


def cycles(graph: dict[Path, set[Path]]) -> list[list[Path]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    on_stack: set[Path] = set()
    found: list[list[Path]] = []
    for root, targets in graph.items():
        if root in index:
            continue
        work = [(root, iter(sorted(targets)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def _shown(component: list[Path]) -> str:
    return " <-> ".join(module_name(p) for p in component)


def test_no_import_cycle_between_modules():
    found = cycles(import_graph(modules()))
    assert not found, "import cycles:\n" + "\n".join(_shown(c) for c in found)


# -- the checker itself


def test_lazy_relative_and_type_checking_imports_are_seen():
    path = PACKAGE / "engine" / "example.py"
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import tree\n"
        "from ..platform import settings as s\n"
        "if TYPE_CHECKING:\n"
        "    import ray\n"
        "class A:\n"
        "    import json\n"
        "def f():\n"
        "    from specserve.platform.state import store\n"
    )
    got = [(i.name, i.line, i.at_import) for i in imports_of(path, source)]
    assert got == [
        ("typing.TYPE_CHECKING", 1, True),
        ("specserve.engine.tree", 2, True),
        ("specserve.platform.settings", 3, True),
        ("ray", 5, False),
        ("json", 7, True),
        ("specserve.platform.state.store", 9, False),
    ]


def test_a_forbidden_import_is_reported_with_its_place(tmp_path, monkeypatch):
    engine = tmp_path / "specserve" / "engine"
    engine.mkdir(parents=True)
    (tmp_path / "specserve" / "__init__.py").write_text("")
    (engine / "__init__.py").write_text("")
    (engine / "step.py").write_text("def f():\n    from specserve.platform import settings\n")
    (engine / "ok.py").write_text("import torch\nfrom specserve.engine import step\n")
    monkeypatch.setitem(globals(), "PACKAGE", tmp_path / "specserve")
    expected = (
        "specserve/engine/step.py:2: specserve.engine.step imports specserve.platform.settings"
        " (not allowed in specserve.engine: specserve)"
    )
    assert violations(RULES[0], modules()) == [expected]


def test_heavy_loads_follow_module_level_imports_only(tmp_path, monkeypatch):
    policies = tmp_path / "specserve" / "policies"
    policies.mkdir(parents=True)
    (tmp_path / "specserve" / "__init__.py").write_text("")
    (policies / "__init__.py").write_text("")
    (policies / "a.py").write_text("from specserve.policies.b import x\n")
    (policies / "b.py").write_text("import torch\ndef g():\n    import ray\n")
    monkeypatch.setitem(globals(), "PACKAGE", tmp_path / "specserve")
    expected = (
        "specserve.policies.a -> specserve/policies/a.py:1 -> specserve/policies/b.py:1"
        " imports torch"
    )
    assert heavy_loads(policies / "a.py") == [expected]


def test_a_cycle_through_a_function_import_is_found(tmp_path, monkeypatch):
    root = tmp_path / "specserve"
    files = {
        "__init__.py": "",
        "a.py": "from specserve.b import x\n",
        "b.py": "def f():\n    from specserve import a  # lazy: hides the cycle\n",
        "c.py": "from specserve.a import y\n",
        "pkg/__init__.py": "from specserve.pkg.d import z\n",
        "pkg/d.py": "from specserve.pkg import e\n",  # its own package: no cycle
        "pkg/e.py": "",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    monkeypatch.setitem(globals(), "PACKAGE", root)
    assert cycles(import_graph(modules())) == [[root / "a.py", root / "b.py"]]
