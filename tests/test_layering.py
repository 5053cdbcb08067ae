"""The package's layers, bottom to top: no module imports one above it, and no two modules import each other, even
through imports inside functions (docs/ARCHITECTURE.md says why each layer sits where it does).

Every module of minitransformer/ is read as source (its AST: imports at the top and inside functions alike) and each
import of a minitransformer module is checked against LAYERS. A module may import its own layer and those below.
A new module must be given a layer here, or this test fails and says so.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "minitransformer"

# bottom -> top; a name ending in ".*" covers a package's modules (its __init__ included)
LAYERS = [
    ("foundation", ["errors", "backend", "config", "weights", "bpe", "pretokenize", "chat_template", "tokenizer", "measure", "claims",
                    "sampling_params", "metrics", "detokenizer", "cuda_graph"]),
    ("arrays", ["layers", "rope", "kernels.*"]),
    ("model", ["attention_backend", "model"]),
    ("caches", ["kv_storage", "kv_cache", "serving.paged_cache"]),
    ("stages", ["prefill", "decode", "sampling", "stopping", "request"]),
    ("loops", ["no_cache", "speculative.*", "generate"]),
    ("serving", ["serving.*"]),
    ("tools", ["quantize.*", "loading", "quality", "bench.*", "viz_concepts", "viz_flow", "viz_shapes",
               "viz_attention", "viz_capacity", "viz_timeline", "viz_batching", "viz_measure",
               "viz"]),
    ("server", ["server.*"]),
    ("cli", ["cli.*", "__main__", "minitransformer"]),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) if parts else "minitransformer"


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> int:
    """The index in LAYERS of the entry that names `module` most specifically."""
    best = None
    for index, (_, names) in enumerate(LAYERS):
        for name in names:
            if name == module or (name.endswith(".*") and (module == name[:-2] or module.startswith(name[:-1]))):
                specific = len(name) - (2 if name.endswith(".*") else 0)
                if best is None or specific > best[0]:
                    best = (specific, index)
    if best is None:
        raise AssertionError(f"minitransformer.{module} has no layer: add it to LAYERS in tests/test_layering.py")
    return best[1]


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The minitransformer modules `module` imports anywhere in its source (relative imports resolved)."""
    is_package = path.name == "__init__.py"
    package = module.split(".") if is_package else module.split(".")[:-1]
    if module == "minitransformer":
        package = []
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif (node.module or "").startswith("minitransformer"):
                target = node.module.removeprefix("minitransformer").lstrip(".")
            else:
                continue
            # `from . import x` / `from .pkg import mod` import modules, not names
            targets = [f"{target}.{a.name}".lstrip(".") for a in node.names
                       if f"{target}.{a.name}".lstrip(".") in known] or [target]
        elif isinstance(node, ast.Import):
            targets = [a.name.removeprefix("minitransformer").lstrip(".") for a in node.names
                       if a.name.split(".")[0] == "minitransformer"]
        for target in targets:
            found.add(target or "minitransformer")
    found.discard(module)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    known = set(modules)
    return {m: imports_of(m, p, known) for m, p in modules.items()}


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [f"minitransformer.{m} ({LAYERS[layer_of(m)][0]}) imports minitransformer.{t} ({LAYERS[layer_of(t)][0]})"
            for m, targets in sorted(graph.items()) for t in sorted(targets) if layer_of(t) > layer_of(m)]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan's algorithm), i.e. every import circle."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in graph:
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_every_module_has_a_layer():
    for module in all_modules():
        layer_of(module)


def test_no_module_imports_a_layer_above_it():
    assert upward_imports(import_graph()) == []


def test_no_import_circles():
    graph = {m: {t for t in targets if t != "minitransformer"} for m, targets in import_graph().items()}
    assert cycles(graph) == []


@pytest.mark.parametrize("planted, expected", [
    ({"kv_cache": {"generate"}}, "minitransformer.kv_cache (caches) imports minitransformer.generate (loops)"),
    ({"model": {"quantize.linear"}}, "minitransformer.model (model) imports minitransformer.quantize.linear (tools)"),
])
def test_a_planted_upward_import_is_caught(planted, expected):
    graph = import_graph()
    for module, targets in planted.items():
        graph[module] = graph[module] | targets
    assert expected in upward_imports(graph)


def test_a_planted_circle_is_caught():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_late_imports_count(tmp_path):
    source = tmp_path / "late.py"
    source.write_text("def f():\n    from .generate import stream\n    import minitransformer.server.app\n")
    assert imports_of("kv_cache", source, {"generate", "server.app"}) == {"generate", "server.app"}
