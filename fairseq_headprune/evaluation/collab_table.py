"""Cordonnier et al. (2020)'s translation-table layout on one checkpoint: BLEU against the shared
key size D~k of collaborative attention, without retraining and after a short fine-tune, per
attention type and for all types, with parameters, the CP reconstruction error and decoding speed.

Input: the rows of ``fairseq-headprune evaluate`` (one labelled ``unpruned``), a manifest (TSV:
label, method ``collab`` / ``collab-ft`` / ``control``, types, key size, fine-tuning updates), the
folder of ``collab --report`` files (``LABEL.json``) and the folder of ``bench`` files
(``LABEL.json``: the original against that model). Output: ``collab.json``, ``collab.csv``,
``collab.png`` and the Markdown that ``scripts/update_readme.py`` puts in the README.

    python -m fairseq_headprune.evaluation.collab_table eval.json runs.tsv --bench BENCH_DIR \\
        --reports REPORT_DIR -o OUT
"""

import json
from typing import Dict, List

from fairseq_headprune.evaluation.bench import figure, rounds_note
from fairseq_headprune.evaluation.head_table import join_rows, table_main

# collab-nmt-old nmt/README.md, the paper's NMT table (METHODS_NOTES.md 5.5): WMT17 en-de,
# 16 heads, 1024 dimensions; "concatenated" shrinks each head, "collaborative" shares keys.
PAPER = [
    {"key_dim": 1024, "share": "1", "concatenated": 27.8, "collaborative": None},
    {"key_dim": 256, "share": "1/4", "concatenated": 27.7, "collaborative": 27.8},
    {"key_dim": 128, "share": "1/8", "concatenated": 27.4, "collaborative": 27.8},
    {"key_dim": 64, "share": "1/16", "concatenated": 26.6, "collaborative": 27.3},
    {"key_dim": 32, "share": "1/32", "concatenated": 25.5, "collaborative": 27.1},
]
SOURCE = ("Cordonnier et al. 2020, NMT table (collab-nmt-old nmt/README.md), WMT17 en-de, "
          "trained from scratch (METHODS_NOTES.md 5.5)")
COLUMNS = ("types", "key_dim", "updates")


def build_rows(evaluated: List[Dict], manifest: List[List[str]], bench: Dict,
               reports: Dict) -> List[Dict]:
    """Join the manifest with the evaluation rows, each model's parameters and decoding speed,
    its mean CP reconstruction error (from its ``collab --report``; the fine-tuned model's is
    its starting point's) and, where one exists, its ``bench`` against the original."""
    by_label = {r["label"]: r for r in evaluated}
    rows = join_rows(evaluated, manifest, list(COLUMNS), ["", "", ""])
    for r in rows:
        e = by_label[r["label"]]
        r.update(params=e["params"], sentences_per_s=e.get("sentences_per_s"))
        report = reports.get(r["label"].removesuffix("-ft"))
        r["cp_error"] = (round(sum(m["error"] for m in report["modules"])
                               / len(report["modules"]), 4) if report else None)
        b = bench.get(r["label"])
        r["bench"] = None if b is None else {
            "device": b["device"], "beam": b["beam"], "rounds": rounds_note(b), "fixed_length": b["fixed_length"],
            "kv_cache_ratio": b["kv_cache_ratio"], "ideal_speedup": b["ideal_speedup"],
            "rows": [{"batch_size": x["batch_size"],
                      "original_tokens_per_s": figure(x["full"]["tokens_per_s"]),
                      "tokens_per_s": figure(x["pruned"]["tokens_per_s"]),
                      "speedup": figure(x["speedup"])}
                     for x in b["rows"]]}
    return rows


