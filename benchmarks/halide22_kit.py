"""The Halide 22 check kit: what to run the day ``pip install "halide>=22,<23"`` works, to turn
the shim's Halide 22 support from prepared (written from Halide's source at abbf7ff983 and
emulated by the tests: shim/base/releases.py, verified=False) into verified.

    python benchmarks/halide22_kit.py [--halide "halide>=22,<23"] [--pip-option OPT]...
        [--halide-source PATH [--ref REF]] [--out build/halide22-kit] [--steps STEP,...]
        [--pytest-args ARGS] [--apps NAME,...] [--aot-tests NAME,...] [--limit STEP=SECONDS]...

``--halide`` is the pip requirement (``halide==21.0.0`` runs the same checks with Halide 21,
which is how the kit is checked before Halide 22 exists); ``--pip-option`` goes to the pip
commands that look the release up and install it (``--pip-option=--find-links=DIR`` for a
wheel built from Halide's source, ``--pip-option=--pre`` for a release candidate).

pip looks the requirement up first (a dry run, which downloads nothing but the index's
metadata): where it finds no release, the kit stops there, saying "no Halide 22 released on
PyPI yet: nothing checked" (exit status 3), which is the expected outcome until Halide 22 is
released. The version found is the one installed and checked. Then, each with its own time
limit, printing as they go, every step running even after one failed:

- setup: a fresh virtual environment, the project installed into it with its test extra
  (``pip install -e ".[test]"``, as a developer installs it: the tree's shim/_native*.so is
  rebuilt in place, from the same sources), then the requested halide over the test extra's
  halide 21 (pip warns that the extra pins 21: expected). shim._native is built by that install
  in pip's isolated build environment, with pyproject.toml's build requirement halide==21.0.0, so the Halide runtime
  linked into it (thread pool, halide_malloc...) stays Halide 21's whatever the environment
  holds: replacing the environment's halide afterwards rebuilds nothing. The step checks both
  halves: the environment's halide is the requested release (the one the tests' own pipeline
  builds, the sample pipelines' generators and Halide's apps import), and the shim imports
  beside it, its native library the tree's, its runtime release the build requirement's.
- pipelines: the sample pipelines built with that halide (``python -m shim.pipelines.build``,
  host, both runtimes) into the run's own $HALIDE_SHIM_PIPELINES, and the release the shim
  tells for each library (what ``python -m shim info`` prints as "built by"): it must be the
  installed halide's major version, 22 for Halide 22's libraries. This is the first thing the
  day-one check verifies: which release built a library is inferred from evidence
  (shim/calls/library_release.py), never read from a field.
- tests: the whole test suite (``python -m pytest``) in that environment, with those
  pipelines, in caches of the run's own (as .ci/run does). Its pass/fail/skip counts, skip
  reasons and failures' names go in the summary: a test that asserts a fact of Halide 21 and
  fails under 22 is a finding, listed with the others.
- apps (with --halide-source): Halide's Python apps, built with the release's Python generator
  command line and run through shim.load and through Halide's stock runtime side by side,
  bit for bit (benchmarks/halide_python_apps.py).
- aot-tests (with --halide-source): Halide's AOT tests (test/generator), each built twice, with
  the stock runtime into an executable and no_runtime into a shared library run under the
  shim, a table of each side's outcome (benchmarks/halide_aottests.py).

--halide-source is a Halide checkout or a bare git mirror of it, read at --ref (default: the
tag v<version found>); a folder that is not a git repository is read as it is. The kit fetches
nothing itself but pip's packages. Without it, apps and aot-tests are not run, and the summary
says so.

Everything goes under --out (default build/halide22-kit), a folder no other user can write
(shim/base/private_files.py's rule: made 0700, refused otherwise): summary.txt (every step's
status and seconds, the counts, skip reasons, failures, the tables, the verdict), summary.json,
one log per step, and work/, the run's own folder (the virtual environment, the pipelines,
caches, Halide's files, the builds), which the next run deletes and makes anew: the kit
deletes only that folder, marked as its own, and refuses to use one it did not make. It is
left after the run, so that a failure can be looked into with the environment that had it
(work/venv/bin/python -m pytest ..., with the environment the summary's "env:" line gives).

The work of the apps and AOT-test steps, and the checks of the setup and pipelines steps, run
inside the virtual environment (this script's ``check-setup`` and ``check-releases``
commands, the two modules above): the halide they need is the environment's, never the one of
the interpreter running the kit, which needs only the standard library.

The verdict verifies the release only where every step ran whole (no --steps, --pytest-args,
--apps or --aot-tests choosing a part) and passed.

Exit status: 0 every step chosen passed (apps and aot-tests not run for want of a source do not
fail the run, and the verdict says so); 1 a step failed or ran out of time; 2 the kit could not
run (its arguments, its folder, pip unreachable); 3 no such release: nothing checked.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from halide_source import HalideSource  # noqa: E402
from kit_steps import junit_counts, log, private_folder, stream  # noqa: E402

DEFAULT_REQUIREMENT = "halide>=22,<23"
DEFAULT_OUT = ROOT / "build" / "halide22-kit"
STEPS = ("setup", "pipelines", "tests", "apps", "aot-tests")
# Each step's time limit, seconds: what a 2-core machine needs, with room (the setup downloads
# the test extra, some 1 GB; the suite takes 9 minutes there, idle, with its builds).
LIMITS = {"setup": 1800, "pipelines": 1200, "tests": 5400, "apps": 1200, "aot-tests": 5400}
# The status of a run that found no release: nothing was checked, which must not look like a
# pass or a failure of the shim.
NO_RELEASE = 3
WORK_MARK = ".halide22-kit"
# What pip says where it could not reach its index, rather than found no release there.
_UNREACHABLE = re.compile(r"Retrying|NewConnectionError|Max retries exceeded|ConnectionError|"
                          r"Could not fetch URL|name resolution|Network is unreachable", re.I)


class NoRelease(Exception):
    """pip found no release that satisfies the requirement."""


def find_release(requirement: str, pip_options=()) -> str:
    """The version pip would install for ``requirement`` (a dry run: nothing installed);
    NoRelease where its index has none, RuntimeError where pip failed otherwise."""
    with tempfile.TemporaryDirectory(prefix="halide22-kit-") as private:
        report = Path(private) / "report.json"
        # (Not --quiet: it hides the warnings that tell an index not reached from one without
        # the release.)
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run",
                               "--ignore-installed", "--no-deps", "--report", str(report),
                               *pip_options, requirement],
                              capture_output=True, text=True, timeout=600)
        if done.returncode == 0:
            return json.loads(report.read_text())["install"][0]["metadata"]["version"]
    output = done.stdout + done.stderr
    if "No matching distribution found" in output and not _UNREACHABLE.search(output):
        raise NoRelease(output)
    raise RuntimeError(f"pip could not look {requirement} up ({done.returncode}):\n{output}")


def release_words(requirement: str) -> str:
    """``halide>=22,<23`` as "Halide 22"; any other requirement as it is."""
    bounds = re.fullmatch(r"\s*halide\s*>=\s*(\d+)(?:\.0)*\s*,\s*<\s*(\d+)(?:\.0)*\s*", requirement)
    if bounds and int(bounds[2]) == int(bounds[1]) + 1:
        return f"Halide {bounds[1]}"
    return requirement


def no_release_line(requirement: str, pip_options=()) -> str:
    where = (f"on the index pip was given ({' '.join(pip_options)})" if pip_options
             else "on PyPI")
    return f"no {release_words(requirement)} released {where} yet: nothing checked"


# --- inside the virtual environment --------------------------------------------------------

def check_setup(expected: str) -> int:
    """In the kit's environment: its halide is ``expected``, and the shim imports beside it,
    with the tree's native library, whose runtime release is the build requirement's."""
    import tomllib
    from importlib import metadata

    import halide
    import shim
    from shim.base.releases import RUNTIME
    from shim.pipelines.build import installed_halide_version

    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    pins = [r for r in requires if re.match(r"halide\b", r)]
    native = Path(shim.native._native.__file__).resolve()
    facts = {"halide": metadata.version("halide"), "halide_path": halide.__file__,
             "pipeline builds use halide": installed_halide_version(),
             "shim native library": str(native), "its runtime release": RUNTIME.name,
             "build requirement": pins}
    print(json.dumps(facts, indent=1))
    problems = []
    if facts["halide"] != expected or facts["pipeline builds use halide"] != expected:
        problems.append(f"the environment's halide is {facts['halide']}, not {expected}")
    if not Path(halide.__file__).resolve().is_relative_to(Path(sys.prefix).resolve()):
        problems.append(f"halide is imported from {halide.__file__}, outside the environment")
    if not native.is_relative_to(ROOT):
        problems.append(f"the shim's native library is {native}, not this tree's")
    if pins != [f"halide=={RUNTIME.name}.0.0"]:
        problems.append(f"pyproject.toml's build requirement is {pins}: the native library "
                        f"must be built against Halide {RUNTIME.name} (shim.base.releases.RUNTIME)")
    for problem in problems:
        print(f"SETUP PROBLEM: {problem}")
    print(f"KIT_SETUP={json.dumps(facts)}")
    return 1 if problems else 0


def check_releases(directory: Path, report: Path) -> int:
    """In the kit's environment: the release the shim tells for each sample pipeline built in
    ``directory`` by the environment's halide is that halide's major version."""
    from importlib import metadata

    import shim
    from shim.cli.main import main as shim_cli
    from shim.pipelines.build import RUNTIMES, Build, generator_names

    version = metadata.version("halide")
    expected = version.split(".")[0]
    libraries = []
    for name in generator_names():
        for runtime in RUNTIMES:
            path = Build(name, "host", runtime).path(directory)
            pipeline = shim.load(path)
            libraries.append({"file": path.name, "name": name, "runtime": runtime,
                              "release": pipeline.release,
                              "built by": pipeline.release_description()})
            print(f"{name} ({runtime}): built by {pipeline.release_description()}"
                  + ("" if pipeline.release == expected else f"  <-- NOT {expected}"))
    print(f"\n$ python -m shim info {libraries[0]['file']}", flush=True)
    shim_cli(["info", str(directory / libraries[0]["file"])])
    wrong = [lib for lib in libraries if lib["release"] != expected]
    report.write_text(json.dumps({"halide": version, "expected": expected,
                                  "libraries": libraries}, indent=1) + "\n")
    print(f"{len(libraries)} libraries built by halide {version}: "
          f"{len(libraries) - len(wrong)} told as Halide {expected}, {len(wrong)} not")
    return 1 if wrong else 0


# --- the steps -----------------------------------------------------------------------------

@dataclass
class Step:
    name: str
    what: str
    commands: list  # argv lists, run in turn until one fails
    limit: float
    result: dict = field(default_factory=dict)
    needs_source: bool = False


@dataclass
class Run:
    """One run's settings and folders."""

    requirement: str
    version: str
    out: Path
    source: Path | None = None
    ref: str | None = None
    pip_options: tuple = ()
    pytest_args: tuple = ()
    apps: str | None = None
    aot_tests: str | None = None
    jobs: int = os.cpu_count() or 1
    limits: dict = field(default_factory=lambda: dict(LIMITS))

    @property
    def work(self) -> Path:
        return self.out / "work"

    @property
    def python(self) -> str:
        return str(self.work / "venv" / "bin" / "python")

    def environment(self) -> dict:
        """The steps' environment: the virtual environment's, with the run's own pipelines and
        caches; nothing of the caller's Python path."""
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
        venv = self.work / "venv"
        caches = self.work / "caches"
        env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv),
                   PYTHONUNBUFFERED="1", HALIDE_SHIM_PIPELINES=str(self.work / "pipelines"),
                   XDG_CACHE_HOME=str(caches / "xdg"), HALIDE_SHIM_CACHE=str(caches / "programs"),
                   POCL_CACHE_DIR=str(caches / "pocl"))
        env.setdefault("HALIDE_SHIM_LONG_TESTS", "0")  # (a newcomer's run: .ci/run's short one)
        return env


