"""Show figures and library code in notebooks, the same way in JupyterLab and the static book.

plotly in a headless kernel emits only `application/vnd.plotly.v1+json`, which the static book
(myst-nb) skips: the figure silently disappears. `show(fig)` emits that mimetype for JupyterLab
*and* an HTML div for the book, whose id is derived from the figure's content so that
re-running a notebook gives byte-identical output (nbval, caching). The HTML loads no script
from a CDN: the book serves one local plotly.min.js, and JupyterLab renders the plotly mimetype.

`show_source(obj)` prints library code by reference, so notebooks never copy it.

What every figure shares, so that each one displays the same way:

- `time_unit(span)`: (label, scale) so a time axis reads 0-900 ms or 0-33 s, never
  "3.3e+04 ms"; every time axis in `pipelib.viz` goes through it. A schedule simulated with
  unit costs is in no clock's unit: `unit="units of F"` (or `Units("F", scale)`) labels it so,
  and `time_title(label)` reads "time (units of F)" where a clock's reads "time (ms)".
- `nice_cuts(span, n)`: the times a "play" slider stops at: round multiples of 1, 2 or 5, few
  enough that its labels stay apart at the figure's width.
- `rounder(span)`: rounds times to about five significant digits of the span, so a figure's
  JSON carries `12.5`, not `12.500000000000002` (the static book's pages stay small).
- `play_controls`: a play button and a slider. Nothing plays on its own: a figure shows its
  final state, and "play" replays its frames from the start in a few seconds in all
  (`frame_ms`), without transitions.

Introduced in chapter 04.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import math
from dataclasses import dataclass
from types import MappingProxyType

CONFIG = MappingProxyType({"displaylogo": False, "responsive": True})
UNITS = MappingProxyType({"s": ("s", 1.0), "ms": ("ms", 1e3), "us": ("µs", 1e6), "µs": ("µs", 1e6)})
PLAY_SECONDS = 4.0   # "play" takes about this long, whatever the number of frames
MAX_FRAME_MS = 1000  # ... but no frame stays longer than this


@dataclass(frozen=True)
class Units:
    """Abstract time units named `name` (e.g. "F", one forward): `scale` axis units per unit of
    the trace's times (1 when the costs were given in these units, 1/F when F is in seconds)."""

    name: str
    scale: float = 1.0


CLOCK_LABELS = frozenset({label for label, _ in UNITS.values()})
ABSTRACT_PREFIX = "units of "


def time_unit(span: float, unit: str | Units | None = None) -> tuple[str, float]:
    """(label, scale) of a time axis over `span` seconds: seconds * scale = axis units.

    µs below 1 ms, ms below 1 s, else s; `unit` ("s", "ms", "us" or "µs") forces one. Times
    that are not seconds (unit costs, chapter 13) take `unit="units of F"`, label "F" and
    scale 1, or `Units("F", scale)`.
    """
    if isinstance(unit, Units):
        return unit.name, float(unit.scale)
    if isinstance(unit, str) and unit.startswith(ABSTRACT_PREFIX) and unit[len(ABSTRACT_PREFIX):].strip():
        return unit[len(ABSTRACT_PREFIX):].strip(), 1.0
    if unit is not None:
        if unit not in UNITS:
            raise ValueError(f"unit={unit!r}; choose one of {sorted(UNITS)}, 'units of X' (abstract units "
                             f"named X, e.g. 'units of F'), Units(name, scale) or None (chosen from the span)")
        return UNITS[unit]
    return UNITS["s" if span >= 1 else "ms" if span >= 1e-3 else "us"]


def time_title(label: str) -> str:
    """The title of a time axis in `label` (from `time_unit`): "time (ms)", "time (units of F)"."""
    return f"time ({label})" if label in CLOCK_LABELS else f"time ({ABSTRACT_PREFIX}{label})"


def decimals(span: float, digits: int = 5) -> int:
    """Decimal places that keep `digits` significant digits of `span` (in axis units)."""
    return max(0, digits - 1 - math.floor(math.log10(span))) if span > 0 else digits


def rounder(span: float, digits: int = 5):
    """A function rounding axis values to `digits` significant digits of `span`; whole numbers
    come back as ints (JSON `12`, not `12.0`)."""
    places = decimals(span, digits)

    def rnd(v: float):
        r = round(v, places)
        return int(r) if float(r).is_integer() else r
    return rnd


