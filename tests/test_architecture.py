"""The package's layers, from its imports (function-level imports included): backends sit
under the core and import none of it, the core knows the backends only through the registry
of their classes (shim/devices.py), and no module imports itself through others."""

import ast
from pathlib import Path

import shim

PACKAGE = Path(shim.__file__).resolve().parent

# What a backend may import: the native layer and small shared helpers.
BACKEND_MAY_IMPORT = {"shim.native", "shim.errors", "shim.regions", "shim.streams",
                      "shim.sections", "shim.binary_cache", "shim.private_files"}

# The one module of the core that names backend classes: it registers them.
BACKEND_REGISTRY = "shim.devices"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
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


def import_graph() -> dict:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(paths)
    return {name: imports_of(path, modules) - {name, "shim"} for name, path in paths.items()}


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


def test_backends_import_only_the_layers_below_them():
    graph = import_graph()
    upward = {(module, imported) for module, imports in graph.items()
              if module.startswith("shim.backends.")
              for imported in imports
              if not imported.startswith("shim.backends") and imported not in BACKEND_MAY_IMPORT}
    assert upward == set()


def test_the_walk_sees_function_level_imports(tmp_path):
    # A module written for the purpose: imports inside a function and inside a method.
    module = tmp_path / "late.py"
    module.write_text("def f():\n    from shim import buffer\n\n\n"
                      "class C:\n    def g(self):\n        import shim.errors\n")
    assert imports_of(module, {"shim.buffer", "shim.errors"}) == {"shim.buffer", "shim.errors"}


def test_only_the_registry_imports_a_backend_by_name():
    concrete = {"shim.backends.host", "shim.backends.opencl", "shim.backends.cuda"}
    importers = {module for module, imports in import_graph().items()
                 if imports & concrete and not module.startswith("shim.backends.")}
    assert importers == {BACKEND_REGISTRY}


def test_the_walk_finds_a_circle_where_there_is_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == {frozenset({"a", "b", "c"})}
