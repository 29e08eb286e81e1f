"""Ni et al. (2023)'s Table 1 layout on one checkpoint: parameters, BLEU and decoding speed of
the vanilla model, GHT (trained with the group constraint) and GHT-PS (GHT, Voting-to-Stay, heads
removed, fine-tuned), with the Table 3 ablation "w/o GC" (voting on the vanilla model).

Input: the rows of ``fairseq-headprune evaluate`` (one labelled ``unpruned``), a manifest (TSV:
label, method, setting) and ``fairseq-headprune bench`` of vanilla (``full``) against GHT-PS
(``pruned``). Output: ``gha.json``, ``gha.csv``, ``gha.png`` and the Markdown table that
``scripts/update_readme.py`` puts in the README (:func:`markdown`).

    python -m fairseq_headprune.evaluation.gha_table eval.json runs.tsv --bench bench.json -o OUT
"""

import json
from typing import Dict, List

from fairseq_headprune.evaluation.bench import figure, rounds_note
from fairseq_headprune.evaluation.head_table import join_rows, table_main

# Ni et al. 2023 Table 1, IWSLT14 de-en column (METHODS_NOTES.md 4.7): parameters without
# embeddings, sentences/s (beam 5, batch 256, decoding length 10, one RTX A6000).
PAPER = [
    {"method": "vanilla", "params": "44M", "sentences_per_s": 1012.1, "bleu": 34.4},
    {"method": "ght", "params": "44M", "sentences_per_s": 1016.4, "bleu": 35.4},
    {"method": "ght-ps", "params": "30M", "sentences_per_s": 1122.1, "bleu": 35.2},
    {"method": "ght-ps-no-gc", "params": "30M", "sentences_per_s": None, "bleu": 34.0},
]
SOURCE = ("Ni et al. 2023 Table 1 and (w/o GC) Table 3, IWSLT14 de-en, transformer base, "
          "C = 2 (METHODS_NOTES.md 4.7)")
NAMES = {"unpruned": "demo model (start)", "vanilla": "vanilla", "ght": "GHT",
         "ght-ps": "GHT-PS", "ght-ps-no-gc": "GHT-PS w/o GC"}
SPEED = {"vanilla": "full", "ght-ps": "pruned"}  # bench.json entry of each timed method


def build_rows(evaluated: List[Dict], manifest: List[List[str]], bench: Dict) -> List[Dict]:
    """Join the manifest (label, method, setting) with the evaluation rows and the parameter
    counts and speeds of ``bench`` (at its one batch size)."""
    params = {r["label"]: r["params"] for r in evaluated}
    rows = join_rows(evaluated, manifest, ["setting"], [""])
    timing = bench["rows"][0]
    for r in rows:
        r["params"] = params[r["label"]]
        side = SPEED.get(r["method"])
        r["sentences_per_s"] = figure(timing[side]["sentences_per_s"]) if side else None
        r["bench"] = ({"batch_size": timing["batch_size"], "beam": bench["beam"],
                       "device": bench["device"], "fixed_length": bench["fixed_length"],
                       "rounds": rounds_note(bench)}
                      if side else None)
    return rows


def plot(path: str, rows: List[Dict]):
    from fairseq_headprune.evaluation.plots import bleu_figure, save_bleu_figure

    fig, ax = bleu_figure()
    for r in rows:
        ax.plot([r["params"] / 1e6], [r["bleu"]], "o", label=NAMES.get(r["method"], r["method"]))
    save_bleu_figure(fig, ax, path, "parameters (M)")


def markdown(path: str) -> str:
    """The README table of a ``gha.json``, ours beside the paper's."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    rows = data["rows"]
    base = rows[0]
    paper = {p["method"]: p for p in data["paper"]}
    lines = ["| model | setting | heads | parameters | BLEU (diff.) | sent/s | paper: params, "
             "BLEU, sent/s |", "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        speed = f"{r['sentences_per_s']:.1f}" if r["sentences_per_s"] else ""
        p = paper.get(r["method"])
        published = (f"{p['params']}, {p['bleu']:.1f}, " + (f"{p['sentences_per_s']:.1f}" if
                     p["sentences_per_s"] else "-")) if p else ""
        lines.append(f"| {NAMES.get(r['method'], r['method'])} | {r['setting']} | "
                     f"{sum(r['heads'].values())} | {r['params']:,} | {r['bleu']:.2f} "
                     f"({r['delta']:+.2f}) | {speed} | {published} |")
    timed = next((r["bench"] for r in rows if r.get("bench")), None)
    lines.append(f"\nBLEU on {base['sentences']} test sentences, sacrebleu `{base['signature']}`.")
    if timed:
        lines.append(f"Speed: `fairseq-headprune bench`, {timed['device']}, beam {timed['beam']}, "
                     f"batch {timed['batch_size']}, every hypothesis forced to "
                     f"{timed['fixed_length']} tokens, "
                     f"{timed.get('rounds', 'fastest of interleaved rounds')}; GHT has "
                     f"vanilla's layers (not timed). Paper: {data['paper_source']}.")
    return "\n".join(lines) + "\n"


def main():
    table_main(__doc__, "gha", ("setting",), build_rows, plot, markdown, PAPER, SOURCE,
               inputs={"bench": "JSON of 'fairseq-headprune bench' (vanilla against GHT-PS)"})


if __name__ == "__main__":
    main()
