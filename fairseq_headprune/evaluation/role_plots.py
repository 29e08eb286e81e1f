"""Figures of ``analyze``, made from ``roles.json`` (never from in-memory state): a heatmap per
measure (one panel per attention type, layers x heads, removed heads blank) and the pruning
overlay (Voita et al. 2019, Fig. 8 style: which heads survive each method, coloured by role)."""

import json
import math
import os
from typing import Dict, List

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

from fairseq_headprune.evaluation.plots import _save  # noqa: E402
from fairseq_headprune.heads.layout import ATTENTION_TYPES, TYPE_NAMES  # noqa: E402

TITLES = {
    "confidence": "confidence (mean maximum attention weight)",
    "relevance": "LRP relevance (share of its layer)",
    "positional_share": "positional: share of tokens at offset -1 / +1",
    "rare_share": "rare-word: share of tokens on the rarest token",
    "syntactic_accuracy": "syntactic: accuracy at the best relation",
    "syntactic_margin": "syntactic: accuracy above the positional baseline",
    "importance": "Michel et al. importance",
}
ROLE_COLOURS = {"positional": "tab:blue", "syntactic": "tab:green", "rare": "tab:orange",
                "several": "tab:purple", "other": "0.55"}


def _grid(rows) -> List[List[float]]:
    return [[math.nan if v is None else v for v in row] for row in rows]


def _axes_labels(ax, n_layers, n_heads):
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(n_heads), [str(h + 1) for h in range(n_heads)])
    ax.set_yticks(range(n_layers), [str(layer + 1) for layer in range(n_layers)])


def plot_measure(tables: Dict[str, list], title: str, png: str):
    """One heatmap per attention type of one measure; cells show the value."""
    kinds = [k for k in ATTENTION_TYPES if k in tables]
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.4 * len(kinds), 3.2), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        grid = _grid(tables[kind])
        image = ax.imshow(grid, cmap="viridis", aspect="auto")
        for layer, row in enumerate(grid):
            for head, v in enumerate(row):
                if not math.isnan(v) and len(row) <= 16:
                    ax.text(head, layer, f"{v:.2f}", ha="center", va="center", fontsize=6,
                            color="white" if image.norm(v) < 0.5 else "black")
        ax.set_title(f"{kind}: {TYPE_NAMES[kind]}", fontsize=9)
        _axes_labels(ax, len(grid), len(grid[0]))
        fig.colorbar(image, ax=ax, fraction=0.046)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    _save(fig, png)


def plot_measures(roles_json: str, out_dir: str) -> List[str]:
    """``<measure>.png`` in ``out_dir`` for every numeric measure of ``roles.json``."""
    with open(roles_json, encoding="utf-8") as f:
        result = json.load(f)
    written = []
    for name, title in TITLES.items():
        tables = result["measures"].get(name)
        if tables and any(v is not None for rows in tables.values() for row in rows for v in row):
            png = os.path.join(out_dir, f"{name}.png")
            plot_measure(tables, title, png)
            written.append(png)
    return written


def role_of(roles) -> str:
    if not roles:
        return "other"
    return roles[0] if len(roles) == 1 else "several"


def plot_overlay(roles_json: str, png: str):
    """One row per method of ``roles.json``'s ``overlay``, one panel per attention type: every
    head of the analysed model coloured by its role, solid where the method keeps it, faint
    and crossed where it prunes it; heads absent from the analysed model are blank."""
    with open(roles_json, encoding="utf-8") as f:
        result = json.load(f)
    overlay = result["overlay"]["methods"]
    kinds = [k for k in ATTENTION_TYPES if k in result["roles"]]
    layers = max(len(result["roles"][k]) for k in kinds)
    heads = max(len(result["roles"][k][0]) for k in kinds)
    fig, axes = plt.subplots(len(overlay), len(kinds), squeeze=False,
                             figsize=(0.8 + (0.35 * heads + 0.6) * len(kinds),
                                      1.2 + (0.35 * layers + 0.8) * len(overlay)))
    for row, (name, method) in enumerate(overlay.items()):
        for col, kind in enumerate(kinds):
            ax = axes[row][col]
            roles = result["roles"][kind]
            kept = method["kept"].get(kind, [[] for _ in roles])
            for layer, heads in enumerate(roles):
                for head, mine in enumerate(heads):
                    if mine is None:
                        continue
                    survives = head in kept[layer]
                    colour = ROLE_COLOURS[role_of(mine)]
                    ax.add_patch(Rectangle((head - 0.45, layer - 0.45), 0.9, 0.9, color=colour,
                                           alpha=1.0 if survives else 0.18))
                    if not survives:
                        ax.plot([head - 0.3, head + 0.3], [layer - 0.3, layer + 0.3],
                                color="0.3", lw=0.8)
            ax.set_aspect("equal")
            ax.set_xlim(-0.5, len(roles[0]) - 0.5)
            ax.set_ylim(len(roles) - 0.5, -0.5)
            _axes_labels(ax, len(roles), len(roles[0]))
            ax.set_title(f"{name}, {kind}: {method['counts'].get(kind, 0)} kept", fontsize=8)
    handles = [Patch(color=c, label=r) for r, c in ROLE_COLOURS.items()]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8,
               bbox_to_anchor=(0.5, -0.02))
    fig.suptitle("heads kept by each method (solid) and pruned (faint, crossed), by role",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    _save(fig, png)
