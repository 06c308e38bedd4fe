"""Figures of chapter 19: what a tokenizer changes.

`tokenizer_figure(rows)` sets the book's character tokenizer beside BPE tokenizers of growing
vocabularies, measured on the same held-out text (`pipelib.hf.tokenizer.compare_tokenizers`):
on the left, characters per token (how much shorter a sequence gets, and how much text a context
of T tokens holds); on the right, the share of the model's parameters in the token embedding and
the head (2 V C of them).

Pure layer: plotly only; the rows are duck-typed (name, vocab_size, chars_per_token,
embedding_share). Introduced in chapter 19.
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots


def tokenizer_figure(rows, title: str = "Characters against byte-pair encoding") -> go.Figure:
    """rows: one per tokenizer, measured on the same text; two bar charts side by side."""
    names = [f"{r.name}<br>V = {r.vocab_size:,}" for r in rows]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.14,
                        subplot_titles=("characters per token", "embedding + head, share of parameters"))
    fig.add_trace(go.Bar(x=names, y=[r.chars_per_token for r in rows], name="characters per token",
                         text=[f"{r.chars_per_token:.2f}" for r in rows], textposition="outside",
                         hovertemplate="%{x}: %{y:.2f} characters per token<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Bar(x=names, y=[100 * r.embedding_share for r in rows], name="embedding share",
                         text=[f"{100 * r.embedding_share:.0f} %" for r in rows], textposition="outside",
                         hovertemplate="%{x}: %{y:.1f} % of the parameters<extra></extra>"), row=1, col=2)
    top = max(r.chars_per_token for r in rows)
    fig.update_yaxes(title_text="characters per token", range=[0, 1.2 * top], row=1, col=1)
    fig.update_yaxes(title_text="% of parameters", range=[0, 110], row=1, col=2)
    fig.update_layout(title=title, showlegend=False, height=380, margin=dict(l=60, r=20, t=70, b=60))
    return fig