def make_steps(run: Run) -> list[Step]:
    py, kit, work = run.python, str(Path(__file__).resolve()), run.work
    source = ([f"--halide-source={run.source}", *([f"--ref={run.ref}"] if run.ref else [])]
              if run.source else [])
    return [
        Step("setup", f"a fresh virtual environment, the project with its test extra, then "
             f"halide=={run.version} over its halide 21",
             [[sys.executable, "-m", "venv", str(work / "venv")],
              [py, "-m", "pip", "install", "--progress-bar", "off", "-e", ".[test]"],
              [py, "-m", "pip", "install", "--progress-bar", "off", *run.pip_options,
               f"halide=={run.version}"],
              [py, kit, "check-setup", "--expect", run.version]], run.limits["setup"]),
        Step("pipelines", "the sample pipelines built with that halide; the release the shim "
             "tells for each",
             [[py, "-m", "shim.pipelines.build", "-j", str(run.jobs)],
              [py, kit, "check-releases", "--pipelines", str(work / "pipelines"),
               "--json", str(work / "pipelines.json")]], run.limits["pipelines"]),
        Step("tests", "the whole test suite in that environment",
             [[py, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider",
               f"--junitxml={work / 'tests.xml'}", *run.pytest_args]], run.limits["tests"]),
        Step("apps", "Halide's Python apps, built by that halide, through shim.load and the "
             "stock runtime, bit for bit",
             [[py, str(HERE / "halide_python_apps.py"), *source, "--work", str(work / "apps"),
               "--json", str(work / "apps.json"), *(["--apps", run.apps] if run.apps else [])]],
             run.limits["apps"], needs_source=True),
        Step("aot-tests", "Halide's AOT tests, stock runtime (executable) and shim (no_runtime "
             "shared library) side by side",
             [[py, str(HERE / "halide_aottests.py"), *source, "--work", str(work / "aot"),
               "--json", str(work / "aot.json"), "-j", str(run.jobs),
               *(["--tests", run.aot_tests] if run.aot_tests else [])]],
             run.limits["aot-tests"], needs_source=True),
    ]


