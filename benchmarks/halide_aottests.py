"""Halide's own AOT tests (test/generator/*_aottest.cpp, each with its generators), run with
Halide's stock runtime and with the shim's, side by side: a step of the Halide 22 kit
(benchmarks/halide22_kit.py), run in the interpreter whose halide builds them.

    python benchmarks/halide_aottests.py --halide-source PATH [--ref REF] --work DIR
        [--json FILE] [--logs DIR] [--tests NAME,...] [-j N]

What each test is made of comes from Halide's test/generator/CMakeLists.txt, read as its
functions _add_halide_libraries and _add_halide_aot_tests take it: the libraries a test links,
each one's generator and sources, generator name, function name, target features, generator
params and targets (several: a multitarget library), the test's sources and include folders,
and the environment set_tests_properties gives it. The file's own function definitions are not
read, conditions (if) are not evaluated: every branch's definitions count and a variable keeps
its last assignment, which in Halide's file is its choice for a host that is not wasm;
target_link_libraries, which Halide's file uses only to add CUDA builds, is not followed.
A test that needs what the kit does not build (an autoscheduler or plugin, a condition such as
WITH_AUTOSCHEDULERS, a library defined by rules of its own, a target other than the host's) is
listed as not built, saying why; so is an *_aottest.cpp that no _add_halide_aot_tests names.

Each test is built twice, for the host (CMake's "cmake" target), with the LLVM backend (the C
backend's variants, generator_aotcpp_*, are left out):
- stock: its first library with Halide's runtime, the others no_runtime, linked with the test
  into an executable, run as is: Halide's own runtime;
- shim: every library no_runtime, linked with the test into a shared library whose main is
  called from a Python child process that imported shim first, so that every halide_* the
  pipelines and the test call is the shim's.
A test passes when it exits 0, and skips when it says [SKIP] (Halide's tests do where the
target lacks what they test, a GPU most often). The table says each side's outcome; a test
that passes (or skips) with the stock runtime and not with the shim is a failure of the shim.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from halide_generators import compile_generator, halide_package, run  # noqa: E402
from halide_source import HalideSource  # noqa: E402
from kit_steps import last_line, log, private_folder, stream  # noqa: E402

# What the tests are built from: the tests and generators, what they include from test/common
# and tools/, and the runtime's headers some include (cleanup_on_error's device_interface.h).
FOLDERS = ("test/generator", "test/common", "tools", "src/runtime")
CMAKE_FILE = "test/generator/CMakeLists.txt"
# How long one side of one test may run, and one build command.
RUN_SECONDS = 300
BUILD_SECONDS = 900

# The shim's side: the test's main, called in a process that loaded the shim's native library
# (globally) first.
SHIM_MAIN = """
import ctypes, sys
import shim
library = ctypes.CDLL(sys.argv[1])
argv = (ctypes.c_char_p * 2)(sys.argv[2].encode(), None)
code = library.main(1, argv)
ctypes.CDLL(None).fflush(None)
sys.exit(code)
"""


# --- reading CMakeLists.txt -------------------------------------------------------------------

_TOKEN = re.compile(r'"((?:[^"\\]|\\.)*)"|([()])|([^\s()"]+)', re.S)
_VARIABLE = re.compile(r"\$\{([^${}]*)\}")


def cmake_commands(text: str) -> list[tuple[str, list[tuple[str, bool]]]]:
    """The commands of a CMake file, in order: (name in lower case, [(argument, quoted)]);
    parentheses inside a command's arguments (an if's condition) are dropped."""
    text = "\n".join(_strip_comment(line) for line in text.splitlines())
    commands, at = [], 0
    start = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(")
    while (found := start.search(text, at)) is not None:
        depth, args, at = 1, [], found.end()
        for token in _TOKEN.finditer(text, at):
            quoted, paren, bare = token.groups()
            at = token.end()
            if paren == "(":
                depth += 1
            elif paren == ")":
                depth -= 1
                if depth == 0:
                    break
            elif quoted is not None:
                args.append((quoted.replace('\\"', '"'), True))
            else:
                args.append((bare, False))
        commands.append((found.group(1).lower(), args))
    return commands


def _strip_comment(line: str) -> str:
    quoted = False
    for i, c in enumerate(line):
        if c == '"' and (i == 0 or line[i - 1] != "\\"):
            quoted = not quoted
        elif c == "#" and not quoted:
            return line[:i]
    return line


def _expand(args, variables: dict) -> list[str]:
    """Arguments with ${VAR} replaced (innermost first); an unquoted one that is a list (';')
    becomes its elements, as CMake splices them."""
    values = []
    for text, quoted in args:
        while (changed := _VARIABLE.sub(lambda m: variables.get(m.group(1), ""), text)) != text:
            text = changed
        values += [text] if quoted else [v for v in text.split(";") if v]
    return values


def _block_end(commands, at: int, opening: str, closing: str) -> int:
    depth = 0
    for i in range(at, len(commands)):
        depth += {opening: 1, closing: -1}.get(commands[i][0], 0)
        if depth == 0:
            return i
    return len(commands)


def evaluate(commands, variables: dict) -> list[tuple[str, list[str]]]:
    """The commands the file runs at its top level, arguments expanded: set() and list(APPEND)
    assign, foreach() loops, function() and macro() bodies are skipped (see the module's
    docstring for what else is not followed)."""
    found, i = [], 0
    while i < len(commands):
        name, args = commands[i]
        if name in ("function", "macro"):
            i = _block_end(commands, i, name, f"end{name}")
        elif name == "foreach":
            end = _block_end(commands, i, "foreach", "endforeach")
            var, *rest = _expand(args, variables)
            if rest[:2] == ["IN", "LISTS"]:
                items = [v for lst in rest[2:] for v in variables.get(lst, "").split(";") if v]
            elif rest[:2] == ["IN", "ITEMS"]:
                items = rest[2:]
            else:
                items = rest
            for item in items:
                variables[var] = item
                found += evaluate(commands[i + 1:end], variables)
            i = end
        elif name == "set" and args:
            values = [v for v in _expand(args[1:], variables) if v != "PARENT_SCOPE"]
            variables[_expand(args[:1], variables)[0]] = ";".join(values)
        elif name == "list" and len(args) > 1 and args[0][0] == "APPEND":
            var = _expand(args[1:2], variables)[0]
            old = [v for v in variables.get(var, "").split(";") if v]
            variables[var] = ";".join(old + _expand(args[2:], variables))
        else:
            found.append((name, _expand(args, variables)))
        i += 1
    return found


def keywords(args: list[str], options=(), single=(), multi=()) -> dict:
    """cmake_parse_arguments: {"": the leading positional arguments, OPTION: True,
    KEYWORD: [values]}."""
    result, current = {"": []}, ""
    for arg in args:
        if arg in options:
            result[arg] = True
        elif arg in single or arg in multi:
            current = arg
            result.setdefault(arg, [])
        else:
            result.setdefault(current, []).append(arg)
    return result


def signatures(commands) -> dict[str, dict]:
    """{function: its keywords, as keywords() takes them}, for each function the file defines
    whose body gives cmake_parse_arguments its options, oneValueArgs and multiValueArgs: what
    the file's own calls of it mean, as this version of the file has it."""
    kinds = {"options": "options", "oneValueArgs": "single", "multiValueArgs": "multi"}
    found = {}
    for i, (name, args) in enumerate(commands):
        if name != "function" or not args:
            continue
        keys = {}
        for inner, inner_args in commands[i + 1:_block_end(commands, i, "function", "endfunction")]:
            if inner == "set" and inner_args and inner_args[0][0] in kinds:
                keys[kinds[inner_args[0][0]]] = [a for a, _ in inner_args[1:] if a]
        if keys:
            found[args[0][0]] = keys
    return found


