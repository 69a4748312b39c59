"""How long a fresh process takes to start using the shim (issue 27): ``import shim``, and
``python -m shim info`` / ``run --describe`` on a pipeline, against ``import numpy`` (which the
shim needs, and every numpy user pays), side by side, the commands taking turns.

    python benchmarks/start_time.py [--runs 15]

Each figure is one new interpreter, its wall time from start to exit (min and median over the
runs), with bytecode compiled as an installed package has it: every process reads the
package's compiled modules from one temporary PYTHONPYCACHEPREFIX, written by a first run of
each command (an editable checkout run with PYTHONDONTWRITEBYTECODE set, as on this machine,
compiles every module on every import instead). Targets: ``import shim`` at most 0.05 s more
than ``import numpy``, ``info`` at most 0.3 s more. The pipeline is the sample brighten, host,
no_runtime (built first if needed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from shim.pipelines.build import Build, build

TARGETS = {"import shim": 0.05, "python -m shim info": 0.3, "python -m shim run --describe": 0.3}


def commands(library: str) -> dict:
    return {"import numpy": [sys.executable, "-c", "import numpy"],
            "import shim": [sys.executable, "-c", "import shim"],
            "python -m shim info": [sys.executable, "-m", "shim", "info", library],
            "python -m shim run --describe": [sys.executable, "-m", "shim", "run", library,
                                              "--describe"]}


def seconds(command: list, env: dict) -> float:
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    library = str(build(Build("brighten", "host", "no_runtime")))
    todo = commands(library)
    with tempfile.TemporaryDirectory(prefix="shim-start-") as prefix:
        env = dict(os.environ, PYTHONPYCACHEPREFIX=prefix)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        for command in todo.values():
            seconds(command, env)  # writes the bytecode, and warms the file cache
        samples = {name: [] for name in todo}
        for run in range(args.runs):
            for name, command in todo.items():
                samples[name].append(seconds(command, env))
            print(f"run {run + 1}/{args.runs}", end="\r" if sys.stdout.isatty() else "\n",
                  flush=True)
    base = samples["import numpy"]
    print(f"{'command':32} {'min s':>7} {'median s':>9} {'+ over numpy (min)':>19} "
          f"{'target':>7}  met")
    for name, values in samples.items():
        low, mid = min(values), statistics.median(values)
        extra = low - min(base)
        target = TARGETS.get(name)
        verdict = "" if target is None else ("yes" if extra <= target else "NO")
        print(f"{name:32} {low:7.3f} {mid:9.3f} {'' if name == 'import numpy' else f'{extra:+.3f}':>19} "
              f"{'' if target is None else f'+{target:.2f}':>7}  {verdict}")


if __name__ == "__main__":
    main()
