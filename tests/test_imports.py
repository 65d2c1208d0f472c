"""The package has no import cycle between modules, and no attnlab import hidden in a function."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[1] / "scripts" / "import_graph.py"
_SPEC = importlib.util.spec_from_file_location("import_graph", _PATH)
graph_tool = importlib.util.module_from_spec(_SPEC)
sys.modules["import_graph"] = graph_tool
_SPEC.loader.exec_module(graph_tool)


def test_no_import_cycle_between_modules():
    graph = graph_tool.module_graph()
    assert len(graph) > 50  # the walk found the package
    assert graph_tool.cycles(graph) == []


def test_no_import_cycle_between_packages():
    assert graph_tool.cycles(graph_tool.package_graph(graph_tool.module_graph())) == []


def test_no_function_level_import_of_attnlab():
    assert graph_tool.function_level_imports() == []


def test_lower_layers_never_import_higher_ones():
    packages = graph_tool.package_graph(graph_tool.module_graph())
    assert not packages["nn"] - {"config", "errors"}
    assert not packages["errors"]  # the bottom: every layer may raise its errors
    assert not packages["models"] & {"tasks", "train", "cli", "recipes", "generate", "load", "interop"}
    assert not packages["train"] & {"tasks", "cli", "recipes", "models", "interop", "load"}
    assert not packages["interop"] & {"tasks", "cli", "recipes", "load", "convert"}
    assert not packages["serve"] & {"cli", "viz"}  # serve sits under cli, beside viz, above load
    assert {p for p, deps in packages.items() if "serve" in deps} <= {"cli"}
    assert not packages["models"] & {"engines"}  # the model is the reference; engines sit above it
    assert not packages["engines"] & {"generate", "load", "interop", "tasks", "train", "cli", "recipes"}


def test_the_checker_finds_a_cycle_and_a_hidden_import(tmp_path):
    pkg = tmp_path / "attnlab"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from attnlab.b import x\n")
    (pkg / "b.py").write_text("def f():\n    from attnlab import a\n")
    graph = graph_tool.module_graph(tmp_path)
    assert graph_tool.cycles(graph) == [["attnlab.a", "attnlab.b"]]
    assert graph_tool.function_level_imports(tmp_path) == ["attnlab.b:2 -> attnlab.a"]
