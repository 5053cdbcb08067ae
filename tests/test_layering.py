"""The package's layers, bottom to top: core/ first, importing nothing outside itself; then the optimizations that
plug into core's protocols; then serving, the teaching tools, the server, the benchmarks and the command. No module
imports one above it, no two modules import each other, no folder imports a folder that imports it back, even through
imports inside functions or through a package's __init__ (docs/ARCHITECTURE.md says why each layer sits where it
does).

Every module of minitransformer/ is read as source (its AST: imports at the top and inside functions alike) and each
import of a minitransformer module is checked against LAYERS. A module may import its own layer and those below.
A new module must be given a layer here, or this test fails and says so.

Importing `a.b.c` runs `a/__init__.py` and `a/b/__init__.py` first (those not yet running: the importer's own
packages are), so an import of a module is also an import of its packages: a circle through a package's __init__ is
a circle. Three more seams: no module imports another module's `_private` name; the server and the CLI read the
Engine only through its read API (serving/outputs.py), never its block manager, scheduler, sequences or step log;
and each optimization plugs into core through the protocol PLUG_INS names, which it provides in full.
"""

from __future__ import annotations

import ast
import importlib
import typing
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "minitransformer"

# bottom -> top; a name ending in ".*" covers a package's modules (its __init__ included)
LAYERS = [
    # core/: what one request needs on one device, in its own reading order
    ("core: foundation", ["core", "core.errors", "core.backend", "core.config", "core.gguf_file", "core.bpe",
                          "core.spm", "core.pretokenize", "core.chat_template", "core.tokenizer", "core.metrics",
                          "core.detokenizer", "core.sampling_params"]),
    ("core: arrays", ["core.layers", "core.rope"]),
    ("core: model", ["core.attention", "core.model"]),
    ("core: caches", ["core.kv_storage", "core.kv_cache"]),
    ("core: stages", ["core.prefill", "core.decode", "core.sampling", "core.stopping", "core.request"]),
    ("core: loop", ["core.generate", "core.loading"]),
    # what plugs into core: models by name, the kernels, weight formats, ranks, masks, other runners
    ("models", ["models"]),
    ("plug-ins", ["kernels.*", "quantize.*", "parallel", "parallel.communicator", "parallel.plan", "parallel.launch",
                  "structured.*", "no_cache", "speculative.*"]),
    ("front door", ["minitransformer"]),
    ("serving", ["serving.*"]),
    ("serving, split", ["parallel.driver", "parallel.kv_connector"]),
    ("lab", ["lab.*"]),
    ("server", ["server.*"]),
    ("learn", ["learn.*"]),            # the exercises' checks plug a learner's function into any layer below
    ("bench", ["bench.*"]),
    ("cli", ["cli.*", "__main__"]),
]

# Each optimization and the core protocol it provides (module.Name -> module.Protocol): the layering keeps core from
# importing them; this table says where each one plugs in, and test_every_plug_in_provides_its_protocol checks it.
PLUG_INS = {
    "kernels.attention_backend.KernelAttention": "core.attention.AttentionBackend",
    "parallel.communicator.MpiCommunicator": "core.model.AllReduce",
    "parallel.communicator.NcclCommunicator": "core.model.AllReduce",
    "parallel.plan.ShardPlan": "core.loading.Shard",
    "structured.params.StructuredOutputsParams": "core.sampling_params.TokenMaskSpec",
    "structured.constraint.Constraint": "core.sampling_params.TokenMask",
    "no_cache.RecomputeRunner": "core.generate.Runner",
    "speculative.runner.SpeculativeRunner": "core.generate.Runner",
    "serving.paged_cache.PagedStep": "core.attention.ForwardCache",
    "serving.paged_cache.PagedKVCache": "core.attention.PagedPool",
    "serving.kv_transfer.ConnectorSide": "serving.engine.KVHooks",
}
# Folders whose modules sit in different layers of LAYERS; a folder's modules are otherwise one unit below.
FOLDERS_OF_ROOT_MODULES = {"models", "no_cache", "__main__", "minitransformer"}


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


