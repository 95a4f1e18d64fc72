"""Sphinx configuration: the API reference is built from the docstrings (autodoc + napoleon for the
``Args:`` sections), the guides are Markdown (MyST), math is rendered with MathJax.

Build locally with ``pip install -e ".[docs]"`` and ``sphinx-build -W -b html docs docs/_build/html``.
"""

import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "src")))

project = "softargmax"
author = "the softargmax developers"
copyright = "2026, the softargmax developers"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "myst_parser",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
html_theme = "alabaster"
html_title = "softargmax"
