"""BLEU at fixed head budgets, several methods on one checkpoint: the layout of DSP's figures
(Li et al. 2021: BLEU against the share of heads pruned, one curve per method).

Input: the rows of ``fairseq-headprune evaluate`` (one labelled ``unpruned``) and a manifest (TSV:
label, method, percent of heads kept, setting). Output: ``dsp.json`` and ``dsp.csv`` (our rows with
the sacrebleu signature, the published rows beside them), ``dsp.png``, and the Markdown table
that ``scripts/update_readme.py`` puts in the README (:func:`markdown`).

    python -m fairseq_headprune.evaluation.budget_table eval.json runs.tsv -o OUT
"""

import json
from typing import Dict, List

from fairseq_headprune.evaluation.head_table import join_rows, table_main

# DSP's own tables could not be read (METHODS_NOTES.md 3.9); the IWSLT14 de-en numbers available
# are Ni et al. (2023)'s re-runs at 30M parameters (their Table 2, METHODS_NOTES.md 4.7).
PAPER = [
    {"method": "unpruned", "params": "44M", "bleu": 34.4},
    {"method": "dsp", "params": "30M", "bleu": 33.2},
    {"method": "voita", "params": "30M", "bleu": 32.2},
]
SOURCE = ("IWSLT14 de-en, transformer base, as re-run by Ni et al. 2023 Table 2 "
          "(METHODS_NOTES.md 4.7; DSP's own tables not readable here)")
ORDER = ["dsp-joint", "dsp-ste", "dsp-pipelined", "dsp-pipelined-ft", "voita-top-k", "michel"]
NAMES = {"dsp-joint": "DSP joint", "dsp-ste": "DSP joint, STE",
         "dsp-pipelined": "DSP pipelined", "dsp-pipelined-ft": "DSP pipelined + fine-tune",
         "voita-top-k": "Voita, top-K gates", "michel": "Michel"}


def build_rows(evaluated: List[Dict], manifest: List[List[str]]) -> List[Dict]:
    """Join the manifest (label, method, percent kept or -, setting) with the evaluation rows."""
    rows = join_rows(evaluated, manifest, ["kept_percent", "setting"], [100, ""])
    for r in rows:
        r["kept_percent"] = None if r["kept_percent"] == "-" else float(r["kept_percent"])
    return rows


def plot(path: str, rows: List[Dict]):
    from fairseq_headprune.evaluation.plots import bleu_figure, save_bleu_figure

    fig, ax = bleu_figure()
    ax.axhline(rows[0]["bleu"], color="gray", lw=0.8, ls=":", label="unpruned")
    for r in rows:
        if r["method"] == "control":
            ax.axhline(r["bleu"], color="gray", lw=0.8, ls="--", label=r["setting"])
    for method in ORDER:
        points = sorted((100 - r["kept_percent"], r["bleu"]) for r in rows
                        if r["method"] == method)
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, "s--" if method == "michel" else "o-", label=NAMES[method])
    save_bleu_figure(fig, ax, path, "heads pruned (%)")


def markdown(path: str) -> str:
    """The README table of a ``dsp.json``: one row per budget, one column per method."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    rows = data["rows"]
    base = rows[0]
    methods = [m for m in ORDER if any(r["method"] == m for r in rows)]
    budgets = sorted({r["kept_percent"] for r in rows if r["method"] in methods}, reverse=True)
    total = sum(base["heads"].values())
    lines = ["| heads kept | " + " | ".join(NAMES[m] for m in methods) + " |",
             "|---|" + "---:|" * len(methods)]
    lines.append(f"| {total} (unpruned) | " + " | ".join(f"{base['bleu']:.2f}" for _ in methods)
                 + " |")
    for percent in budgets:
        cells, kept = [], ""
        for m in methods:
            r = next((r for r in rows if r["method"] == m and r["kept_percent"] == percent),
                     None)
            cells.append(f"{r['bleu']:.2f} ({r['delta']:+.2f})" if r else "")
            if r:
                kept = kept or sum(r["heads"].values())
        lines.append(f"| {kept} ({percent:g}%) | " + " | ".join(cells) + " |")
    for r in rows:
        if r["method"] == "control":
            lines.append(f"\nControl, {r['setting']}: {r['bleu']:.2f} ({r['delta']:+.2f}).")
    lines.append(f"\nBLEU on {base['sentences']} test sentences, sacrebleu `{base['signature']}`."
                 f"\n\nPublished ({data['paper_source']}):\n")
    lines.append("| method | parameters | BLEU |")
    lines.append("|---|---|---:|")
    for p in data["paper"]:
        lines.append(f"| {p['method']} | {p['params']} | {p['bleu']:.2f} |")
    return "\n".join(lines) + "\n"


def main():
    table_main(__doc__, "dsp", ("kept_percent", "setting"), build_rows, plot, markdown, PAPER,
               SOURCE)


if __name__ == "__main__":
    main()