# --- what each test is made of -------------------------------------------------------------

@dataclass
class Library:
    """One Halide library a test links: its files' base name (CMake's target), its generator's
    C++ sources (relative to test/generator), generator and function names, targets, target
    features and generator params."""

    name: str
    sources: list[str]
    generator: str
    function: str
    targets: list[str]
    features: list[str] = field(default_factory=list)
    params: list[str] = field(default_factory=list)

    def target(self, no_runtime: bool) -> str:
        """The generator's target= value."""
        features = self.features + (["no_runtime"] if no_runtime else [])
        return ",".join("-".join([t, *features]) for t in self.targets)


@dataclass
class AotTest:
    """One AOT test: its own C++ sources (relative to test/generator; externs it links
    included), libraries, include folders (relative to the tree) and environment; or why it
    is not built."""

    name: str
    sources: list[str] = field(default_factory=list)
    libraries: list[Library] = field(default_factory=list)
    includes: list[str] = field(default_factory=list)
    environment: dict = field(default_factory=dict)
    not_built: str = ""


def _condition(words: list[str]) -> str:
    """Why a CMake ENABLE_IF keeps the kit from building, or '' where it holds for a host
    build (NOT ${_USING_WASM}, which is NOT 0 once expanded)."""
    condition = " ".join(words)
    if condition in ("", "NOT 0"):
        return ""
    if "WITH_AUTOSCHEDULERS" in words:
        return ("needs Halide's autoscheduler plugins (ENABLE_IF WITH_AUTOSCHEDULERS): the kit "
                "builds without plugins")
    return f"built where CMake's condition {condition!r} holds, which the kit does not evaluate"