# What pytest's exit statuses other than 0 (all passed) and 1 (some failed) say: the suite's
# counts are then those of a part of it, or of nothing.
PYTEST_EXITS = {2: "pytest was interrupted: the counts are of the part that ran (see tests.log)",
                3: "pytest failed inside itself (see tests.log)",
                4: "pytest's arguments were refused (see tests.log)",
                5: "pytest collected no test (see tests.log)"}


def step_details(step: Step, run: Run, output: str, code: int | None) -> dict:
    """What a step found, beyond its status (``code``: its last command's exit status): the
    setup's facts, the libraries' releases, the suite's counts, the apps' and AOT tests'
    tables."""
    if step.name == "setup":
        found = re.search(r"^KIT_SETUP=(.*)$", output, re.M)
        return {"facts": json.loads(found.group(1))} if found else {}
    if step.name == "tests":
        counts = junit_counts(run.work / "tests.xml")
        if code in PYTEST_EXITS:
            counts["reason"] = PYTEST_EXITS[code]
        return counts
    report = run.work / {"pipelines": "pipelines.json", "apps": "apps.json",
                         "aot-tests": "aot.json"}[step.name]
    try:
        data = json.loads(report.read_text())
    except (OSError, ValueError):
        return {}
    if step.name == "pipelines":
        libraries = data["libraries"]
        told = sum(lib["release"] == data["expected"] for lib in libraries)
        return {"counts": f"{len(libraries)} libraries, {told} told as Halide {data['expected']}",
                "table": [f"{lib['file']}: built by {lib['built by']}" for lib in libraries]}
    return {"counts": data["table"][0] if data.get("table") else "", "table": data.get("table", [])}


