"""The native library's layers: native_stubs/ holds one folder a layer, and each C file uses
only what the files of its own layer and of the layers below it define, with no circle among
the files, so that each can be read and changed knowing only what is below it.

The check reads the sources as text, at the level of C's top-level items: what a file defines
with external linkage (functions and variables, not static ones), which identifiers its
function bodies, initializers and macros use, and which of the library's headers it includes.
A header's inline functions and macros are uses of every C file that includes it.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NATIVE = ROOT / "native_stubs"
ABI = ROOT / "abi"

# The layers, lowest first: a file may use its own layer's files and those of the layers before
# it. Below them all: the base header native_stubs/shim_native.h, and the ABI in abi/.
LAYERS = ("calls", "profiling", "forks", "devices", "backends", "fast")

# Comments, then string and character literals.
_LEXICAL = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
_TOKEN = re.compile(r"[A-Za-z_]\w*|\S")
_DEFINE = re.compile(r"#\s*define\s+(\w+)(\()?(.*)", re.S)
_INCLUDE = re.compile(r'#\s*include\s*"([^"]+)"')
_OPEN, _CLOSE = "({[", ")}]"
_INTERNAL = {"static", "extern", "typedef"}  # in a declaration: it defines nothing external


class Source:
    """One C file or header, as the check sees it."""

    def __init__(self, text: str):
        self.includes: list[str] = []  # the headers it includes with "", as written
        self.defines: set[str] = set()   # functions and variables with external linkage
        self.declares: set[str] = set()  # function prototypes
        self.uses: set[str] = set()      # identifiers of its bodies, initializers and macros
        # Comments become blanks (keeping the lines); the literals of code and macros, empty
        # strings: neither holds uses.
        code = _LEXICAL.sub(lambda m: m.group() if m.group()[0] in "\"'" else
                            "\n" * m.group().count("\n") or " ", text).replace("\\\n", " ")
        lines = []
        macros = set()  # function-like ones, which a file may invoke as a top-level item
        for line in code.split("\n"):
            directive = line.strip()
            if include := _INCLUDE.match(directive):
                self.includes.append(include.group(1))
            elif define := _DEFINE.match(directive):
                self.uses |= _identifiers(_TOKEN.findall(_LEXICAL.sub('""', define.group(3))))
                if define.group(2):
                    macros.add(define.group(1))
            elif not directive.startswith("#"):
                lines.append(_LEXICAL.sub('""', line))
        for item, kind in _items(_TOKEN.findall("\n".join(lines)), macros):
            if kind != "declaration":
                self.uses |= _identifiers(item)
            if kind != "invocation":
                declared, name = _declared(item, kind)
                if declared == "definition":
                    self.defines.add(name)
                elif declared == "prototype":
                    self.declares.add(name)
        self.uses -= self.defines


def _identifiers(tokens):
    return {t for t in tokens if t[0].isalpha() or t[0] == "_"}


def _items(tokens, macros):
    """The top-level items of a file, each as (its tokens, its kind): "function" (a function
    with its body), "initialized" (a declaration with an initializer), "invocation" (of one of
    ``macros``, a function-like macro, at top level), else "declaration". An item ends at a
    semicolon, at the end of a function body, or at an invocation's closing parenthesis."""
    item, depth, function = [], 0, False
    for token in tokens:
        item.append(token)
        if token in _OPEN:
            if depth == 0 and token == "{" and item[-2:-1] == [")"] and "=" not in item:
                function = True
            depth += 1
        elif token in _CLOSE:
            depth -= 1
        if depth:
            continue
        if item[0] in macros and item[1:2] == ["("] and token == ")":
            yield item, "invocation"
        elif token == "}" and function:
            yield item, "function"
        elif token == ";":
            yield item, "initialized" if "=" in item else "declaration"
        else:
            continue
        item, function = [], False


def _declared(item, kind):
    """What a top-level item declares: ("definition", name) of a function or a variable with
    external linkage, ("prototype", name) of a function declared without its body, else
    (None, None)."""
    head = []  # the declaration's words up to its first parenthesis, bracket or brace
    i = 0
    while i < len(item):
        token = item[i]
        if token == "__attribute__":
            i = _after_group(item, i + 1)
            continue
        if token in _INTERNAL:
            return None, None
        if token == "(":
            if not head or kind == "initialized":
                return None, None  # (a pointer to a function, say: none here)
            return ("definition" if kind == "function" else "prototype"), head[-1]
        if token == "{":
            return None, None  # a struct, union or enum type
        if token in ("=", ";", ",", "["):
            return ("definition", head[-1]) if head else (None, None)
        head.append(token)
        i += 1
    return None, None


def _after_group(tokens, start):
    """The index just after the parenthesized group that opens at tokens[start]."""
    depth = 0
    for i in range(start, len(tokens)):
        depth += (tokens[i] in _OPEN) - (tokens[i] in _CLOSE)
        if depth == 0:
            return i + 1
    return len(tokens)