def plan(tree: Path) -> list[AotTest]:
    """Every AOT test of the Halide tree ``tree`` (test/generator/CMakeLists.txt and the
    *_aottest.cpp beside it), sorted by name: what to build, or why not."""
    folder = tree / "test" / "generator"
    variables = {"Halide_SOURCE_DIR": str(tree), "CMAKE_CURRENT_SOURCE_DIR": str(folder)}
    commands = cmake_commands((tree / CMAKE_FILE).read_text())
    known = signatures(commands)
    missing = {"_add_halide_libraries", "_add_halide_aot_tests"} - set(known)
    if missing:
        raise RuntimeError(f"{CMAKE_FILE} defines no {', '.join(sorted(missing))} (with "
                           "cmake_parse_arguments' keywords): its AOT tests cannot be read")
    generators, libraries, tests, archives, environments = {}, {}, {}, {}, {}
    for name, args in evaluate(commands, variables):
        if name == "add_halide_generator":
            generators[args[0]] = keywords(args, multi=("SOURCES", "LINK_LIBRARIES"))
        elif name == "_add_halide_libraries":
            libraries[args[0]] = keywords(args, **known["_add_halide_libraries"])
            if "FROM" not in libraries[args[0]]:  # (its own generator, NAME_generator.cpp)
                generators[f"{args[0]}.generator"] = {"SOURCES": [f"{args[0]}_generator.cpp"]}
        elif name == "add_halide_library":
            libraries.setdefault(args[0], {"own rules": True})
        elif name == "_add_halide_aot_tests":
            tests[args[0]] = keywords(args, **known["_add_halide_aot_tests"])
        elif name == "add_library" and len(args) > 2:
            archives[args[0]] = [a for a in args[1:] if a not in ("STATIC", "SHARED", "OBJECT")]
        elif name == "set_tests_properties" and "ENVIRONMENT" in args:
            environments[args[0]] = args[args.index("ENVIRONMENT") + 1:]
    planned = [_plan_test(name, spec, generators, libraries, archives,
                          environments.get(f"generator_aot_{name}", []), tree)
               for name, spec in tests.items()]
    covered = {source for name, spec in tests.items()
               for source in spec.get("SRCS") or [f"{name}_aottest.cpp"]}
    for path in sorted(folder.glob("*_aottest.cpp")):
        if path.name not in covered:
            planned.append(AotTest(path.name.removesuffix("_aottest.cpp"), not_built=(
                "no _add_halide_aot_tests in test/generator/CMakeLists.txt builds it (rules of its "
                "own, or none)")))
    return sorted(planned, key=lambda t: t.name)


