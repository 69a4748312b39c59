"""Run the fuzz targets: each for its share of a time budget, one after the other.

    python fuzz/run.py [--total-seconds 300] [--targets a,b,...] [--json FIGURES.json]
                       [--artifacts DIR] [--keep-corpus DIR]

The C targets (fuzz/c/*.c) are built with clang's libFuzzer under AddressSanitizer and
UndefinedBehaviorSanitizer (LeakSanitizer with them) into build/fuzz/; the Python ones
(fuzz/python/*.py) run under atheris. Every target first runs its whole corpus
(fuzz/corpus/TARGET: the seeds and every input that once found a defect, the regression-*
files), then fuzzes from it into a fresh folder, so a run never changes the repository. A
target fails on a crash, a hang (-timeout), a sanitizer report, a leak, memory beyond
-rss_limit_mb, or a property its harness checks; the input that did it is kept in --artifacts
(default build/fuzz/artifacts/TARGET/). The exit status is 1 if any target failed.

The figures of each target (executions, coverage and features as libFuzzer counts them,
corpus size, the outcome) are printed as a table, and written to --json if given.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BUILD = ROOT / "build" / "fuzz"

# C targets: the harness and the library's sources it links, nothing more.
C_TARGETS = {
    "vulkan_module": ["native_stubs/backends/vulkan_module.c"],
    "vulkan_spirv": ["native_stubs/backends/vulkan_spirv.c"],
    "opencl_prototypes": ["native_stubs/backends/opencl_prototypes.c"],
}
PYTHON_TARGETS = ["elf_reader", "metadata", "pipeline_pickle", "dlpack", "array_likes", "cli"]
# libFuzzer flags of a target's own: the command line's pipelines print from C (halide_print),
# which would fill the log.
FLAGS = {"cli": ["-close_fd_mask=1"]}
TARGETS = [*C_TARGETS, *PYTHON_TARGETS]
SANITIZE = ["-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=all", "-g", "-O1"]
# Compilers to try, in order, for one whose libFuzzer links ($FUZZ_CC first): Debian's clang-15
# carries it in libclang-common-15-dev, clang-14 in libclang-rt-14-dev.
COMPILERS = ["clang", "clang-15", "clang-14", "clang-16", "clang-17", "clang-18", "clang-19"]
# Per input, the longest a target may take before it counts as a hang (a Python target's first
# inputs include its imports and building a sample pipeline).
TIMEOUT = {"c": 10, "python": 60}
STARTUP = {"c": 1, "python": 15}  # seconds a target takes before it fuzzes, roughly


def find_compiler() -> str:
    """A clang whose -fsanitize=fuzzer links."""
    candidates = [os.environ["FUZZ_CC"]] if os.environ.get("FUZZ_CC") else COMPILERS
    with tempfile.TemporaryDirectory() as work:
        probe = Path(work, "probe.c")
        probe.write_text("#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput("
                         "const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n")
        for compiler in candidates:
            if shutil.which(compiler) is None:
                continue
            made = subprocess.run([compiler, *SANITIZE, str(probe), "-o", str(Path(work, "p"))],
                                  capture_output=True)
            if made.returncode == 0:
                return compiler
    sys.exit("fuzz/run.py: no clang with libFuzzer found (tried "
             f"{', '.join(candidates)}; Debian: apt-get install clang-15, or clang-14 and "
             "libclang-rt-14-dev), or set $FUZZ_CC")


def build_c_targets(names: list[str]) -> dict[str, Path]:
    if not names:
        return {}
    import halide  # (its headers: shim_native.h includes HalideRuntime.h)

    compiler = find_compiler()
    BUILD.mkdir(parents=True, exist_ok=True)
    includes = [ROOT / "native_stubs", ROOT / "abi", Path(halide.install_dir(), "include")]
    built = {}
    for name in names:
        out = BUILD / name
        command = [compiler, *SANITIZE, *(f"-I{folder}" for folder in includes),
                   str(HERE / "c" / f"{name}.c"), *(str(ROOT / s) for s in C_TARGETS[name]),
                   "-o", str(out)]
        subprocess.run(command, check=True)
        built[name] = out
    return built


_DONE = re.compile(r"#(\d+)\s+DONE\s+cov: (\d+) ft: (\d+) corp: (\d+)/")
_STAT = re.compile(r"stat::(\w+):\s+(\d+)")
_STATUS = re.compile(r"#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/")


def figures(output: str) -> dict:
    """What libFuzzer's output says of a run: executions, coverage, features, corpus."""
    found = {}
    for line in output.splitlines():
        if match := _STATUS.search(line):
            found.update(executions=int(match[1]), coverage=int(match[2]),
                         features=int(match[3]), corpus=int(match[4]))
    stats = dict((k, int(v)) for k, v in _STAT.findall(output))
    if "number_of_executed_units" in stats:
        found["executions"] = stats["number_of_executed_units"]
    if "peak_rss_mb" in stats:
        found["peak_rss_mb"] = stats["peak_rss_mb"]
    return found