def read_tree(native: Path) -> dict[str, Source]:
    """{path relative to ``native``: its Source} for every C file and header below it."""
    return {path.relative_to(native).as_posix(): Source(path.read_text())
            for path in sorted(native.rglob("*")) if path.suffix in (".c", ".h")}


def layer_of(name: str, layers) -> int:
    """The index in ``layers`` of the layer of ``name`` (a path in the tree); -1 for the base
    header, at the top of the tree."""
    return layers.index(name.split("/")[0]) if "/" in name else -1


def problems(native: Path, layers=LAYERS, abi: Path = ABI) -> list[str]:
    """What breaks the layering of the tree in ``native``: files outside the layers, includes
    and uses of a higher layer, circles among the C files. Empty when it holds."""
    tree = read_tree(native)
    found = []
    for name in tree:
        parts = name.split("/")
        if len(parts) > 2 or (len(parts) == 2 and parts[0] not in layers) or \
                (len(parts) == 1 and name.endswith(".c")):
            found.append(f"{name} is in no layer (they are {', '.join(layers)})")
    found += [f"the layer {layer} has no C file" for layer in layers
              if not any(name.startswith(f"{layer}/") and name.endswith(".c") for name in tree)]
    if found:
        return found
    definers: dict[str, list[str]] = {}
    for name, source in tree.items():
        for symbol in source.defines:
            definers.setdefault(symbol, []).append(name)
    found += [f"{symbol} is defined in more than one file: {', '.join(names)}"
              for symbol, names in sorted(definers.items()) if len(names) > 1]
    for name, source in tree.items():
        level = layer_of(name, layers)
        for include in source.includes:
            if include in tree:
                if layer_of(include, layers) > level:
                    found.append(f"{name} includes {include}, of a higher layer")
            elif not (abi / include).is_file():
                found.append(f"{name} includes {include}, which is neither in native_stubs/ "
                             "(by its path there) nor in abi/")
        for symbol in sorted(source.uses):
            for definer in definers.get(symbol, []):
                if layer_of(definer, layers) > level:
                    found.append(f"{name} uses {symbol}, which {definer} defines, of a higher layer")
    found += [f"a circle: {' -> '.join(circle)}" for circle in _circles(_file_uses(tree, definers))]
    return found


