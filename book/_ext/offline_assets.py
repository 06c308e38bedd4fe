"""Sphinx extension: the static book loads every script, stylesheet and font from its own files.

tools/book_assets.sh puts plotly.min.js, require.js, the ipywidgets embed bundle and MathJax 3 in
book/_vendor/static/, which _config.yml lists in `html_static_path` (copied to `_static/`) and
points `mathjax_path` and `nb_ipywidgets_js` at. This extension does the rest:

- adds `_static/plotly.min.js` to the pages that hold a figure made by `pipelib.viz.display.show`
  (a `plotly-graph-div` whose inline script calls `Plotly.newPlot` as soon as it is parsed), as a
  plain blocking script in <head>, so `window.Plotly` exists before the body runs. Priority 100
  puts it ahead of require.js (myst-nb, 500): plotly.js 4 sets `window.Plotly` itself and does
  not call `define`, but an older bundle loaded after require.js would register as an anonymous
  AMD module instead and leave `Plotly` undefined;
- stops the build (a clear error) when the vendored files are missing;
- warns (an error under `-W`) when a page would load a script or stylesheet from another host,
  whatever added it: a theme, an extension, a notebook output;
- keeps each page script once and drops sphinx-thebe's (thebe is off; its inline `const`
  configuration was on every page twice, a SyntaxError), and the widget state and scripts of a
  page that shows no widget (`_clean_scripts`);
- replaces myst-nb's "skipping unknown output mime type" warning, which fires for every figure
  `show` displays (its bundle carries the plotly mimetype for JupyterLab beside the HTML the book
  uses), by a precise one: an output warns when it holds a mimetype myst-nb cannot render, unless
  it is the plotly mimetype next to a `plotly-graph-div` HTML rendering. A bare `fig.show()` or
  `fig` (plotly mimetype alone: the figure would silently vanish from the book) still fails the
  build, with a message that says to use `pipelib.viz.display.show(fig)`.

It never globs `_static`: Jupyter Book 1 adds every .js under a root `_static/` folder to every
page, which with MathJax's component files means hundreds of scripts. Keep the book without a
root `_static/` folder.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from sphinx.util import logging

logger = logging.getLogger(__name__)

REQUIRED = (
    "plotly.min.js", "require.js", "embed-amd.js", "widgets-require-config.js",
    "mathjax/tex-chtml.js", "jupyter-widgets/html-manager/dist",
)
PLOTLY_JS = "plotly.min.js"
FIGURE_MARKER = "plotly-graph-div"
# <script ... src="http..."> and <link ... href="http..."> (also protocol-relative //host/...)
_OUTSIDE = re.compile(
    r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)\s*=\s*[\"']?(?:https?:)?//", re.I
)


def _check_assets(app: Sphinx, config) -> None:
    confdir = Path(app.confdir)
    for name in REQUIRED:
        if not any((confdir / d / name).exists() for d in config.html_static_path):
            raise ExtensionError(
                f"offline book asset {name!r} not found in html_static_path "
                f"{list(config.html_static_path)} (relative to {confdir}). "
                "Run tools/book_assets.sh (`make book` does) to fetch it."
            )


def _add_plotly(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    if app.builder.format == "html" and FIGURE_MARKER in context.get("body", ""):
        app.add_js_file(PLOTLY_JS, priority=100)


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def _script_key(asset) -> tuple:
    attrs = getattr(asset, "attributes", {}) or {}
    return str(getattr(asset, "filename", asset) or ""), tuple(sorted(attrs.items()))


def _clean_scripts(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    """Each script once, and none of sphinx-thebe's.

    Jupyter Book 1 always loads sphinx-thebe, which registers its configuration as an inline
    script, `const THEBE_JS_URL = "https://unpkg.com/..."; const thebe_selector = ...`, with
    `app.add_js_file(None, body=...)` from `env-before-read-docs`: Sphinx puts it in the
    extension registry and in the HTML builder; when the builder (re)reads the registry it adds
    the same script as filename `''`, and its duplicate check compares filenames (None != ''),
    so every page got the inline script twice (sphinx-togglebutton's `var togglebuttonSelector`
    too). `var` may be declared twice; `const` may not: every page threw "Identifier
    'THEBE_JS_URL' has already been declared". Thebe is off (`launch_buttons.thebe: false`) and would load from a CDN
    anyway, so its two scripts are dropped; any other exact duplicate is kept once.

    A page that shows no widget view also loses the widget state and the widget scripts.
    """
    if app.builder.format != "html" or "script_files" not in context:
        return
    # A page whose widget views are all hidden (`remove-output`: a live control that cannot
    # compute in a static page) still carries the executed notebook's widget state, every
    # model with the figures inside it, and the widget manager that would render none of it.
    no_views = WIDGET_VIEW not in context.get("body", "")
    # as the builder names them: Sphinx prefixes a local script with _static/
    widget_js = ({f"_static/{f}" for f in app.config.nb_ipywidgets_js}
                 | set(app.config.nb_ipywidgets_js)) if no_views else set()
    seen, kept = set(), []
    for asset in context["script_files"]:
        key = _script_key(asset)
        attrs = dict(key[1])
        body = str(attrs.get("body", ""))
        if key in seen or "THEBE_JS_URL" in body or key[0].endswith("sphinx-thebe.js"):
            continue
        if no_views and (attrs.get("type") == WIDGET_STATE or key[0] in widget_js):
            continue
        seen.add(key)
        kept.append(asset)
    context["script_files"][:] = kept


def _forbid_outside(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    if app.builder.format != "html":
        return
    outside = [
        getattr(asset, "filename", asset)
        for key in ("script_files", "css_files")
        for asset in context.get(key, [])
        if "//" in str(getattr(asset, "filename", asset))
    ]
    outside += [m.group(0) for m in _OUTSIDE.finditer(context.get("body", ""))]
    for item in outside:
        logger.warning(
            f"page {pagename!r} would load {item!r} from another host; the book must work "
            "offline: vendor the file in tools/book_assets.sh",
            type="offline_assets",
            location=pagename,
        )


PLOTLY_MIME = "application/vnd.plotly.v1+json"
# what myst-nb's NbElementRenderer.render_mime_type renders (myst-nb 1.x)
RENDERED_MIME = {
    "text/plain", "text/html", "text/latex", "text/markdown", "application/javascript",
    "image/png", "image/jpeg", "image/svg+xml", "image/gif", "application/pdf",
    "application/vnd.jupyter.widget-view+json",
}


def _own_mime_warning(app: Sphinx, config) -> None:
    config.suppress_warnings = [*config.suppress_warnings, "mystnb.unknown_mime_type"]


def _check_outputs(app: Sphinx, doctree) -> None:
    """Warn about notebook outputs the book would drop (see the module docstring)."""
    docname = app.env.docname
    if not str(app.env.doc2path(docname)).endswith(".ipynb"):
        return
    executed = Path(app.outdir).parent / "jupyter_execute" / f"{docname}.ipynb"
    if not executed.is_file():
        return
    notebook = json.loads(executed.read_text(encoding="utf8"))
    for cell_index, cell in enumerate(notebook.get("cells", [])):
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            for mime in data:
                if mime in RENDERED_MIME:
                    continue
                html = data.get("text/html", "")
                html = "".join(html) if isinstance(html, list) else html
                if mime == PLOTLY_MIME and FIGURE_MARKER in html:
                    continue
                hint = (
                    "a plotly figure shown with fig.show() or as a cell's value is not drawn "
                    "in the static book: display it with pipelib.viz.display.show(fig)"
                    if mime == PLOTLY_MIME else "the static book skips this output"
                )
                logger.warning(
                    f"cell {cell_index} of {docname}: output mime type {mime!r}: {hint}",
                    type="offline_assets",
                    location=docname,
                )


def setup(app: Sphinx) -> dict:
    app.connect("config-inited", _check_assets)
    app.connect("config-inited", _own_mime_warning)
    app.connect("doctree-read", _check_outputs)
    app.connect("html-page-context", _add_plotly)
    app.connect("html-page-context", _clean_scripts, priority=800)
    # late, to see what other extensions (myst-nb's widget scripts, mathjax) added to the page
    app.connect("html-page-context", _forbid_outside, priority=900)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
