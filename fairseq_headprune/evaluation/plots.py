"""PNG figures made from the results files (never from in-memory state)."""

import json
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fairseq_headprune.heads.layout import TYPE_NAMES  # noqa: E402
from fairseq_headprune.io import atomic_path  # noqa: E402

CURVE_LABELS = {"all": "all types", **{k: f"{k}: {v}" for k, v in TYPE_NAMES.items()}}


def _save(fig, path):
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)


def bleu_figure():
    """A figure for BLEU against heads (the method tables draw their series on its axes)."""
    return plt.subplots(figsize=(6, 4))


def save_bleu_figure(fig, ax, path: str, xlabel: str):
    """Label a :func:`bleu_figure`, write it atomically as PNG, close it."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel("BLEU")
    ax.legend(fontsize=8)
    _save(fig, path)


def plot_sweep(results_json: str, png: str):
    """BLEU against the share of heads pruned, one line per curve."""
    with open(results_json, encoding="utf-8") as f:
        rows = json.load(f)["rows"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for curve in dict.fromkeys(r["curve"] for r in rows):
        pts = sorted((r["level"] * 100, r["bleu"]) for r in rows if r["curve"] == curve)
        ax.plot(*zip(*pts), marker="o", label=CURVE_LABELS.get(curve, curve))
    ax.set_xlabel("heads pruned (%)")
    ax.set_ylabel("BLEU (sacrebleu)")
    ax.set_title("BLEU vs. heads pruned (Michel et al. 2019 importance)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.text(0.01, -0.02, rows[0]["signature"] if rows else "", fontsize=6)
    _save(fig, png)


def plot_heatmap(importance_json: str, png: str):
    """Importance per layer and head, one panel per attention type; removed heads blank."""
    with open(importance_json, encoding="utf-8") as f:
        tables = json.load(f)["importance"]
    fig, axes = plt.subplots(1, len(tables), figsize=(4.8 * len(tables), 3.2), squeeze=False)
    for ax, (kind, rows) in zip(axes[0], tables.items()):
        grid = [[math.nan if v is None else v for v in row] for row in rows]
        image = ax.imshow(grid, cmap="viridis", aspect="auto")
        ax.set_title(f"{kind}: {TYPE_NAMES[kind]}", fontsize=9)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(len(grid[0])), [str(h + 1) for h in range(len(grid[0]))])
        ax.set_yticks(range(len(grid)), [str(layer + 1) for layer in range(len(grid))])
        fig.colorbar(image, ax=ax, fraction=0.046)
    fig.tight_layout()
    _save(fig, png)
