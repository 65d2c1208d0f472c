"""Print the import graph of src/attnlab: for each package (or root module), the packages it imports,
and any import cycle between modules. Read with `ast`; nothing is imported or run.

    python scripts/import_graph.py            # package -> packages, then "no cycle" or the cycles
    python scripts/import_graph.py --modules  # module -> modules

tests/test_imports.py uses the same functions: it fails on a cycle and on a function-level import of
an attnlab module.
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "attnlab"


def module_name(path: Path, src: Path = SRC) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(src: Path = SRC) -> dict[str, Path]:
    """{dotted module name: file} of every module of the package."""
    return {module_name(p, src): p for p in sorted((src / ROOT).rglob("*.py"))}


def _resolve(node: ast.ImportFrom, current: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = current.split(".") if is_package else current.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, int, bool]]:
    """(imported attnlab module, line, inside a function) for every import statement of `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nested = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
              for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node, name, path.name == "__init__.py")
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for target in targets:
            if target == ROOT or target.startswith(ROOT + "."):
                while target not in known and "." in target:
                    target = target.rsplit(".", 1)[0]
                found.append((target, node.lineno, id(node) in nested))
    return found


def module_graph(src: Path = SRC) -> dict[str, set[str]]:
    mods = modules(src)
    return {name: {t for t, _, _ in imports(name, path, set(mods)) if t != name} for name, path in mods.items()}


def function_level_imports(src: Path = SRC) -> list[str]:
    """'module:line -> target' for each import of an attnlab module inside a function."""
    mods = modules(src)
    return [f"{name}:{line} -> {t}" for name, path in mods.items() for t, line, inner in imports(name, path, set(mods))
            if inner]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def package_of(module: str) -> str:
    """attnlab.tasks.base -> tasks; attnlab.generate -> generate (root modules stand alone); the
    package's own __init__ -> attnlab."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for mod, targets in graph.items():
        here = package_of(mod)
        out.setdefault(here, set()).update(package_of(t) for t in targets if package_of(t) != here)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modules", action="store_true", help="module-level graph instead of packages")
    args = p.parse_args()
    graph = module_graph()
    shown = graph if args.modules else package_graph(graph)
    for name in sorted(shown):
        print(f"{name:14s} -> {', '.join(sorted(shown[name])) or '(nothing of attnlab)'}")
    found = cycles(graph)
    print("module cycles: " + ("; ".join(" <-> ".join(c) for c in found) if found else "none"))
    print("package cycles: " + ("; ".join(" <-> ".join(c) for c in cycles(package_graph(graph))) or "none"))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
