"""Sphinx configuration of the manual (docs/*.md, MyST): python -m sphinx -W -b html docs OUT.
tests/test_docs.py builds it with warnings as errors."""

import shim

project = "halide-shim"
release = shim.__version__
extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence"]
# Headings become link targets, as GitHub renders them.
myst_heading_anchors = 3
autodoc_member_order = "bysource"
html_theme = "alabaster"