def prepare_work(out: Path) -> None:
    """``out``'s work folder made anew: an earlier run's deleted, anything else there
    refused."""
    work = out / "work"
    if work.is_symlink() or (work.exists() and not (work / WORK_MARK).is_file()):
        raise RuntimeError(f"{work} exists and is not the kit's (no {WORK_MARK} in it): not "
                           "deleting it; move it away or choose another --out")
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(mode=0o700)
    (work / WORK_MARK).write_text("made by benchmarks/halide22_kit.py: deleted by its next run\n")


def run_steps(run: Run, chosen) -> int:
    """Run the steps named in ``chosen`` (setup always first); write the summary; the exit
    status."""
    started = time.monotonic()
    private_folder(run.out, "the kit's output")
    prepare_work(run.out)
    env = run.environment()
    steps = [s for s in make_steps(run) if s.name == "setup" or s.name in chosen]
    setup_failed = False
    for step in steps:
        header = f"\n== {step.name}: {step.what}\n"
        sys.stdout.write(header)
        with open(run.out / f"{step.name}.log", "w") as log_file:
            log_file.write(header)
            if step.needs_source and run.source is None:
                step.result = {"status": "not run", "seconds": 0.0,
                               "reason": "no --halide-source: Halide's apps and tests come from it"}
            elif setup_failed:
                step.result = {"status": "not run", "seconds": 0.0,
                               "reason": "the setup failed: no environment to run in"}
            else:
                status, seconds, output, code = "passed", 0.0, "", 0
                for command in step.commands:
                    code, text, took = stream(command, env, step.limit - seconds, log_file)
                    seconds += took
                    output += text
                    if code != 0:
                        status = "timeout" if code is None else "failed"
                        break
                step.result = {"status": status, "seconds": round(seconds, 1),
                               **step_details(step, run, output, code)}
                setup_failed = step.name == "setup" and status != "passed"
            if step.result.get("reason"):
                log(f"{step.result['status']}: {step.result['reason']}")
    failed = [s.name for s in steps if s.result["status"] in ("failed", "timeout")]
    summary = summarize(run, steps, failed, time.monotonic() - started)
    (run.out / "summary.txt").write_text(summary)
    (run.out / "summary.json").write_text(json.dumps(
        {"requirement": run.requirement, "version": run.version, "failed_steps": failed,
         "steps": {s.name: s.result for s in steps}}, indent=1) + "\n")
    log("\n" + summary)
    return 1 if failed else 0


