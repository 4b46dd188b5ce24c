"""The lens figure of the report: what each layer predicts for the readout prompt, through the
Jacobian lens beside the logit lens (the ``readout`` table of ``depthlens lens --readout``)."""

from __future__ import annotations

import matplotlib
from matplotlib.figure import Figure

from ..runs.tables import RunTables
from .canvas import MAX_WIDTH, new_figure

__all__ = ["CAPTIONS", "READOUT_POSITIONS", "draw_lens_readout"]

#: What to look for in the figure (shown under it in the report).
CAPTIONS: dict[str, str] = {
    "lens_readout": (
        "What each layer predicts for the readout prompt: the most likely next token at every layer (rows) and "
        "position (columns), through the Jacobian lens (left: the final norm and unembedding of J_ℓ h_ℓ) and "
        "through the logit lens (right: of h_ℓ itself); colour is that token's probability, and the top row is "
        "the model's own output. Look for the layer from which the lens already reads the final answer, and "
        "how much earlier that is than in the logit lens."
    ),
}

#: Positions of the readout figure: the prompt's last ones.
READOUT_POSITIONS = 16


def draw_lens_readout(t: RunTables) -> Figure:
    """Top-1 prediction by layer and position, lens beside logit lens, coloured by probability."""
    df = t.table("readout")
    top = df[df["rank"] == 0]
    positions = sorted(top["position"].unique())[-READOUT_POSITIONS:]
    layers = sorted(top["layer"].unique())
    top = top[top["position"].isin(positions)]
    width = min(MAX_WIDTH, 2.0 + 1.1 * len(positions))
    fig = new_figure(width, 1.2 + 0.32 * len(layers) * 2)
    axes = fig.subplots(2, 1)
    cmap = matplotlib.colormaps["Blues"]
    for ax, kind, name in zip(axes, ("jacobian", "logit"), (r"Jacobian lens: $J_\ell\, h_\ell$", r"logit lens: $h_\ell$")):
        part = top[top["lens"] == kind]
        prob = part.pivot(index="layer", columns="position", values="prob").reindex(index=layers, columns=positions)
        word = part.pivot(index="layer", columns="position", values="prediction").reindex(index=layers,
                                                                                        columns=positions)
        ax.imshow(prob.to_numpy(dtype=float), cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto", origin="lower")
        for i in range(len(layers)):
            for j in range(len(positions)):
                p, w = prob.iat[i, j], word.iat[i, j]
                ax.text(j, i, _short(w), ha="center", va="center", fontsize=6,
                        color="white" if p > 0.6 else "black")
        inputs = top.drop_duplicates("position").set_index("position")["input_token"].reindex(positions)
        ax.set_xticks(range(len(positions)), [_short(w) for w in inputs], fontsize=6, rotation=45, ha="right")
        ax.set_yticks(range(len(layers)), [str(layer) for layer in layers], fontsize=6)
        ax.set_ylabel("layer ℓ", fontsize=8)
        ax.set_title(name, fontsize=9)
    axes[-1].set_xlabel("input token (the prediction is of the token after it)", fontsize=8)
    return fig


def _short(token: object, n: int = 8) -> str:
    """A token as a short, printable label (whitespace shown, long tokens cut)."""
    text = str(token).replace("\n", "⏎").replace("$", "\\$")
    text = "".join(ch if ch.isprintable() else "·" for ch in text)
    return text if len(text) <= n else text[: n - 1] + "…"
