"""The package's layers, from its imports (function-level imports included): each folder of
shim/ is a layer, and a module imports only from its own layer and those below it (LAYERS, the
order ARCHITECTURE.md draws); the core knows the backends only through the registry of their
classes (shim/backends/devices.py); and no module imports itself through others."""

import ast
import shutil
from pathlib import Path

import shim

PACKAGE = Path(shim.__file__).resolve().parent

# The layers, bottom to top: a folder of shim/ (every module in it), or a top-level module.
# shim._version is a fact every layer may read; "shim" is the public API (shim/__init__.py).
LAYERS = ["shim._version", "shim.base", "shim.native", "shim.backends", "shim.memory",
          "shim.profiling", "shim.core", "shim.exchange", "shim.buffers", "shim.interop",
          "shim.calls", "shim", "shim.dask_device", "shim.dask", "shim.pipelines", "shim.cli",
          "shim.__main__"]

# The one module of the core that names backend classes: it registers them.
BACKEND_REGISTRY = "shim.backends.devices"


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set) -> set:
    """The package's modules ``path`` imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # ``from shim import x`` imports the module shim.x where there is one.
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules
                     else node.module for alias in node.names]
        else:
            continue
        found.update(name for name in names if name in modules)
    return found


def import_graph(package: Path = PACKAGE) -> dict:
    paths = {module_name(p, package): p for p in package.rglob("*.py")}
    modules = set(paths)
    return {name: imports_of(path, modules) - {name, "shim"} for name, path in paths.items()}


def layer_of(module: str) -> int:
    """The index in LAYERS of the layer ``module`` belongs to (the longest prefix that names it)."""
    for i in sorted(range(len(LAYERS)), key=lambda i: -len(LAYERS[i])):
        if module == LAYERS[i] or module.startswith(LAYERS[i] + ".") and LAYERS[i] != "shim":
            return i
    raise LookupError(f"{module} belongs to no layer: add its folder to LAYERS")


def upward_imports(graph: dict) -> set:
    """(importer, imported) of each import from a lower layer of a higher one."""
    return {(module, imported) for module, imports in graph.items() for imported in imports
            if layer_of(imported) > layer_of(module)}


def circles(graph: dict) -> set:
    """The graph's strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), set()

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_circle():
    assert circles(import_graph()) == set()


def test_every_module_belongs_to_a_layer():
    for module in import_graph():
        layer_of(module)  # (raises for a folder LAYERS does not place)


def test_no_layer_imports_a_higher_one():
    assert upward_imports(import_graph()) == set()


def test_an_upward_import_planted_in_a_copy_of_the_package_is_found(tmp_path):
    # The walk and the order together: a copy of shim/ with one late import of the core added
    # to a module of the bottom layer, where a cleanup might slip one in.
    copy = tmp_path / "shim"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    with open(copy / "base" / "errors.py", "a") as f:
        f.write("\n\ndef _planted():\n    from shim.core import runtime\n")
    assert upward_imports(import_graph(copy)) == {("shim.base.errors", "shim.core.runtime")}


def test_the_layers_tell_apart_a_folder_and_the_public_api():
    assert layer_of("shim.base.errors") == LAYERS.index("shim.base")
    assert layer_of("shim") == LAYERS.index("shim")
    assert layer_of("shim.dask") == LAYERS.index("shim.dask")
    assert layer_of("shim.dask.labelled") == layer_of("shim.dask.chunked") == layer_of("shim.dask")
    assert layer_of("shim.backends.devices") < layer_of("shim.memory.families")


def test_the_walk_sees_function_level_imports(tmp_path):
    # A module written for the purpose: imports inside a function and inside a method.
    module = tmp_path / "late.py"
    module.write_text("def f():\n    from shim.buffers import buffer\n\n\n"
                      "class C:\n    def g(self):\n        import shim.base.errors\n")
    modules = {"shim.buffers.buffer", "shim.base.errors"}
    assert imports_of(module, modules) == modules


def test_only_the_registry_imports_a_backend_by_name():
    # (OpenCL's image memory lives on the OpenCL backend's device, which it imports: the one
    # backend that names another, of its own API.)
    concrete = {"shim.backends.host", "shim.backends.opencl", "shim.backends.cuda",
                "shim.backends.opencl_image"}
    importers = {module for module, imports in import_graph().items()
                 if imports & concrete and module not in concrete}
    assert importers == {BACKEND_REGISTRY}


def test_the_walk_finds_a_circle_where_there_is_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == {frozenset({"a", "b", "c"})}
