"""The Halide 22 check kit's plumbing (benchmarks/halide22_kit.py and the modules its steps
run), quickly and offline: its arguments, the run that finds no release (pip kept off the
network), an index pip cannot reach, the steps' order and failures, its folders, the summary,
the checks it runs inside its environment, Halide's source read from a git repository, and the
AOT tests' plan and table on a fake Halide tree. The real kit takes many minutes and needs the
network (docs/development.md, "Checking Halide 22"); it is not run here."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KIT = ROOT / "benchmarks" / "halide22_kit.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

import halide22_kit as kit  # noqa: E402
import halide_aottests as aot  # noqa: E402
import halide_python_apps as apps  # noqa: E402
from halide_source import HalideSource  # noqa: E402


def offline_pip_env() -> dict:
    """The environment with pip's configuration (files and PIP_* variables) left out, so that
    only the options a test gives pip count: no index or link of this machine's is read."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def run_kit(*args, env=None):
    return subprocess.run([sys.executable, str(KIT), *args], capture_output=True, text=True,
                          env=env or offline_pip_env(), timeout=120)


# --- the command line ------------------------------------------------------------------------

def test_the_defaults_ask_for_halide_22_and_every_step():
    args = kit.parser().parse_args([])
    assert args.halide == "halide>=22,<23"
    assert args.out == ROOT / "build" / "halide22-kit"
    assert args.steps.split(",") == ["pipelines", "tests", "apps", "aot-tests"]
    assert args.halide_source is None and args.ref is None and args.pip_option == []
    args = kit.parser().parse_args(["--halide", "halide==21.0.0", "--limit", "tests=60",
                                    "--limit", "setup=7.5", "--pip-option=--pre",
                                    "--pip-option=--find-links=/wheels"])
    assert args.limit == [("tests", 60.0), ("setup", 7.5)]
    assert args.pip_option == ["--pre", "--find-links=/wheels"]


@pytest.mark.parametrize("argv, message", [
    (["--limit", "lunch=60"], "expected STEP=SECONDS"),
    (["--limit", "tests"], "expected STEP=SECONDS"),
    (["--steps", "tests,lunch"], "unknown steps: lunch"),
])
def test_bad_arguments_exit_2_saying_what_is_wrong(argv, message, capsys):
    with pytest.raises(SystemExit) as raised:
        kit.main(argv)
    assert raised.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("requirement, words", [
    ("halide>=22,<23", "Halide 22"), ("halide >= 22.0, < 23", "Halide 22"),
    ("halide>=22,<24", "halide>=22,<24"), ("halide==22.0.0", "halide==22.0.0")])
def test_the_release_a_requirement_names(requirement, words):
    assert kit.release_words(requirement) == words


def test_the_line_a_run_without_a_release_ends_with():
    assert kit.no_release_line("halide>=22,<23") == \
        "no Halide 22 released on PyPI yet: nothing checked"
    assert kit.no_release_line("halide>=99", ["--no-index"]) == \
        "no halide>=99 released on the index pip was given (--no-index) yet: nothing checked"


# --- no release, no index ----------------------------------------------------------------

def test_a_release_pip_cannot_find_ends_the_run_with_status_3_having_checked_nothing(tmp_path):
    links = tmp_path / "no-wheels"
    links.mkdir()
    out = tmp_path / "out"
    done = run_kit("--halide", "halide>=99,<100", "--pip-option=--no-index",
                   f"--pip-option=--find-links={links}", "--out", str(out))
    assert done.returncode == kit.NO_RELEASE == 3, done.stdout + done.stderr
    line = (f"no Halide 99 released on the index pip was given (--no-index --find-links={links}) "
            "yet: nothing checked")
    assert line in done.stdout
    assert (out / "summary.txt").read_text().splitlines()[0] == f"Halide kit run: {line}"
    assert sorted(p.name for p in out.iterdir()) == ["summary.txt"]  # no environment made
    assert out.stat().st_mode & 0o777 == 0o700


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_index_pip_cannot_reach_is_not_taken_for_one_without_the_release(tmp_path):
    done = run_kit("--halide", "halide>=99", f"--pip-option=--index-url=http://127.0.0.1:{free_port()}/",
                   "--pip-option=--retries=1", "--pip-option=--timeout=1", "--out", str(tmp_path))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "pip could not look halide>=99 up" in done.stderr
    assert "nothing checked" not in done.stdout
    assert not (tmp_path / "summary.txt").exists()