def verdict(run: Run, steps: list[Step], failed: list[str]) -> str:
    not_run = [s.name for s in steps if s.result["status"] == "not run"]
    unchosen = [name for name in STEPS if name not in {s.name for s in steps}]
    if failed:
        return f"halide {run.version} NOT verified: {', '.join(failed)} failed"
    if not_run or unchosen:
        return (f"halide {run.version} not verified: every step run passed, but "
                f"{', '.join(not_run + unchosen)} did not run")
    subsets = [option for option, value in (("--pytest-args", run.pytest_args),
                                            ("--apps", run.apps), ("--aot-tests", run.aot_tests))
               if value]
    if subsets:
        return (f"halide {run.version} not verified: every step passed, on the part of it "
                f"{', '.join(subsets)} chose")
    return (f"halide {run.version} verified: every step passed (for Halide 22: set verified=True "
            "in shim/base/releases.py and say so in the docs)")


def summarize(run: Run, steps: list[Step], failed: list[str], seconds: float) -> str:
    lines = [f"Halide kit run: {'FAILED: ' + ', '.join(failed) if failed else 'ok'} in {seconds:.0f} s",
             f"requirement: {run.requirement} -> halide {run.version}"
             + (f" {' '.join(run.pip_options)}" if run.pip_options else ""),
             f"Halide source: {run.source or 'none'}{f' at {run.ref}' if run.ref else ''}",
             f"verdict: {verdict(run, steps, failed)}"]
    facts = next((s.result.get("facts") for s in steps if s.name == "setup"), None)
    if facts:
        lines.append(f"setup: halide {facts['halide']} in the environment (pipeline builds use "
                     f"{facts['pipeline builds use halide']}); the shim's native library "
                     f"{facts['shim native library']}, its runtime Halide "
                     f"{facts['its runtime release']}'s (build requirement "
                     f"{', '.join(facts['build requirement'])})")
    lines.append(f"env: HALIDE_SHIM_PIPELINES={run.work / 'pipelines'} "
                 f"XDG_CACHE_HOME={run.work / 'caches' / 'xdg'} (python: {run.python})")
    lines += ["", f"{'step':<11}{'status':<9}{'seconds':>8}  counts"]
    for step in steps:
        r = step.result
        counts = (f"{r['passed']} passed, {r['failed']} failed, {r['errors']} errors, "
                  f"{r['skipped']} skipped" if "passed" in r else r.get("counts", ""))
        lines.append(f"{step.name:<11}{r['status']:<9}{r['seconds']:>8.1f}  {counts}")
        if r.get("reason"):
            lines.append(f"{'':<30}{r['reason']}")
    for step in steps:
        for reason, n in step.result.get("skip_reasons", {}).items():
            lines.append(f"  {step.name}: {n} skipped: {reason}")
        for test in step.result.get("failures", []):
            lines.append(f"  {step.name}: FAILED {test}")
    for step in steps:
        if step.result.get("table"):
            lines += ["", f"{step.name}: {step.what}", *step.result["table"]]
    return "\n".join(lines) + "\n"