def _plan_test(name, spec, generators, libraries, archives, environment, tree) -> AotTest:
    test = AotTest(name, sources=list(spec.get("SRCS") or [f"{name}_aottest.cpp"]),
                   includes=[str(Path(i).relative_to(tree)) if Path(i).is_absolute() else i
                             for i in spec.get("INCLUDES", [])],
                   environment=dict(e.split("=", 1) for e in environment if "=" in e))
    test.not_built = _condition(spec.get("ENABLE_IF", []))
    wanted = list(spec.get("HALIDE_LIBRARIES") or [name])
    extra_sources = list(spec.get("DEPS", []))
    i = 0
    while not test.not_built and i < len(wanted):
        library, i = wanted[i], i + 1
        lib = libraries.get(library)
        if lib is None:
            test.not_built = f"its library {library} is not made by _add_halide_libraries"
        elif lib.get("own rules"):
            test.not_built = f"its library {library} is made by add_halide_library rules of its own"
        elif reason := _condition(lib.get("ENABLE_IF", [])):
            test.not_built = reason
        elif lib.get("GRADIENT_DESCENT") or lib.get("AUTOSCHEDULER") or lib.get("PLUGINS"):
            test.not_built = f"its library {library} is built with an autoscheduler or plugins"
        else:
            generator = (lib.get("FROM") or [f"{library}.generator"])[0]
            sources = generators.get(generator, {}).get("SOURCES")
            linked = generators.get(generator, {}).get("LINK_LIBRARIES")
            targets = [t.replace("cmake", "host", 1) for t in lib.get("TARGETS") or ["cmake"]]
            if sources is None:
                test.not_built = f"its library {library}'s generator {generator} is not defined"
            elif linked:
                test.not_built = f"its library {library}'s generator links {', '.join(linked)}"
            elif any(not t.startswith("host") for t in targets):
                test.not_built = f"its library {library} is built for {', '.join(targets)}, not the host"
            else:
                test.libraries.append(Library(
                    library, sources, (lib.get("GENERATOR_NAME") or [library])[0],
                    (lib.get("FUNCTION_NAME") or [library])[0], targets,
                    list(lib.get("FEATURES", [])), list(lib.get("PARAMS", []))))
            for extern in lib.get("EXTERNS", []):
                if extern in libraries:
                    wanted += [extern] if extern not in wanted else []
                else:
                    extra_sources.append(extern)
    for dependency in dict.fromkeys(extra_sources):
        if dependency in archives:
            test.sources += [s for s in archives[dependency] if s not in test.sources]
        elif not test.not_built:
            test.not_built = f"it links {dependency}, which is not a library of this file's"
    if test.not_built:
        test.libraries = []
    return test


# --- building and running ------------------------------------------------------------------

SIDES = ("stock", "shim")


def generator_for(library: Library, tree: Path, work: Path, version: str) -> Path:
    """The generator executable of ``library``'s sources, compiled once per sources and halide
    version (kept in ``work``/generators)."""
    folder = tree / "test" / "generator"
    digest = hashlib.sha256(version.encode())
    for source in library.sources:
        digest.update(source.encode() + (folder / source).read_bytes())
    out = work / "generators" / digest.hexdigest()[:16]
    executable = out / "generator"
    with _compiling_lock:  # (tests built at once may share a generator: compiled once)
        lock = _compiling.setdefault(out, threading.Lock())
    with lock:
        if not executable.exists():
            out.mkdir(parents=True, exist_ok=True)
            compile_generator([folder / s for s in library.sources], out / "generator.tmp", out,
                              timeout=BUILD_SECONDS)
            os.replace(out / "generator.tmp", executable)
    return executable