def _file_uses(tree, definers) -> dict[str, set[str]]:
    """{C file: the other C files it uses}, counting the uses in the headers it includes (their
    inline functions and macros), directly or through other headers."""
    graph = {}
    for name, source in tree.items():
        if name.endswith(".c"):
            symbols, seen, pending = set(source.uses), set(), list(source.includes)
            while pending:
                include = pending.pop()
                if include in tree and include not in seen:
                    seen.add(include)
                    symbols |= tree[include].uses
                    pending += tree[include].includes
            graph[name] = {definer for symbol in symbols for definer in definers.get(symbol, [])
                           if definer != name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle of each group of nodes of ``graph`` that reach each other, as its nodes with
    the first again at the end."""
    def reach(node):
        seen, pending = set(), [node]
        while pending:
            for neighbour in graph.get(pending.pop(), ()):
                if neighbour not in seen:
                    seen.add(neighbour)
                    pending.append(neighbour)
        return seen

    reached = {node: reach(node) for node in graph}
    groups = []
    for node in sorted(graph):
        group = {other for other in reached[node] if node in reached.get(other, ())}
        if group and not any(node in known for known in groups):
            groups.append(group)
    return [_cycle({node: graph[node] & group for node in group}) for group in groups]


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """A cycle of ``graph``, in which every node reaches every other: from its first node by
    name, the first neighbour by name each time, until a node comes again."""
    path = [min(graph)]
    while True:
        path.append(min(graph[path[-1]]))
        if path[-1] in path[:-1]:
            return path[path.index(path[-1]):]


# --- the library ---------------------------------------------------------------------------------


def test_the_native_library_is_layered_with_no_circle():
    assert problems(NATIVE) == []


def test_the_check_reads_what_the_library_defines():
    """The parse finds the definitions the library exports: every shim_* function abi/shim_*.h
    declares (but the Python core's callbacks, which cffi defines) is defined in a C file, and
    everything it takes for a definition has the library's prefixes (what a misread call or
    declaration would not)."""
    tree = read_tree(NATIVE)
    defined = {symbol: name for name, source in tree.items() for symbol in source.defines}
    declared = {symbol for path in ABI.glob("shim_*.h") if path.name != "shim_callbacks.h"
                for symbol in Source(path.read_text()).declares if symbol.startswith("shim_")}
    assert len(declared) > 50
    assert sorted(declared - defined.keys()) == []
    assert len(defined) > 140
    assert [s for s in defined if not s.startswith(("shim_", "halide_"))] == []
    assert defined["shim_profiling"] == "profiling/profile.c"  # a variable
    assert defined["halide_opencl_run"] == "backends/opencl.c"  # parameters from a macro


def test_the_check_reads_the_uses_between_the_files():
    """Known uses across files are in the parse, with those of the headers' inline functions:
    a thread-pool task enters its call's context and goes to the pool; a fork resets the pool; a
    launch refuses in a forked child and counts while profiling; the fast paths record calls in
    the families."""
    tree = read_tree(NATIVE)
    definers = {symbol: [name] for name, source in tree.items() for symbol in source.defines}
    uses = _file_uses(tree, definers)
    assert uses["calls/parallel.c"] == {"calls/call_context.c", "calls/thread_pool.c"}
    assert "calls/thread_pool.c" in uses["forks/fork.c"]
    assert {"forks/fork.c", "profiling/profile.c", "calls/call_context.c",
            "devices/device_generic.c"} <= uses["backends/cuda.c"]
    assert {"fast/shared_records.c", "fast/family_state.c"} <= uses["fast/call_records.c"]
    assert {"fast/members.c", "fast/run.c", "fast/objects.c"} <= uses["fast/fastcall.c"]
    assert "shim_profiling" not in tree["fast/fastcall.c"].uses  # but in profiling/profile.h's
    assert "profiling/profile.c" in uses["fast/fastcall.c"]


# --- the check itself, on planted trees ------------------------------------------------------------


def plant(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


LOW = """/* The lower layer, which high_get() (above it) uses. */
#include "shim_native.h"
#include "low/low.h"

static int counter;
int low_value = 3;

const char *low_name(void) {
    return "high_get";
}

int low_get(void) {
    return counter + low_value;
}
"""

HIGH = """#include "shim_native.h"
#include "low/low.h"

#define TWICE(x) (2 * (x))

__attribute__((constructor)) static void start(void) {
    low_value = 4;
}

int high_get(void) {
    return TWICE(low_get());
}
"""

CLEAN = {
    "shim_native.h": "#ifndef BASE\n#define BASE\n#endif\n",
    "low/low.h": "extern int low_value;\nint low_get(void);\n"
                 "static inline int low_twice(void) { return 2 * low_value; }\n",
    "low/low.c": LOW,
    "high/high.c": HIGH,
}


def check(root: Path) -> list[str]:
    return problems(root, ("low", "high"), root / "abi")


def test_a_clean_planted_tree_passes_and_is_read_as_written(tmp_path):
    root = plant(tmp_path, CLEAN)
    assert check(root) == []
    tree = read_tree(root)
    assert tree["low/low.c"].defines == {"low_value", "low_name", "low_get"}
    assert tree["high/high.c"].defines == {"high_get"}
    assert {"low_get", "low_value"} <= tree["high/high.c"].uses
    assert "high_get" not in tree["low/low.c"].uses  # a comment's and a string's words
    header = tree["low/low.h"]  # its inline function uses; its declarations do not
    assert "low_value" in header.uses and "low_get" not in header.uses
    assert header.declares == {"low_get"} and header.defines == set()  # static inline


def test_a_planted_upward_use_is_found(tmp_path):
    low = LOW.replace("return counter + low_value;", "return counter + high_get();")
    root = plant(tmp_path, {**CLEAN, "low/low.c": low})
    assert check(root) == ["low/low.c uses high_get, which high/high.c defines, of a higher layer",
                           "a circle: high/high.c -> low/low.c -> high/high.c"]


def test_a_planted_upward_use_in_a_headers_macro_is_found(tmp_path):
    header = CLEAN["low/low.h"] + "#define LOW_GET() high_get()\n"
    root = plant(tmp_path, {**CLEAN, "low/low.h": header})
    assert check(root) == ["low/low.h uses high_get, which high/high.c defines, of a higher layer",
                           "a circle: high/high.c -> low/low.c -> high/high.c"]


def test_a_planted_upward_include_is_found(tmp_path):
    low = LOW.replace('#include "low/low.h"', '#include "high/high.h"')
    root = plant(tmp_path, {**CLEAN, "low/low.c": low, "high/high.h": "int high_get(void);\n"})
    assert check(root) == ["low/low.c includes high/high.h, of a higher layer"]


def test_a_planted_circle_within_one_layer_is_found(tmp_path):
    other = "int low_other(void) {\n    return low_get();\n}\n"
    low = LOW.replace("return counter + low_value;", "return counter + low_other();")
    root = plant(tmp_path, {**CLEAN, "low/low.c": low, "low/other.c": other})
    assert check(root) == ["a circle: low/low.c -> low/other.c -> low/low.c"]


def test_planted_files_outside_the_layers_are_found(tmp_path):
    root = plant(tmp_path, {**CLEAN, "loose.c": "int loose(void) { return 0; }\n",
                            "extra/extra.c": "int extra(void) { return 0; }\n",
                            "high/deeper/deep.h": "int deep(void);\n"})
    assert check(root) == ["extra/extra.c is in no layer (they are low, high)",
                           "high/deeper/deep.h is in no layer (they are low, high)",
                           "loose.c is in no layer (they are low, high)"]


def test_a_planted_layer_without_c_files_is_found(tmp_path):
    root = plant(tmp_path, {name: text for name, text in CLEAN.items() if name != "high/high.c"})
    assert check(root) == ["the layer high has no C file"]