# --- the command line ------------------------------------------------------------------------

def limit(text: str) -> tuple[str, float]:
    step, _, seconds = text.partition("=")
    if step not in STEPS or not seconds:
        raise argparse.ArgumentTypeError(f"expected STEP=SECONDS, STEP one of {', '.join(STEPS)}")
    return step, float(seconds)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="benchmarks/halide22_kit.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--halide", default=DEFAULT_REQUIREMENT,
                   help=f"the pip requirement to check (default {DEFAULT_REQUIREMENT!r})")
    p.add_argument("--pip-option", action="append", default=[], metavar="OPT",
                   help="an option for the pip commands that find and install halide, written "
                        "--pip-option=OPT (OPT starts with -); repeatable")
    p.add_argument("--halide-source", type=Path, help="Halide's source: a checkout or a git mirror")
    p.add_argument("--ref", help="the ref to read a git --halide-source at (default v<version>)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help="logs, summary and the run's work folder (default build/halide22-kit)")
    p.add_argument("--steps", default=",".join(STEPS[1:]),
                   help="comma-separated subset of " + ", ".join(STEPS[1:]) + " (setup always runs)")
    p.add_argument("--pytest-args", default="", help="arguments for the tests step's pytest "
                                                     "(default: none, the whole suite)")
    p.add_argument("--apps", help="comma-separated subset of Halide's Python apps")
    p.add_argument("--aot-tests", help="comma-separated subset of Halide's AOT tests")
    p.add_argument("--limit", type=limit, action="append", default=[], metavar="STEP=SECONDS",
                   help="a step's time limit; repeatable (defaults: "
                        + ", ".join(f"{k} {v:.0f}" for k, v in LIMITS.items()) + ")")
    p.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                   help="builds at once (default: one per core)")
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["check-setup"]:
        return check_setup(argv[argv.index("--expect") + 1])
    if argv[:1] == ["check-releases"]:
        return check_releases(Path(argv[argv.index("--pipelines") + 1]),
                              Path(argv[argv.index("--json") + 1]))
    args = parser().parse_args(argv)
    chosen = [s for s in args.steps.split(",") if s]
    unknown = sorted(set(chosen) - set(STEPS))
    if unknown:
        parser().error(f"unknown steps: {', '.join(unknown)}; known: {', '.join(STEPS[1:])}")
    log(f"== looking {args.halide} up with pip")
    try:
        version = find_release(args.halide, args.pip_option)
    except NoRelease:
        line = no_release_line(args.halide, args.pip_option)
        log(line)
        try:
            private_folder(args.out, "the kit's output")
        except (RuntimeError, OSError) as e:
            print(f"halide22_kit: {e}", file=sys.stderr)
            return 2
        (args.out / "summary.txt").write_text(f"Halide kit run: {line}\n"
                                              f"requirement: {args.halide}\n")
        return NO_RELEASE
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"halide22_kit: {e}", file=sys.stderr)
        return 2
    log(f"pip finds halide {version}")
    run = Run(args.halide, version, args.out.resolve(), args.halide_source, None,
              tuple(args.pip_option), tuple(shlex.split(args.pytest_args)), args.apps,
              args.aot_tests, args.jobs, {**LIMITS, **dict(args.limit)})
    try:
        if run.source is not None:  # (checked now: a ref it lacks is known before the setup)
            run.source = run.source.resolve()
            run.ref = HalideSource(run.source, args.ref or f"v{version}").ref
        return run_steps(run, chosen)
    except (RuntimeError, OSError) as e:
        print(f"halide22_kit: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
