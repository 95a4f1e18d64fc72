"""The built documentation renders in a browser: headless Chromium (Debian's ``chromium``) opens pages
of the site built by the ``docs_build`` fixture (``sphinx-build -W``, shared with test_docs.py),
served from a local HTTP server with every other host unreachable, so MathJax must come from the site
itself.  Checked on the rendered DOM: the math is typeset by MathJax (``mjx-container`` elements) and
no LaTeX source is left visible, tables are ``<table>`` elements, the gallery shows its figures.
Screenshots of the pages go to ``$SOFTARGMAX_DOCS_SCREENSHOTS`` (default ``docs/_build/screenshots``)
for a person to look at.  Skipped when Chromium is not installed (``apt-get install chromium``)."""

import functools
import http.server
import os
import re
import shutil
import subprocess
import threading

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHROMIUM = next((p for p in map(shutil.which, ["chromium", "chromium-browser"]) if p), None)
SCREENSHOTS = os.environ.get("SOFTARGMAX_DOCS_SCREENSHOTS", os.path.join(ROOT, "docs", "_build", "screenshots"))

#: page, an anchor to open it at (none: its top), and the fewest typeset formulas it must show
PAGES = [
    ("numerics.html", "", 20),
    ("api/operators.html", "", 20),
    ("api/losses.html", "", 5),
    ("conventions.html", "", 1),
    ("coming-from-entmax.html", "", 5),
    ("flash-attention.html", "", 20),
    ("index.html", "", 3),
    ("divergences.html", "", 10),
    ("api/divergences.html", "", 20),
    ("api/modules.html", "", 20),
    ("api/attention.html", "", 20),
    ("api/distributed.html", "", 20),
    ("api/compat.html", "", 20),
    ("auto_examples/plot_sparse_vs_softmax.html", "", 2),
    ("auto_examples/plot_fenchel_young_classifier.html", "", 2),
]

#: LaTeX or the old plain-text formulas, which must not be visible outside typeset math
RAW_MATH = re.compile(r"\\(alpha|tau|theta|sum|frac|langle|lvert|operatorname|mathbb|\(|\[)|\$\$|_\+\^|\]_\+")
#: formulas written as inline code (``[x - τ]_+``, ``⟨p, x⟩``, ``Σ_j``) instead of math
CODE_MATH = re.compile(r"\]_\+|\^\{|⟨|Σ|‖")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the site without logging every request to stderr."""

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def site(docs_build):
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium)")
    pytest.importorskip("bs4")  # installed with the docs theme (furo)
    html, returncode, stderr = docs_build
    if returncode != 0:
        pytest.fail("the documentation does not build (test_docs.py shows why):\n" + stderr[-2000:])
    handler = functools.partial(_QuietHandler, directory=str(html))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield html, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


def _chromium(url, tmp_path, *args):
    """Run headless Chromium on ``url`` (10 s of virtual time: MathJax finishes typesetting first);
    every host but the local server fails to resolve, so nothing comes from the network."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}",
           "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", "--virtual-time-budget=10000",
           *args, url]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def _visible_text(element):
    """The text a reader sees, less typeset math and code (code may hold backslashes and dollars)."""
    import copy

    element = copy.copy(element)
    for hidden in element.select("mjx-container, script, style, pre, code, .headerlink"):
        hidden.decompose()
    return element.get_text(" ")


@pytest.mark.parametrize("page, anchor, min_math", PAGES, ids=[p for p, _, _ in PAGES])
def test_page_renders(site, page, anchor, min_math, tmp_path):
    from bs4 import BeautifulSoup

    html, base = site
    source = (html / page).read_text(encoding="utf-8")
    scripts = re.findall(r'<script[^>]*src="([^"]+)"', source)
    mathjax = [s for s in scripts if "mathjax" in s.lower()]
    assert mathjax and all(not s.startswith(("http:", "https:", "//")) for s in scripts), scripts
    assert all((html / os.path.dirname(page) / s.split("?")[0]).exists() for s in mathjax), mathjax

    os.makedirs(SCREENSHOTS, exist_ok=True)
    shot = os.path.join(SCREENSHOTS, page.replace("/", "_").replace(".html", ".png"))
    if os.path.exists(shot):
        os.remove(shot)
    dom = _chromium(base + page + anchor, tmp_path, "--dump-dom", f"--screenshot={shot}", "--window-size=1280,2800")
    assert os.path.getsize(shot) > 10_000
    dom = BeautifulSoup(dom, "html.parser")
    main = dom.select_one("article") or dom.body
    typeset = main.select("mjx-container")
    assert len(typeset) >= min_math, f"{page}: {len(typeset)} typeset formulas"
    # every formula Sphinx marked as math was typeset: nothing of its LaTeX source is left as text
    for math in main.select(".math"):
        assert math.select("mjx-container"), f"{page}: not typeset: {math.get_text()[:200]}"
    raw = sorted({m.group(0) for m in RAW_MATH.finditer(_visible_text(main))})
    assert not raw, f"{page}: LaTeX or plain-text formulas left as text: {raw}"
    code = sorted({c.get_text() for c in main.select("code") if c.find_parent("pre") is None
                   and CODE_MATH.search(c.get_text())})
    assert not code, f"{page}: formulas shown as inline code: {code}"
    assert "mjx-merror" not in str(main), f"{page}: a formula failed to parse"

    if page == "numerics.html":
        section = main.select_one("section#error-bounds-per-dtype")
        table = section.find("table")
        assert table is not None and len(table.select("tbody tr")) == 3, "the dtype table is not a table"
        assert next(th.get_text(" ").split()[0] for th in table.select("thead th")) == "dtype"
        assert table.select("thead mjx-container")  # the error measures in the header are typeset
        assert "| dtype |" not in section.get_text()
        assert section.find_next("table") is not None  # the table of infinite and NaN inputs
    if page.startswith("auto_examples/"):
        images = main.select("img.sphx-glr-single-img, img.sphx-glr-multi-img")
        assert images and all((html / os.path.dirname(page) / img["src"]).exists() for img in images)