# --- the steps, the folders, the summary -------------------------------------------------------

def fake_run(tmp_path, **settings) -> kit.Run:
    return kit.Run("halide>=22,<23", "22.0.0", tmp_path / "out", **settings)


def python_step(name, code, limit=60, needs_source=False) -> kit.Step:
    return kit.Step(name, f"{name}'s work", [[sys.executable, "-c", code]], limit,
                    needs_source=needs_source)


def test_the_steps_run_in_the_kits_environment_with_what_the_run_was_given(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    run = fake_run(tmp_path, source=Path("/src/Halide"), ref="v22.0.0", pip_options=("--pre",),
                   pytest_args=("-k", "crops"), aot_tests="example",
                   limits={**kit.LIMITS, "tests": 60})
    steps = {step.name: step for step in kit.make_steps(run)}
    assert list(steps) == list(kit.STEPS)
    venv, install, halide, check = steps["setup"].commands
    assert venv[1:] == ["-m", "venv", str(run.work / "venv")]
    assert install[0] == run.python and install[-2:] == ["-e", ".[test]"]
    assert halide[-2:] == ["--pre", "halide==22.0.0"]  # (the version found, not the requirement)
    assert check[-3:] == ["check-setup", "--expect", "22.0.0"]
    assert steps["tests"].limit == 60 and steps["tests"].commands[0][-2:] == ["-k", "crops"]
    aot_command = steps["aot-tests"].commands[0]
    assert aot_command[0] == run.python
    assert {"--halide-source=/src/Halide", "--ref=v22.0.0"} <= set(aot_command)
    assert aot_command[-2:] == ["--tests", "example"]
    env = run.environment()
    assert "PYTHONPATH" not in env
    assert env["PATH"].startswith(str(run.work / "venv" / "bin"))
    assert env["HALIDE_SHIM_PIPELINES"] == str(run.work / "pipelines")
    assert env["XDG_CACHE_HOME"].startswith(str(run.work))


def test_a_failing_step_fails_the_run_after_the_others_ran(tmp_path, monkeypatch):
    run = fake_run(tmp_path)
    monkeypatch.setattr(kit, "make_steps", lambda run: [
        python_step("setup", "print('KIT_SETUP={}')"),
        python_step("pipelines", "import sys; print('pipelines break'); sys.exit(4)"),
        python_step("tests", "import sys; print('the tests ran anyway'); sys.exit(2)"),
        python_step("apps", "import time; time.sleep(60)", limit=2),
        python_step("aot-tests", "print('not run')", needs_source=True)])
    assert kit.run_steps(run, list(kit.STEPS)) == 1
    summary = json.loads((run.out / "summary.json").read_text())
    steps = summary["steps"]
    assert summary["failed_steps"] == ["pipelines", "tests", "apps"]
    assert [steps[s]["status"] for s in kit.STEPS] == ["passed", "failed", "failed", "timeout",
                                                      "not run"]
    assert steps["tests"]["reason"] == kit.PYTEST_EXITS[2]  # (pytest's status for an interrupt)
    assert "no --halide-source" in steps["aot-tests"]["reason"]
    assert "the tests ran anyway" in (run.out / "tests.log").read_text()
    assert "pipelines break" in (run.out / "pipelines.log").read_text()
    text = (run.out / "summary.txt").read_text()
    assert text.startswith("Halide kit run: FAILED: pipelines, tests, apps in ")
    assert "verdict: halide 22.0.0 NOT verified: pipelines, tests, apps failed" in text
    assert f"{'':<30}{kit.PYTEST_EXITS[2]}" in text.splitlines()


def test_a_failed_setup_leaves_the_other_steps_not_run(tmp_path, monkeypatch):
    run = fake_run(tmp_path)
    monkeypatch.setattr(kit, "make_steps", lambda run: [
        python_step("setup", "import sys; sys.exit(1)"), python_step("tests", "print('ran')")])
    assert kit.run_steps(run, ["tests"]) == 1
    steps = json.loads((run.out / "summary.json").read_text())["steps"]
    assert steps["tests"] == {"status": "not run", "seconds": 0.0,
                              "reason": "the setup failed: no environment to run in"}


def test_each_run_makes_its_work_folder_anew_and_deletes_only_its_own(tmp_path):
    out = tmp_path / "out"
    kit.private_folder(out, "the kit's output")
    kit.prepare_work(out)
    work = out / "work"
    (work / "venv").mkdir()
    kit.prepare_work(out)  # an earlier run's: deleted, made again
    assert sorted(p.name for p in work.iterdir()) == [kit.WORK_MARK]
    assert work.stat().st_mode & 0o777 == 0o700 and out.stat().st_mode & 0o777 == 0o700
    (work / kit.WORK_MARK).unlink()
    (work / "precious").write_text("someone's")
    with pytest.raises(RuntimeError, match="is not the kit's"):
        kit.prepare_work(out)
    assert (work / "precious").read_text() == "someone's"


def test_a_folder_others_can_write_is_not_used(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.warns(UserWarning, match="writable by others"), \
            pytest.raises(RuntimeError, match="can be written by others"):
        kit.private_folder(shared, "the kit's output")
    assert list(shared.iterdir()) == []


def test_the_summary_has_every_figure(tmp_path):
    run = fake_run(tmp_path, source=Path("/src/Halide"), ref="v22.0.0")
    steps = [kit.Step(name, f"{name}'s work", [], 60) for name in kit.STEPS]
    results = [
        {"status": "passed", "seconds": 300.0, "facts": {
            "halide": "22.0.0", "pipeline builds use halide": "22.0.0",
            "shim native library": "/tree/shim/_native.abi3.so", "its runtime release": "21",
            "build requirement": ["halide==21.0.0"]}},
        {"status": "passed", "seconds": 80.5, "counts": "4 libraries, 4 told as Halide 22",
         "table": ["brighten-host-bundled-x.so: built by Halide 22"]},
        {"status": "failed", "seconds": 1500.0, "passed": 1200, "failed": 2, "errors": 1,
         "skipped": 30, "skip_reasons": {"no CUDA device": 30},
         "failures": ["tests.test_a::test_one", "tests.test_b::test_two (error)"]},
        {"status": "passed", "seconds": 60.0, "counts": "5 Python apps: 5 give ...",
         "table": ["5 Python apps: 5 give ...", "blur  22  same"]},
        {"status": "timeout", "seconds": 5400.0, "counts": "50 AOT tests: 40 same",
         "table": ["50 AOT tests: 40 same"]},
    ]
    for step, result in zip(steps, results):
        step.result = result
    lines = kit.summarize(run, steps, ["tests", "aot-tests"], 7384.4).splitlines()
    assert lines[:4] == [
        "Halide kit run: FAILED: tests, aot-tests in 7384 s",
        "requirement: halide>=22,<23 -> halide 22.0.0",
        "Halide source: /src/Halide at v22.0.0",
        "verdict: halide 22.0.0 NOT verified: tests, aot-tests failed"]
    assert lines[4] == ("setup: halide 22.0.0 in the environment (pipeline builds use 22.0.0); "
                        "the shim's native library /tree/shim/_native.abi3.so, its runtime "
                        "Halide 21's (build requirement halide==21.0.0)")
    assert f"python: {run.python}" in lines[5]
    table = lines[lines.index("step       status    seconds  counts") + 1:]
    assert table[:5] == [
        "setup      passed      300.0  ",
        "pipelines  passed       80.5  4 libraries, 4 told as Halide 22",
        "tests      failed     1500.0  1200 passed, 2 failed, 1 errors, 30 skipped",
        "apps       passed       60.0  5 Python apps: 5 give ...",
        "aot-tests  timeout    5400.0  50 AOT tests: 40 same"]
    assert "  tests: 30 skipped: no CUDA device" in lines
    assert "  tests: FAILED tests.test_b::test_two (error)" in lines
    assert lines[-2:] == ["aot-tests: aot-tests's work", "50 AOT tests: 40 same"]


def test_the_suites_counts_name_the_reason_a_module_was_skipped_whole(tmp_path):
    junit = tmp_path / "tests.xml"
    junit.write_text(
        '<testsuites><testsuite>'
        '<testcase classname="tests.test_a" name="test_one"/>'
        '<testcase classname="tests.test_a" name="test_two"><failure message="x"/></testcase>'
        '<testcase classname="tests.test_a" name="test_three">'
        '<skipped type="pytest.skip" message="no CUDA device">why</skipped></testcase>'
        '<testcase classname="" name="tests.test_dlpack"><skipped type="pytest.skip" '
        'message="collection skipped">(\'/tree/tests/test_dlpack.py\', 22, "Skipped: PyTorch is '
        'an optional test dependency")</skipped></testcase>'
        '</testsuite></testsuites>')
    counts = kit.junit_counts(junit)
    assert (counts["passed"], counts["failed"], counts["skipped"]) == (1, 1, 2)
    assert counts["failures"] == ["tests.test_a::test_two"]
    assert counts["skip_reasons"] == {"no CUDA device": 1,
                                      "test_dlpack.py: PyTorch is an optional test dependency": 1}


@pytest.mark.parametrize("statuses, chosen, settings, words", [
    (["passed"] * 5, kit.STEPS, {}, "halide 22.0.0 verified: every step passed"),
    (["passed"] * 3 + ["not run"] * 2, kit.STEPS, {},
     "halide 22.0.0 not verified: every step run passed, but apps, aot-tests did not run"),
    (["passed"] * 3, kit.STEPS[:3], {},
     "halide 22.0.0 not verified: every step run passed, but apps, aot-tests did not run"),
    (["passed"] * 5, kit.STEPS, {"pytest_args": ("-k", "crops"), "aot_tests": "example"},
     "halide 22.0.0 not verified: every step passed, on the part of it --pytest-args, "
     "--aot-tests chose"),
])
def test_only_a_whole_run_of_every_step_verifies(tmp_path, statuses, chosen, settings, words):
    steps = [kit.Step(name, "", [], 1, result={"status": status, "seconds": 1.0})
             for name, status in zip(chosen, statuses)]
    assert kit.verdict(fake_run(tmp_path, **settings), steps, []).startswith(words)


# --- the checks run inside the kit's environment ----------------------------------------------

def test_the_setup_check_knows_the_environments_halide_and_the_native_librarys_runtime(capsys):
    installed = metadata.version("halide")
    assert kit.check_setup(installed) == 0
    facts = json.loads(capsys.readouterr().out.split("KIT_SETUP=")[1])
    assert facts["halide"] == facts["pipeline builds use halide"] == installed
    assert facts["its runtime release"] == "21" and facts["build requirement"] == ["halide==21.0.0"]
    assert Path(facts["shim native library"]).is_relative_to(ROOT)
    assert kit.check_setup("22.0.0") == 1
    assert (f"SETUP PROBLEM: the environment's halide is {installed}, not 22.0.0"
            in capsys.readouterr().out)


def test_the_release_check_reads_what_the_shim_tells_of_each_sample_pipeline(
        host_pipelines, tmp_path, capsys, monkeypatch):
    from shim.calls.pipeline import Pipeline

    directory = next(iter(host_pipelines.values())).parent
    major = metadata.version("halide").split(".")[0]
    assert kit.check_releases(directory, tmp_path / "report.json") == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert {lib["release"] for lib in report["libraries"]} == {major}
    assert len(report["libraries"]) == len(host_pipelines)
    out = capsys.readouterr().out
    assert f"built by: Halide {major}" in out  # (python -m shim info's own words)
    monkeypatch.setattr(Pipeline, "release", property(lambda self: "19"))
    assert kit.check_releases(directory, tmp_path / "report.json") == 1
    assert f"<-- NOT {major}" in capsys.readouterr().out


# --- Halide's source --------------------------------------------------------------------------

def git(*args, cwd):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_halides_source_is_read_from_a_bare_mirror_at_a_ref(tmp_path):
    tree = tmp_path / "checkout"
    (tree / "test" / "generator").mkdir(parents=True)
    (tree / "test" / "generator" / "a_aottest.cpp").write_text("old")
    (tree / "tools").mkdir()
    (tree / "tools" / "b.h").write_text("tool")
    git("init", "-q", cwd=tree)
    git("add", ".", cwd=tree)
    git("-c", "user.name=k", "-c", "user.email=k@k", "commit", "-qm", "files", cwd=tree)
    git("tag", "v22.0.0", cwd=tree)
    (tree / "test" / "generator" / "a_aottest.cpp").write_text("new")  # (after the tag)
    git("-c", "user.name=k", "-c", "user.email=k@k", "commit", "-qam", "later", cwd=tree)
    git("clone", "-q", "--bare", str(tree), str(tmp_path / "mirror"), cwd=tmp_path)
    source = HalideSource(tmp_path / "mirror", "v22.0.0")
    assert source.read("test/generator/a_aottest.cpp") == b"old"
    assert source.files("test") == ["test/generator/a_aottest.cpp"]
    assert source.extract(["test", "tools"], tmp_path / "out") == []
    assert (tmp_path / "out" / "test" / "generator" / "a_aottest.cpp").read_text() == "old"
    assert (tmp_path / "out" / "tools" / "b.h").read_text() == "tool"
    plain = HalideSource(tmp_path / "out", "v22.0.0")  # (not a repository: read as it is)
    assert plain.ref is None and plain.read("tools/b.h") == b"tool"
    with pytest.raises(RuntimeError, match="has no v23.0.0"):
        HalideSource(tmp_path / "mirror", "v23.0.0")


# --- the AOT tests' plan and table --------------------------------------------------------------

FAKE_CMAKE = """
function(_add_halide_libraries TARGET)
    set(options GRADIENT_DESCENT OMIT_C_BACKEND)
    set(oneValueArgs FROM GENERATOR_NAME FUNCTION_NAME NAMESPACE USE_RUNTIME AUTOSCHEDULER REGISTRATION)
    set(multiValueArgs ENABLE_IF TARGETS FEATURES PARAMS PLUGINS EXTERNS)
    cmake_parse_arguments(args "${options}" "${oneValueArgs}" "${multiValueArgs}" ${ARGN})
    set(OPTIONS "-DNOT_A_KEYWORD")
    add_halide_library(${TARGET} FROM "${args_FROM}")
endfunction()

function(_add_halide_aot_tests NAME)
    set(options OMIT_C_BACKEND LINK_TO_GPU)
    set(oneValueArgs "")
    set(multiValueArgs ENABLE_IF GROUPS INCLUDES HALIDE_LIBRARIES HALIDE_RUNTIME DEPS SRCS)
    if (NOT args_HALIDE_LIBRARIES)
        set(args_HALIDE_LIBRARIES "${NAME}")  # (a function's body: not read as the file's)
    endif ()
    _add_halide_aot_tests(not_a_test)
endfunction()

if (Halide_TARGET MATCHES "wasm")
    set(_USING_WASM 1)
else ()
    set(_USING_WASM 0)
endif ()

# plain: one library of its own generator
_add_halide_libraries(plain)
_add_halide_aot_tests(plain)

# two libraries, one of another's generator, with params (a quoted one with spaces), features,
# targets (a multitarget library) and an environment
set(many_params a.type=uint8 "expr=5 y * x +")
_add_halide_libraries(many REGISTRATION many_registration_cpp TARGETS cmake-no_bounds_query cmake)
_add_halide_libraries(many_ucon FROM many.generator GENERATOR_NAME many FEATURES user_context
                      PARAMS ${many_params})
_add_halide_aot_tests(many HALIDE_LIBRARIES many many_ucon ENABLE_IF NOT ${_USING_WASM}
                      INCLUDES "${Halide_SOURCE_DIR}/src/runtime" GROUPS multithreaded)
set_tests_properties(generator_aot_many PROPERTIES ENVIRONMENT "MANY_MODE=1")

# externs: a C++ archive and another halide library
add_library(helpers STATIC helpers_a.cpp helpers_b.cpp)
_add_halide_libraries(uses_externs FUNCTION_NAME Ns::uses_externs EXTERNS helpers plain)
_add_halide_aot_tests(uses_externs)

# not built: plugins, a condition, a library of its own rules, a generator linking stubs
set(AUTO_LIBS auto_a auto_b)
foreach (LIB IN LISTS AUTO_LIBS)
    _add_halide_libraries(${LIB} FROM plain.generator PLUGINS Halide::Adams2019)
endforeach ()
_add_halide_aot_tests(auto HALIDE_LIBRARIES auto_a auto_b)
_add_halide_libraries(gated)
_add_halide_aot_tests(gated ENABLE_IF WITH_AUTOSCHEDULERS)
add_halide_library(own_rules FROM plain.generator)
_add_halide_aot_tests(own_rules)
add_halide_generator(stubby.generator SOURCES stubby_generator.cpp LINK_LIBRARIES other.stub)
_add_halide_libraries(stubby FROM stubby.generator)
_add_halide_aot_tests(stubby)
"""


def fake_tree(root: Path) -> Path:
    folder = root / "test" / "generator"
    folder.mkdir(parents=True)
    (folder / "CMakeLists.txt").write_text(FAKE_CMAKE)
    for name in ("plain", "many", "uses_externs", "auto", "gated", "own_rules", "stubby", "orphan"):
        (folder / f"{name}_aottest.cpp").write_text("int main() { return 0; }\n")
    return root


def test_the_aot_tests_plan_reads_halides_cmake_file_as_its_functions_keywords_say(tmp_path):
    tree = fake_tree(tmp_path)
    plan = {test.name: test for test in aot.plan(tree)}
    assert sorted(plan) == ["auto", "gated", "many", "orphan", "own_rules", "plain", "stubby",
                            "uses_externs"]
    plain = plan["plain"]
    assert (plain.sources, plain.not_built, plain.environment) == (["plain_aottest.cpp"], "", {})
    [library] = plain.libraries
    assert (library.name, library.sources, library.generator, library.function) == (
        "plain", ["plain_generator.cpp"], "plain", "plain")
    assert library.target(no_runtime=False) == "host"
    many = plan["many"]
    assert many.not_built == "" and many.includes == ["src/runtime"]
    assert many.environment == {"MANY_MODE": "1"}
    first, ucon = many.libraries
    assert first.target(no_runtime=True) == "host-no_bounds_query-no_runtime,host-no_runtime"
    assert (ucon.name, ucon.sources, ucon.generator, ucon.function) == (
        "many_ucon", ["many_generator.cpp"], "many", "many_ucon")
    assert ucon.params == ["a.type=uint8", "expr=5 y * x +"]
    assert ucon.target(no_runtime=False) == "host-user_context"
    externs = plan["uses_externs"]
    assert externs.sources == ["uses_externs_aottest.cpp", "helpers_a.cpp", "helpers_b.cpp"]
    assert [lib.name for lib in externs.libraries] == ["uses_externs", "plain"]
    assert externs.libraries[0].function == "Ns::uses_externs"
    assert plan["auto"].not_built == "its library auto_a is built with an autoscheduler or plugins"
    assert plan["gated"].not_built.startswith("needs Halide's autoscheduler plugins")
    assert plan["own_rules"].not_built == ("its library own_rules is made by add_halide_library "
                                           "rules of its own")
    assert plan["stubby"].not_built == "its library stubby's generator links other.stub"
    assert plan["orphan"].not_built.startswith("no _add_halide_aot_tests")
    assert all(not test.libraries for test in plan.values() if test.not_built)


def test_a_cmake_file_without_the_functions_cannot_be_read(tmp_path):
    tree = fake_tree(tmp_path)
    (tree / "test" / "generator" / "CMakeLists.txt").write_text("_add_halide_aot_tests(plain)\n")
    with pytest.raises(RuntimeError, match="defines no _add_halide_aot_tests, _add_halide_libraries"):
        aot.plan(tree)


@pytest.mark.parametrize("code, output, expected", [
    (0, "Success!\n", "passed"), (0, "[SKIP] Test requires OpenCL.\n", "skipped"),
    (1, "Error\n", "failed (exit 1)"), (-11, "", "failed (SIGSEGV)"), (None, "", "timeout")])
def test_a_sides_outcome(code, output, expected):
    assert aot.outcome(code, output) == expected


def test_the_aot_table_counts_each_verdict_and_fails_on_the_shims_failures():
    results = [
        {"name": "same_pass", "stock": "passed", "shim": "passed"},
        {"name": "same_skip", "stock": "skipped", "shim": "skipped"},
        {"name": "shim_breaks", "stock": "passed", "shim": "failed (exit 1)",
         "shim_says": "undefined symbol: halide_foo"},
        {"name": "stock_breaks", "stock": "failed (SIGABRT)", "shim": "failed (SIGABRT)",
         "stock_says": "abort"},
        {"name": "unbuilt", "not_built": "needs plugins"},
        {"name": "broken_build", "not_built": "", "build_error": "c++ failed"},
    ]
    lines = aot.table(results)
    assert lines[0] == ("6 AOT tests: 2 same, 1 shim fails, 1 stock fails, 1 build failed, "
                        "1 not built")
    assert lines[1].split() == ["test", "stock", "shim", "verdict"]
    row = lines.index(next(line for line in lines if line.startswith("shim_breaks")))
    assert lines[row].split() == ["shim_breaks", "passed", "failed", "(exit", "1)", "shim", "fails"]
    assert lines[row + 1] == "    shim: undefined symbol: halide_foo"
    assert "    needs plugins" in lines
    assert aot.failed(results)
    assert not aot.failed([results[0], results[1], results[3], results[4]])


def test_the_apps_verdicts():
    same = {"release": "22", "stock": "ran", "shim": "ran", "differ": {"out": 0},
            "elements": {"out": 10}, "release_ok": True}
    assert apps.verdict(same) == "same"
    assert apps.verdict({**same, "differ": {"out": 3}}) == "DIFFER: out: 3 of 10 elements differ"
    assert apps.verdict({**same, "release_ok": False}) == \
        "same outputs, but the shim tells release 22"
    assert apps.verdict({"release": "22", "stock": "ran", "shim": "ValueError: x"}) == \
        "shim failed: ValueError: x"
    lines = apps.table({"blur": same, "identity": {"error": "build failed: x"}}, "22")
    assert lines[0] == ("2 Python apps: 1 give the stock runtime's outputs bit for bit (shim "
                        "tells release 22), 1 not")
    assert lines[2].split() == ["blur", "22", "same"]


def test_the_apps_inputs_are_what_each_app_takes():
    import numpy as np

    made = apps.values("interpolate", seed=1)
    assert made["input_buf"].shape == (4, apps.HEIGHT, apps.WIDTH)
    assert made["input_buf"].dtype == np.float32 and 0 <= made["input_buf"].min()
    assert made["input_buf"].max() < 1 and not made["output_buf"].any()
    blur = apps.values("blur", seed=1)["input_buf"]
    assert blur.dtype == np.uint16 and blur.max() < 2**14
    assert apps.values("local_laplacian", seed=1)["levels"] == 8
    negative_zero = np.array([0.0], np.float32), np.array([-0.0], np.float32)
    assert apps._differing(*negative_zero) == 1  # bits, not values
