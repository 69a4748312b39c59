"""Runs a Python generator's script as Halide's generator command line, for
``python -m shim build`` (shim/cli/build.py): ``python python_generator.py SCRIPT ARGS...``
runs SCRIPT as ``python SCRIPT`` would (its folder first on the path, in place of this one's),
then ``hl.main()`` on ARGS; without -g, for the script's only generator.

Run by its path, never imported: the generator's process stays without the shim (Halide's
compiler has no use for its runtime), and none of this folder's modules can be taken for the
script's own.
"""

import os
import runpy
import sys

import halide as hl

script, arguments = sys.argv[1], sys.argv[2:]
sys.argv = [script, *arguments]
sys.path[0] = os.path.dirname(os.path.abspath(script))
runpy.run_path(script, run_name="__halide_generator__")
# (halide 19 and 21 list them so; where a release does not, Halide's own error asks for -g)
names = list(getattr(hl, "_get_python_generator_names", lambda: [])())
if "-g" not in arguments and len(names) == 1:
    sys.argv[1:1] = ["-g", names[0]]
hl.main()
