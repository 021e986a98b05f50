"""The shape of the package, read statically: an import inside a function says why
(`# lazy: <why>`), and no module is over 350 lines or function over 60."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import test_layering as layering
from test_layering import modules

MAX_MODULE_LINES = 350
MAX_FUNCTION_LINES = 60


def _relative(path: Path) -> Path:
    return path.relative_to(layering.PACKAGE.parent)


def unexplained_lazy_imports(path: Path, source: str | None = None) -> list[str]:
    """Imports inside a function without a `# lazy: <why>` comment on their lines."""
    source = source if source is not None else path.read_text()
    lines = source.splitlines()
    bad = []
    for func in ast.walk(ast.parse(source)):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(func):
            if isinstance(node, ast.Import | ast.ImportFrom):
                text = " ".join(lines[node.lineno - 1 : node.end_lineno])
                if "# lazy:" not in text:
                    bad.append(f"{_relative(path)}:{node.lineno}")
    return sorted(set(bad))


def long_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [
        f"{_relative(path)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]


def test_imports_inside_functions_say_why():
    bad = [where for path in modules() for where in unexplained_lazy_imports(path)]
    assert not bad, "imports inside functions without `# lazy: <why>`:\n" + "\n".join(bad)


def test_modules_are_small():
    big = [
        f"{_relative(p)} ({n} lines)"
        for p in modules()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not big, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(big)


def test_functions_are_short():
    bad = [where for path in modules() for where in long_functions(path)]
    assert not bad, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(bad)


# -- the checkers themselves


def _package(tmp_path: Path, files: dict[str, str], monkeypatch) -> Path:
    root = tmp_path / "specserve"
    for name, text in {"__init__.py": "", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    monkeypatch.setattr("test_layering.PACKAGE", root)
    return root


def test_an_import_inside_a_function_needs_a_reason(tmp_path, monkeypatch):
    root = _package(tmp_path, {}, monkeypatch)
    source = (
        "import json\n"
        "def f():\n"
        "    import torch  # lazy: the CLI starts without torch\n"
        "    from os import (\n"
        "        path,\n"
        "    )\n"
        "def g():\n"
        "    def h():\n"
        "        import ray\n"
    )
    assert unexplained_lazy_imports(root / "m.py", source) == [
        "specserve/m.py:4",
        "specserve/m.py:9",
    ]


@pytest.mark.parametrize(
    "lines, too_long", [(MAX_FUNCTION_LINES, False), (MAX_FUNCTION_LINES + 1, True)]
)
def test_function_length_counts_def_to_last_line(tmp_path, monkeypatch, lines, too_long):
    root = _package(tmp_path, {}, monkeypatch)
    body = "".join(f"    x{i} = {i}\n" for i in range(lines - 1))
    (root / "m.py").write_text("def f():\n" + body)
    assert bool(long_functions(root / "m.py")) is too_long
