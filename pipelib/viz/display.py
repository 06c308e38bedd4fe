"""Show figures and library code in notebooks, the same way in JupyterLab and the static book.

plotly in a headless kernel emits only `application/vnd.plotly.v1+json`, which the static book
(myst-nb) skips: the figure silently disappears. `show(fig)` emits that mimetype for JupyterLab
*and* an HTML div for the book, whose id is derived from the figure's content so that
re-running a notebook gives byte-identical output (nbval, caching). The HTML loads no script
from a CDN: the book serves one local plotly.min.js, and JupyterLab renders the plotly mimetype.

`show_source(obj)` prints library code by reference, so notebooks never copy it.

Introduced in chapter 04.
"""
from __future__ import annotations

import hashlib
import inspect
import json


def _stable_id(payload: str) -> str:
    return "fig-" + hashlib.sha1(payload.encode()).hexdigest()[:12]


def figure_bundle(fig) -> dict:
    """The mimebundle `show` displays: plotly JSON plus a deterministic HTML div."""
    spec = fig.to_plotly_json()
    payload = json.dumps(spec, sort_keys=True, default=str)
    div_id = _stable_id(payload)
    html = fig.to_html(
        include_plotlyjs=False, full_html=False, div_id=div_id,
        config={"displaylogo": False, "responsive": True},
    )
    return {
        "application/vnd.plotly.v1+json": json.loads(payload),
        "text/html": html,
        "text/plain": f"<plotly figure {div_id}>",
    }


def show(fig) -> None:
    """Display a plotly figure so it renders in JupyterLab and in the static book."""
    from IPython.display import display

    display(figure_bundle(fig), raw=True)


def show_source(obj) -> None:
    """Show the source of a pipelib function or class with syntax highlighting."""
    from IPython.display import Markdown, display

    src = inspect.getsource(obj)
    module = getattr(inspect.getmodule(obj), "__name__", "?")
    display(Markdown(f"`{module}.{obj.__qualname__}`\n\n```python\n{src}```"))