def packages_of(module: str) -> list[str]:
    """The packages an import of `module` runs first, outermost first: "bench.layer_cost" -> ["bench"]."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def with_packages(module: str, targets: set[str], known: set[str]) -> set[str]:
    """`module`'s imports plus the package __init__ files each one runs. The importer's own packages are already
    running when it runs, so importing a sibling adds no edge back to them."""
    running = set(packages_of(module)) | {module}
    return targets | {p for t in targets for p in packages_of(t) if p in known and p not in running}


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    known = set(modules)
    return {m: with_packages(m, imports_of(m, p, known), known) for m, p in modules.items()}


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
    assert cycles(import_graph()) == []


def outside_core(graph: dict[str, set[str]]) -> list[str]:
    """Every import from a module of core/ of a module outside it (late imports included)."""
    in_core = lambda module: module == "core" or module.startswith("core.")
    return [f"minitransformer.{m} imports minitransformer.{t}" for m, targets in sorted(graph.items()) if in_core(m)
            for t in sorted(targets) if not in_core(t)]


def test_core_imports_only_core():
    assert outside_core(import_graph()) == []


def folder_of(module: str) -> str:
    """The unit of the folder rule: a sub-package's first name (core, serving, ...), or a module of the package
    root on its own (models, no_cache, the root __init__)."""
    return module.split(".")[0] if module not in FOLDERS_OF_ROOT_MODULES else module


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    folders: dict[str, set[str]] = {}
    for module, targets in graph.items():
        folders.setdefault(folder_of(module), set()).update(folder_of(t) for t in targets)
    return {folder: targets - {folder} for folder, targets in folders.items()}


def test_no_folder_imports_a_folder_that_imports_it_back():
    assert cycles(folder_graph(import_graph())) == []


@pytest.mark.parametrize("planted, expected", [
    ({"core.kv_cache": {"core.generate"}},
     "minitransformer.core.kv_cache (core: caches) imports minitransformer.core.generate (core: loop)"),
    ({"core.model": {"quantize.linear"}},
     "minitransformer.core.model (core: model) imports minitransformer.quantize.linear (plug-ins)"),
])
def test_a_planted_upward_import_is_caught(planted, expected):
    graph = import_graph()
    for module, targets in planted.items():
        graph[module] = graph[module] | targets
    assert expected in upward_imports(graph)


def test_a_planted_import_of_an_optimization_from_core_is_caught():
    """model.py once imported the tensor-parallel communicator: that is what the core rule forbids."""
    graph = import_graph()
    graph["core.model"] = graph["core.model"] | {"parallel.communicator"}
    assert outside_core(graph) == ["minitransformer.core.model imports minitransformer.parallel.communicator"]


def test_a_planted_folder_circle_is_caught():
    """bench/run.py -> lab's figures -> lab/machine.py ran back up once (bench/ and lab/ importing each other)."""
    graph = import_graph()
    graph["lab.viz_measure"] = graph["lab.viz_measure"] | {"bench.serve"}
    assert ["bench", "lab"] in cycles(folder_graph(graph))


def test_a_planted_circle_is_caught():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_late_imports_count(tmp_path):
    source = tmp_path / "late.py"
    source.write_text("def f():\n    from .generate import stream\n    import minitransformer.server.app\n")
    assert imports_of("core.kv_cache", source, {"core.generate", "server.app"}) == {"core.generate", "server.app"}


def test_importing_a_module_runs_its_packages():
    known = {"bench", "bench.run", "lab", "lab.layer_cost", "lab.viz_shapes"}
    assert with_packages("lab.viz_shapes", {"lab.layer_cost"}, known) == {"lab.layer_cost"}
    assert with_packages("bench.run", {"lab.layer_cost"}, known) == {"lab.layer_cost", "lab"}


def test_a_circle_through_a_package_init_is_caught():
    """lab.viz_measure -> bench.workloads would run bench/__init__; were bench/__init__ to import bench.run, and
    bench.run to import lab.viz_measure (it once did, for the machine's label), that would be a circle (it was one):
    the test must see it. All three edges are planted: the real graph has none of them now."""
    graph = import_graph()
    graph["lab.viz_measure"] = with_packages("lab.viz_measure", graph["lab.viz_measure"] | {"bench.workloads"},
                                             set(all_modules()))
    graph["bench"] = graph["bench"] | {"bench.run"}
    graph["bench.run"] = graph["bench.run"] | {"lab.viz_measure"}
    assert any({"bench", "bench.run", "lab.viz_measure"} <= set(group) for group in cycles(graph))