def run_target(name: str, seconds: int, binary: Path | None, artifacts: Path,
               keep: Path | None, log) -> dict:
    kind = "c" if binary is not None else "python"
    artifacts.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"halide-shim-fuzz-{name}-") as work:
        corpus = Path(work, "corpus")
        corpus.mkdir()
        command = [str(binary)] if binary else [sys.executable, str(HERE / "python" / f"{name}.py")]
        command += [f"-max_total_time={seconds}", f"-timeout={TIMEOUT[kind]}",
                    "-rss_limit_mb=2048", "-print_final_stats=1",
                    f"-artifact_prefix={artifacts}/", *FLAGS.get(name, []), str(corpus),
                    str(HERE / "corpus" / name)]
        started = time.monotonic()
        done = subprocess.run(command, cwd=work, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, errors="replace")
        took = time.monotonic() - started
        log.write(f"===== {name}: {' '.join(command)}\n{done.stdout}\n")
        if keep is not None:
            shutil.copytree(corpus, keep / name, dirs_exist_ok=True)
    result = {"target": name, "kind": kind, "seconds": round(took, 1), **figures(done.stdout)}
    written = re.findall(r"Test unit written to (\S+)", done.stdout)
    result["outcome"] = "passed" if done.returncode == 0 else (
        f"FAILED (exit {done.returncode}; input: {written[-1] if written else 'none'})")
    if done.returncode != 0:
        tail = done.stdout[-6000:]
        print(f"--- {name} failed; the end of its output:\n{tail}", file=sys.stderr)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--total-seconds", type=int, default=300,
                        help="the budget for all targets together, builds included")
    parser.add_argument("--targets", default=",".join(TARGETS),
                        help=f"comma-separated, of {', '.join(TARGETS)}")
    parser.add_argument("--json", type=Path, help="write the figures there")
    parser.add_argument("--artifacts", type=Path, default=BUILD / "artifacts")
    parser.add_argument("--keep-corpus", type=Path,
                        help="copy each target's new inputs there (TARGET/...)")
    parser.add_argument("--log", type=Path, default=BUILD / "fuzz.log",
                        help="every target's whole output")
    args = parser.parse_args(argv)
    names = [n for n in args.targets.split(",") if n]
    unknown = sorted(set(names) - set(TARGETS))
    if unknown:
        parser.error(f"unknown targets: {', '.join(unknown)}")
    deadline = time.monotonic() + args.total_seconds
    binaries = build_c_targets([n for n in names if n in C_TARGETS])
    args.log.parent.mkdir(parents=True, exist_ok=True)
    results = []
    with open(args.log, "w") as log:
        for i, name in enumerate(names):
            kind = "c" if name in binaries else "python"
            share = (deadline - time.monotonic()) / (len(names) - i)
            seconds = max(5, int(share - STARTUP[kind]))
            print(f"{name}: {seconds} s", flush=True)
            results.append(run_target(name, seconds, binaries.get(name),
                                      args.artifacts / name, args.keep_corpus, log))
    print(f"\n{'target':<18}{'executions':>12}{'coverage':>10}{'features':>10}"
          f"{'corpus':>8}{'seconds':>9}  outcome")
    for r in results:
        print(f"{r['target']:<18}{r.get('executions', 0):>12}{r.get('coverage', 0):>10}"
              f"{r.get('features', 0):>10}{r.get('corpus', 0):>8}{r['seconds']:>9}  "
              f"{r['outcome']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0 if all(r["outcome"] == "passed" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
