"""Sphinx configuration: the API reference is built from the docstrings (autodoc + napoleon for the
``Args:`` sections), the guides are Markdown (MyST), the examples gallery is built by sphinx-gallery
from ``examples/`` (it runs every script), and math is typeset by MathJax 3, served from the built
site itself (``sphinx-mathjax-offline``), so the pages work offline.  Theme: Furo.

Build locally (after PyTorch, see install.md) with ``pip install -c requirements/constraints.txt -e ".[docs]"`` and
``sphinx-build -W -b html docs docs/_build/html``.
"""

import os
import sys

# the checkout's sources, whatever is installed: the PyTorch package (src/) and the JAX package (jax/src/, whose
# reference is in jax.md; the docs extra installs jax itself)
for _sources in ("src", os.path.join("jax", "src")):
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", _sources)))

project = "softargmax"
author = "the softargmax developers"
copyright = "2026, the softargmax developers"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",  # MathJax 3 copied into _static/mathjax: no CDN
    "sphinx_gallery.gen_gallery",
    "myst_parser",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3
autodoc_member_order = "bysource"
autodoc_typehints = "description"
# no default "members": Sphinx then ignores an automodule's own list (":members: solve" renders the whole
# __all__; sphinx-doc/sphinx#9709), so each automodule says ":members:" (its __all__) or names them
autodoc_default_options = {"show-inheritance": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# torch.nn's layout: the shapes of the tensors in and out, after Args and Returns
napoleon_custom_sections = ["Shape"]

# the examples gallery: every script of examples/ runs at build time (so the docs build, which the
# test suite runs with -W, also runs the examples); a failing example fails the build
sphinx_gallery_conf = {
    "examples_dirs": os.path.join(os.path.dirname(__file__), "..", "examples"),
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "download_all_examples": False,
    "remove_config_comments": True,
    "write_computation_times": False,
    "show_signature": False,
    "run_stale_examples": True,  # run every script at every build, never a cached result
}

html_theme = "furo"
html_title = "softargmax"