# ---------------------------------------------------------------------------------------------------- plug-ins

def members(protocol) -> set[str]:
    """What a Protocol class declares: its methods, properties and annotated attributes."""
    names = {n for n in vars(protocol) if not n.startswith("_")} | set(getattr(protocol, "__annotations__", {}))
    return names


def provided(cls) -> set[str]:
    """What a class offers: its attributes and methods, and the attributes it annotates (set in __init__)."""
    names = set(dir(cls))
    for klass in cls.__mro__:
        names |= set(getattr(klass, "__annotations__", {}))
    return names


def resolve(dotted: str):
    module, name = dotted.rsplit(".", 1)
    return getattr(importlib.import_module(f"minitransformer.{module}"), name)


@pytest.mark.parametrize("plug_in, protocol", sorted(PLUG_INS.items()))
def test_every_plug_in_provides_its_protocol(plug_in, protocol):
    cls, proto = resolve(plug_in), resolve(protocol)
    assert typing.get_origin(proto) is None and getattr(proto, "_is_protocol", False), f"{protocol} is a Protocol"
    missing = members(proto) - provided(cls)
    assert not missing, f"{plug_in} lacks {sorted(missing)} of {protocol}"


def test_a_plug_in_that_lacks_a_member_is_caught():
    from minitransformer.core.generate import Runner

    class Half:
        def first_logits(self):
            return None
    assert members(Runner) - provided(Half) >= {"next_logits", "sample_next", "release"}


# ---------------------------------------------------------------------------------------------------- private names

def private_imports(module: str, path: Path, known: set[str]) -> list[str]:
    """Every `from x import _name` of `module` that takes another minitransformer module's private name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("minitransformer")):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"minitransformer.{module} imports {alias.name} from "
                                 f"{'.' * node.level}{node.module or ''}")
    return found


def test_no_module_imports_another_modules_private_name():
    modules = all_modules()
    assert [line for m, p in modules.items() for line in private_imports(m, p, set(modules))] == []


def test_a_planted_private_import_is_caught(tmp_path):
    source = tmp_path / "planted.py"
    source.write_text("from .viz_concepts import _plt\n")
    assert private_imports("viz_flow", source, set()) == ["minitransformer.viz_flow imports _plt from .viz_concepts"]


# ---------------------------------------------------------------------------------------------------- the engine's seam

ENGINE_PRIVATE = {"block_manager", "scheduler", "sequences", "step_log"}          # attributes of an Engine
ENGINE_PRIVATE_MODULES = {"serving.block_manager", "serving.scheduler", "serving.sequence"}
ABOVE_THE_ENGINE = ("server", "cli")                                            # packages that read it from above


def engine_internals_touched(module: str, path: Path, known: set[str]) -> list[str]:
    """Where `module` reads an Engine's private parts (an attribute named as one of them, or their modules)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in ENGINE_PRIVATE:
            found.append(f"minitransformer.{module}:{node.lineno} reads .{node.attr}")
    for target in sorted(imports_of(module, path, known) & ENGINE_PRIVATE_MODULES):
        found.append(f"minitransformer.{module} imports minitransformer.{target}")
    return found


def test_the_server_and_the_cli_use_only_the_engines_read_api():
    modules = all_modules()
    above = {m: p for m, p in modules.items() if m.split(".")[0] in ABOVE_THE_ENGINE}
    assert above, "no server or cli modules found"
    assert [line for m, p in above.items() for line in engine_internals_touched(m, p, set(modules))] == []


@pytest.mark.parametrize("source, expected", [
    ("def f(loop):\n    return loop.engine.block_manager.num_free_blocks\n", "reads .block_manager"),
    ("def f(engine):\n    return len(engine.scheduler.waiting)\n", "reads .scheduler"),
    ("def f(engine):\n    return list(engine.sequences)\n", "reads .sequences"),
    ("def f(engine):\n    del engine.step_log[:10]\n", "reads .step_log"),
    ("from ..serving.sequence import Sequence\n", "imports minitransformer.serving.sequence"),
])
def test_a_planted_read_of_the_engines_internals_is_caught(tmp_path, source, expected):
    path = tmp_path / "planted.py"
    path.write_text(source)
    found = engine_internals_touched("server.planted", path, set(all_modules()))
    assert len(found) == 1 and expected in found[0], found