def short_number(v: float, digits: int = 3) -> str:
    """`v` with `digits` significant digits and no exponent: 33.0, 0.125, 33,000."""
    if v == 0 or not math.isfinite(v):
        return f"{v:g}"
    return f"{v:,.{max(0, digits - 1 - math.floor(math.log10(abs(v))))}f}"


def frame_ms(n: int) -> int:
    """Milliseconds per frame so that `n` frames play in about PLAY_SECONDS."""
    return int(min(MAX_FRAME_MS, 1000 * PLAY_SECONDS / max(n, 1)))


def plain_number(v: float) -> str:
    """`v` as written by hand, never in exponent form: 0.00005, 2, 2.5 (a slider's labels)."""
    return f"{v:.12f}".rstrip("0").rstrip(".") if isinstance(v, float) else str(v)


def nice_cuts(span: float, n: int = 24, width_px: int = 560) -> list:
    """At most `n` times in (0, span] at round steps (1, 2 or 5 times a power of ten), then
    `span` itself: a "play" slider's stops, the last one the whole step. The step grows until
    every label fits in `width_px` (a slider's length at the book's width, ~7 px a character):
    24 labels like "1.38" crowd a slider (plotly then labels every other one, still unround)."""
    if not span > 0:
        return [0]
    k = math.floor(math.log10(span / max(n, 1)))
    for step in (m * 10.0 ** e for e in range(k, k + 20) for m in (1, 2, 5)):
        if step * max(n, 1) < span * (1 - 1e-9):
            continue
        rnd = rounder(step, 3)
        cuts = [rnd(step * i) for i in range(1, math.ceil(span / step - 1e-9))] + [rounder(span, 4)(span)]
        if len(cuts) * (7 * max(len(plain_number(c)) for c in cuts) + 14) <= width_px:
            return cuts
    return [span]


def play_controls(fig, frames: list[str], labels: list[str], prefix: str = "", suffix: str = "",
                  *, show_value: bool = True, y: float = 0.0) -> None:
    """A play button and a slider over the named `frames`; its steps read `labels`.

    The slider starts on the last frame (the figure's own data, its final state); "play" goes
    back to the first frame and plays them all, `frame_ms(len(frames))` each, no transition.
    """
    duration = frame_ms(len(frames))
    fig.update_layout(
        updatemenus=[dict(type="buttons", showactive=False, x=0, y=y, xanchor="left", yanchor="top",
                          pad=dict(t=45), buttons=[
            dict(label="▶ play", method="animate",
                 args=[None, dict(mode="immediate", fromcurrent=False,
                                  frame=dict(duration=duration, redraw=True), transition=dict(duration=0))]),
        ])],
        sliders=[dict(active=len(frames) - 1, x=0.12, len=0.88, y=y, yanchor="top", pad=dict(t=30),
                      currentvalue=dict(prefix=prefix, suffix=suffix, visible=show_value), steps=[
            dict(label=label, method="animate",
                 args=[[name], dict(mode="immediate", frame=dict(duration=0, redraw=True),
                                    transition=dict(duration=0))])
            for name, label in zip(frames, labels)])],
    )



def _stable_id(payload: str) -> str:
    return "fig-" + hashlib.sha1(payload.encode()).hexdigest()[:12]


def figure_bundle(fig) -> dict:
    """The mimebundle `show` displays: plotly's own JSON of the figure plus an HTML div.

    Both carry plotly's encoding (`plotly.io.to_json`), which writes numpy arrays as typed
    arrays; a generic `json.dumps(..., default=str)` turns them into strings and JupyterLab
    then piles every bar at t = 0. The div id is a hash of that JSON: the same figure gives
    byte-identical output. Nothing plays on its own (`auto_play=False`): an animated figure
    shows its final state until the reader presses play.
    """
    import plotly.io as pio

    payload = pio.to_json(fig, validate=False)
    div_id = _stable_id(payload)
    html = fig.to_html(include_plotlyjs=False, full_html=False, div_id=div_id, config=dict(CONFIG),
                       auto_play=False, validate=False)
    return {
        "application/vnd.plotly.v1+json": {**json.loads(payload), "config": dict(CONFIG)},
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