# A generator's folder -> the lock its compilation holds.
_compiling: dict[Path, threading.Lock] = {}
_compiling_lock = threading.Lock()


def build(test: AotTest, tree: Path, work: Path, version: str) -> dict:
    """{side: the stock executable or the shim's shared library} of ``test``."""
    package = halide_package()
    built = {}
    for side in SIDES:
        out = work / test.name / side
        out.mkdir(parents=True, exist_ok=True)
        archives = []
        for i, library in enumerate(test.libraries):
            generator = generator_for(library, tree, work, version)
            bundled = side == "stock" and i == 0
            run([generator, "-g", library.generator, "-f", library.function, "-n", library.name,
                 "-e", "static_library,c_header,function_info_header", "-o", out,
                 f"target={library.target(no_runtime=not bundled)}", *library.params],
                out, BUILD_SECONDS)
            archives.append(out / f"{library.name}.a")
        sources = [tree / "test" / "generator" / s for s in test.sources]
        includes = [out, tree / "test" / "common", tree / "tools", package / "include",
                    *[tree / i for i in test.includes]]
        output = out / (test.name if side == "stock" else f"{test.name}.so")
        shared = [] if side == "stock" else ["-fPIC", "-shared"]
        run([os.environ.get("CXX", "c++"), "-std=c++17", "-O1", *shared, *sources,
             *[flag for folder in includes for flag in ("-I", folder)],
             "-Wl,--start-group", *archives, "-Wl,--end-group", "-lpthread", "-ldl", "-lm",
             "-o", output], out, BUILD_SECONDS)
        built[side] = output
    return built


def outcome(code: int | None, output: str) -> str:
    if code is None:
        return "timeout"
    if code == 0:
        return "skipped" if "[SKIP]" in output else "passed"
    if code < 0:
        try:
            return f"failed ({signal.Signals(-code).name})"
        except ValueError:
            return f"failed (signal {-code})"
    return f"failed (exit {code})"


def run_test(test: AotTest, built: dict, work: Path, logs: Path) -> dict:
    """Each side's outcome, with its last line of output where it did not pass."""
    results = {}
    for side in SIDES:
        tmp = work / test.name / side / "tmp"
        tmp.mkdir(exist_ok=True)
        env = {**os.environ, **test.environment, "TEST_TMPDIR": str(tmp)}
        command = ([str(built[side])] if side == "stock" else
                   [sys.executable, "-c", SHIM_MAIN, str(built[side]), test.name])
        with open(logs / f"{test.name}.{side}.log", "w") as log_file:
            code, output, seconds = stream(command, env, RUN_SECONDS, log_file, echo=False, cwd=tmp)
        results[side] = outcome(code, output)
        results[f"{side}_seconds"] = round(seconds, 1)
        if results[side] not in ("passed", "skipped"):
            results[f"{side}_says"] = last_line(output)
    return results


# --- the table ------------------------------------------------------------------------------

def verdict(result: dict) -> str:
    """One test's verdict: "not built", "build failed", "same" (each side passed, or each
    skipped), "shim fails" (it passed or skipped with the stock runtime, not with the shim),
    "stock fails" (Halide's runtime fails it: not the shim's to pass)."""
    if result.get("not_built"):
        return "not built"
    if result.get("build_error"):
        return "build failed"
    if "stock" not in result:
        return "not run"
    if result["stock"] not in ("passed", "skipped"):
        return "stock fails"
    return "same" if result["shim"] == result["stock"] else "shim fails"


VERDICTS = ("same", "shim fails", "stock fails", "build failed", "not built", "not run")


