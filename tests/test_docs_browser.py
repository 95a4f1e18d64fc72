"""The built documentation renders in a browser: headless Chromium (Debian's ``chromium``) opens pages
of the site built by the ``docs_build`` fixture (``sphinx-build -W``, shared with test_docs.py),
served from a local HTTP server with every other host unreachable, so MathJax must come from the site
itself.  Checked on the rendered DOM: the math is typeset by MathJax (``mjx-container`` elements) and
no LaTeX source is left visible, tables are ``<table>`` elements, the gallery shows its figures.
Every formula of every page is typeset once more on one page (the site's own page and scripts, its article
replaced by the formulas), where none may fail to parse; what MathJax does not touch (text outside the
elements Sphinx marks as math, inline code) is checked on every page's HTML without a browser.
Screenshots of the rendered pages go to ``$SOFTARGMAX_DOCS_SCREENSHOTS`` (default ``docs/_build/screenshots``)
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

#: page opened in the browser (one of each kind: a guide with a table, the API reference, the landing page, a
#: page of the examples gallery), an anchor to open it at (none: its top), and the fewest typeset formulas it must
#: show; the formulas of every page are typeset on one page (:func:`test_every_formula_of_the_site_typesets`)
PAGES = [
    ("numerics.html", "", 20),
    ("api/operators.html", "", 20),
    ("flash-attention.html", "", 20),
    ("index.html", "", 3),
    ("auto_examples/plot_fenchel_young_classifier.html", "", 2),
]
#: where the site's server answers with the page of all formulas (it is not written into the shared build)
FORMULAS = "formulas-of-every-page.html"

#: LaTeX or the old plain-text formulas, which must not be visible outside typeset math
RAW_MATH = re.compile(r"\\(alpha|tau|theta|sum|frac|langle|lvert|operatorname|mathbb|\(|\[)|\$\$|_\+\^|\]_\+")
#: formulas written as inline code (``[x - τ]_+``, ``⟨p, x⟩``, ``Σ_j``) instead of math
CODE_MATH = re.compile(r"\]_\+|\^\{|⟨|Σ|‖")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the site, and the pages of ``extra`` (path: HTML) from memory, without logging every request."""

    def __init__(self, *args, extra=None, **kwargs):
        self.extra = extra or {}
        super().__init__(*args, **kwargs)

    def do_GET(self):
        body = self.extra.get(self.path)
        if body is None:
            return super().do_GET()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _site_pages(html):
    """Every page of the site but Sphinx's generated ones (index of names, search), relative to ``html``, parsed."""
    from bs4 import BeautifulSoup

    skip = {"genindex.html", "search.html", "py-modindex.html"}
    names = sorted(str(p.relative_to(html)) for p in html.rglob("*.html")
                   if p.name not in skip and not p.relative_to(html).parts[0].startswith("_"))
    return {name: BeautifulSoup((html / name).read_text(encoding="utf-8"), "html.parser") for name in names}


def _formulas_page(pages):
    """The landing page with its article replaced by every formula of every page, each in an element that names
    its page (a ``div``: a display formula is one): the same scripts and MathJax configuration as the site's pages."""
    import copy

    page = copy.copy(pages["index.html"])
    article = page.select_one("article") or page.body
    article.clear()
    for name, dom in pages.items():
        for math in dom.select(".math"):
            wrapper = page.new_tag("div", attrs={"data-page": name})  # (a <p> ends before a <div>)
            wrapper.append(copy.copy(math))
            article.append(wrapper)
    return str(page)


@pytest.fixture(scope="module")
def site(docs_build):
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium)")
    pytest.importorskip("bs4")  # installed with the docs theme (furo)
    html, returncode, stderr = docs_build
    if returncode != 0:
        pytest.fail("the documentation does not build (test_docs.py shows why):\n" + stderr[-2000:])
    pages = _site_pages(html)
    formulas = _formulas_page(pages).encode()
    handler = functools.partial(_QuietHandler, directory=str(html), extra={"/" + FORMULAS: formulas})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield html, f"http://127.0.0.1:{server.server_address[1]}/", pages
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


def _check_text(page, main, code=True):
    """No LaTeX or plain-text formula in the text outside math; no formula written as inline code (``code``)."""
    raw = sorted({m.group(0) for m in RAW_MATH.finditer(_visible_text(main))})
    assert not raw, f"{page}: LaTeX or plain-text formulas left as text: {raw}"
    if not code:
        return
    inline = sorted({c.get_text() for c in main.select("code") if c.find_parent("pre") is None
                     and CODE_MATH.search(c.get_text())})
    assert not inline, f"{page}: formulas shown as inline code: {inline}"


def _visible_text(element):
    """The text a reader sees, less math (typeset or not: the elements Sphinx marks as math are MathJax's only
    input) and code (code may hold backslashes and dollars)."""
    import copy

    element = copy.copy(element)
    for hidden in element.select(".math, mjx-container, script, style, pre, code, .headerlink"):
        hidden.decompose()
    return element.get_text(" ")


@pytest.mark.parametrize("page, anchor, min_math", PAGES, ids=[p for p, _, _ in PAGES])
def test_page_renders(site, page, anchor, min_math, tmp_path):
    from bs4 import BeautifulSoup

    html, base, _ = site
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
    _check_text(page, main)
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


def test_every_formula_of_the_site_typesets(site, tmp_path):
    """Every element that Sphinx marks as math, on every page, is typeset by MathJax with no parse error."""
    from bs4 import BeautifulSoup

    _, base, pages = site
    count = sum(len(dom.select(".math")) for dom in pages.values())
    assert count >= 500, count  # (the API reference alone holds hundreds)
    dom = BeautifulSoup(_chromium(base + FORMULAS, tmp_path, "--dump-dom"), "html.parser")
    article = dom.select_one("article") or dom.body
    formulas = article.select("div[data-page]")
    assert len(formulas) == count
    untyped = [(p["data-page"], p.get_text()[:120]) for p in formulas if not p.select("mjx-container")]
    assert not untyped, f"not typeset: {untyped[:10]}"
    failed = [(p["data-page"], p.get_text()[:120]) for p in formulas if p.select("mjx-merror")]
    assert not failed, f"formulas that failed to parse: {failed[:10]}"


#: the kernels' design notes, which write the sums a kernel computes in code, beside the kernels' own variable names
#: (`Σ s`, `⟨z, p⟩` and `zp`): formulas as inline code are allowed there, LaTeX left as text is not
CODE_NOTATION = {"fast-paths.html"}


def test_no_page_shows_latex_outside_math_or_formulas_as_code(site):
    """What MathJax leaves alone, on every page of the site: text outside math (no LaTeX source, no plain-text
    formula) and inline code (no formula, but on the pages of :data:`CODE_NOTATION`)."""
    _, _, pages = site
    assert {"index.html", "api/operators.html", "auto_examples/plot_sparse_vs_softmax.html"} <= set(pages)
    assert CODE_NOTATION <= set(pages)
    for page, dom in pages.items():
        _check_text(page, dom.select_one("article") or dom.body, code=page not in CODE_NOTATION)
