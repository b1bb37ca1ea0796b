"""The code's shape, held: no function in src/ longer than 80 lines of code (its docstring, comments
and blank lines not counted), except where one piece serves a reader better, which the function says
in a comment naming this rule (``# one piece:`` and why); and no import, at a module's top or inside a
function, that runs in a circle."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "bertforge"
LIMIT = 80
EXEMPT = "# one piece:"


def _code_lines(source: str) -> set[int]:
    """The line numbers holding code: not blank, not only a comment."""
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                            tokenize.ENDMARKER):
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return lines


def long_functions(limit: int = LIMIT) -> list[tuple[str, int]]:
    """(file:function, lines of code) of every function over ``limit`` lines that does not say why."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        code, text = _code_lines(source), source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            span = set(range(node.lineno, node.end_lineno + 1))
            doc = node.body[0] if node.body and isinstance(node.body[0], ast.Expr) and isinstance(
                getattr(node.body[0], "value", None), ast.Constant) and isinstance(node.body[0].value.value, str) else None
            if doc is not None:
                span -= set(range(doc.lineno, doc.end_lineno + 1))
            n = len(span & code)
            if n > limit and not any(EXEMPT in line for line in text[node.lineno - 1:node.end_lineno]):
                found.append((f"{path.relative_to(SRC.parent)}:{node.name}", n))
    return found


def test_no_function_is_longer_than_80_lines_of_code():
    assert long_functions() == []


if __name__ == "__main__":
    for name, n in sorted(long_functions(), key=lambda x: -x[1]):
        print(f"{n:4d}  {name}")


def _is_module(name: str) -> bool:
    path = SRC.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports() -> dict[str, set[str]]:
    """Module -> the bertforge modules it imports (anywhere in it: a function's lazy import counts too)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bertforge"):
                found.add(node.module)  # `from package import module` imports the module: see below
                found.update(f"{node.module}.{a.name}" for a in node.names)
                if all(_is_module(f"{node.module}.{a.name}") for a in node.names):
                    found.discard(node.module)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("bertforge"))
    return {m: {t for t in targets if t in graph and t != m} for m, targets in graph.items()}


def test_no_import_runs_in_a_circle():
    """The package's modules import one another in one direction only (a package's __init__ aside, which
    gathers its modules for users)."""
    graph = {m: t for m, t in _imports().items() if m != "bertforge"}
    state: dict[str, int] = {}
    circles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                circles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert circles == []