def table(results: list[dict]) -> list[str]:
    """The results as lines: a count of each verdict, then one line per test (and the reason
    or last line of output where there is one)."""
    counts = {v: 0 for v in VERDICTS}
    for result in results:
        counts[verdict(result)] += 1
    lines = [f"{len(results)} AOT tests: " + ", ".join(f"{n} {v}" for v, n in counts.items() if n),
             f"{'test':<36}{'stock':<20}{'shim':<20}verdict"]
    for result in results:
        v = verdict(result)
        if v in ("not built", "build failed", "not run"):
            lines.append(f"{result['name']:<36}{'-':<20}{'-':<20}{v}")
        else:
            lines.append(f"{result['name']:<36}{result['stock']:<20}{result['shim']:<20}{v}")
        for note in (result.get("not_built"), result.get("build_error"),
                     result.get("stock_says") and f"stock: {result['stock_says']}",
                     result.get("shim_says") and f"shim: {result['shim_says']}"):
            if note:
                lines.append(f"    {note}")
    return lines


def failed(results: list[dict]) -> bool:
    """Whether the step fails: a test the shim fails where Halide's runtime does not, or one
    the kit could not build (then nothing was checked of it)."""
    return any(verdict(r) in ("shim fails", "build failed") for r in results)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--halide-source", type=Path, required=True, help="Halide's source tree")
    parser.add_argument("--ref", help="the git ref to read a repository at (default: "
                                      "v<the installed halide's version>)")
    parser.add_argument("--work", type=Path, required=True, help="a private folder to build in")
    parser.add_argument("--json", type=Path, help="the results, rewritten after each test")
    parser.add_argument("--logs", type=Path, help="each side's output (default: WORK/logs)")
    parser.add_argument("--tests", help="comma-separated subset of the tests (default: all)")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                        help="builds at once (default: one per core)")
    args = parser.parse_args(argv)
    version = metadata.version("halide")
    source = HalideSource(args.halide_source, args.ref or f"v{version}")
    work = private_folder(args.work, "the AOT tests' builds")
    tree, logs = work / "source", private_folder(args.logs or work / "logs", "their logs")
    missing = source.extract(FOLDERS, tree)
    log(f"halide {version}; Halide's AOT tests from {source}"
        + (f" ({len(missing)} files absent there: {', '.join(missing[:5])})" if missing else ""))
    tests = plan(tree)
    if args.tests:
        chosen = set(args.tests.split(","))
        unknown = chosen - {t.name for t in tests}
        if unknown:
            parser.error(f"unknown tests: {', '.join(sorted(unknown))}")
        tests = [t for t in tests if t.name in chosen]
    results = {t.name: {"name": t.name, "not_built": t.not_built} for t in tests}

    def write():
        if args.json:
            args.json.write_text(json.dumps({"halide": version, "source": str(source),
                                             "plan": [asdict(t) for t in tests],
                                             "results": list(results.values()),
                                             "table": table(list(results.values()))},
                                            indent=1) + "\n")

    def build_one(test):
        started = time.monotonic()
        try:
            return build(test, tree, work, version), None, time.monotonic() - started
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            return None, str(e), time.monotonic() - started

    buildable = [t for t in tests if not t.not_built]
    log(f"{len(buildable)} of {len(tests)} tests to build ({args.jobs} at once), then run on "
        "each side")
    write()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        # Built in parallel, run one at a time in order, each as soon as it is built: the
        # tests time themselves and start threads of their own.
        for test, (built, error, seconds) in zip(buildable, pool.map(build_one, buildable)):
            result = results[test.name]
            result["build_seconds"] = round(seconds, 1)
            if error:
                result["build_error"] = last_line(error)
                (logs / f"{test.name}.build.log").write_text(error)
            else:
                result.update(run_test(test, built, work, logs))
            log(f"{test.name}: {verdict(result)} (stock {result.get('stock', '-')}, shim "
                f"{result.get('shim', '-')}; built in {seconds:.0f} s)")
            write()
    print("\n".join(table(list(results.values()))))
    return 1 if failed(list(results.values())) else 0


if __name__ == "__main__":
    sys.exit(main())