def plot(path: str, rows: List[Dict]):
    from fairseq_headprune.evaluation.plots import bleu_figure, save_bleu_figure

    fig, ax = bleu_figure()
    ax.axhline(rows[0]["bleu"], color="gray", lw=0.8, ls=":", label="original")
    series: Dict[str, List] = {}
    for r in rows[1:]:
        if r["method"] == "control":
            ax.axhline(r["bleu"], color="gray", lw=0.8, ls="--", label="original, fine-tuned")
            continue
        name = f"{r['types']}" + (", fine-tuned" if r["method"] == "collab-ft" else "")
        series.setdefault(name, []).append((int(r["key_dim"]), r["bleu"]))
    for name, points in sorted(series.items()):
        xs, ys = zip(*sorted(points))
        ax.plot(xs, ys, "o--" if "fine-tuned" in name else "o-", label=name)
    ax.set_xscale("log", base=2)
    save_bleu_figure(fig, ax, path, "shared key size D~k")


def markdown(path: str) -> str:
    """The README tables of a ``collab.json``: BLEU per types and key size, the speed of the
    all-types models, and the paper's table."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    rows = data["rows"]
    base = rows[0]
    tuned = {(r["types"], r["key_dim"]): r for r in rows if r["method"] == "collab-ft"}
    control = next((r for r in rows if r["method"] == "control"), None)
    lines = ["| types | D~k | parameters | CP error | BLEU, no retraining (diff.) | "
             "BLEU, fine-tuned (diff. to control) | sent/s |",
             "|---|---:|---:|---:|---:|---:|---:|",
             f"| - | {'original'} | {base['params']:,} | | {base['bleu']:.2f} | | "
             f"{base['sentences_per_s'] or ''} |"]
    for r in rows:
        if r["method"] != "collab":
            continue
        t = tuned.get((r["types"], r["key_dim"]))
        after = (f"{t['bleu']:.2f} ({t['bleu'] - control['bleu']:+.2f})"
                 if t and control else "")
        lines.append(f"| {r['types']} | {r['key_dim']} | {r['params']:,} | {r['cp_error']:.3f} | "
                     f"{r['bleu']:.2f} ({r['delta']:+.2f}) | {after} | "
                     f"{r['sentences_per_s'] or ''} |")
    lines.append(f"\nBLEU on {base['sentences']} test sentences, sacrebleu `{base['signature']}`; "
                 f"CP error: mean over the re-parametrised modules of the relative Frobenius "
                 f"error of the query-key tensor; sent/s: the BLEU decoding itself (free "
                 f"lengths, batches of 4000 tokens).")
    if control:
        lines.append(f"Control: the original fine-tuned the same {control['updates']} updates, "
                     f"{control['bleu']:.2f} BLEU.")
    timed = [r for r in rows if r.get("bench")]
    if timed:
        b0 = timed[0]["bench"]
        lines += ["", f"Decoding speed (`fairseq-headprune bench`, {b0['device']}, beam "
                      f"{b0['beam']}, every hypothesis forced to {b0['fixed_length']} tokens, "
                      f"{b0.get('rounds', 'fastest of interleaved rounds')}), original against collaborative E,D,A:", "",
                  "| D~k | batch | original tok/s | collaborative tok/s | speedup | KV cache "
                  "ratio | MAC ratio (ideal speedup) |", "|---:|---:|---:|---:|---:|---:|---:|"]
        for r in timed:
            for x in r["bench"]["rows"]:
                lines.append(f"| {r['key_dim']} | {x['batch_size']} | "
                             f"{x['original_tokens_per_s']:.1f} | {x['tokens_per_s']:.1f} | "
                             f"{x['speedup']:.3f}x | {r['bench']['kv_cache_ratio']:.3f} | "
                             f"{r['bench']['ideal_speedup']:.3f}x |")
    lines += ["", f"The paper ({data['paper_source']}):", "",
              "| D_k | share of full | concatenated | collaborative |", "|---:|---:|---:|---:|"]
    for p in data["paper"]:
        collab = f"{p['collaborative']:.1f}" if p["collaborative"] else "-"
        lines.append(f"| {p['key_dim']} | {p['share']} | {p['concatenated']:.1f} | {collab} |")
    return "\n".join(lines) + "\n"


def main():
    table_main(__doc__, "collab", COLUMNS, build_rows, plot, markdown, PAPER, SOURCE,
               inputs={"bench": "folder of 'fairseq-headprune bench' JSON files, LABEL.json",
                       "reports": "folder of 'fairseq-headprune collab --report' files"})


if __name__ == "__main__":
    main()
