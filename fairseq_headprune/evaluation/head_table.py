"""BLEU against heads kept per type: a learned-gate method beside Michel et al. at the same counts.

Input: the rows of ``fairseq-headprune evaluate`` (one must be labelled ``unpruned``) and a
manifest (TSV: label, method, gated types, setting) naming what each checkpoint is. Output:
``voita.json`` and ``voita.csv`` (our rows with the sacrebleu signature, and the paper's rows
beside them), ``voita.png`` (BLEU against heads kept, one series per method and gated types), and
the Markdown table that ``scripts/update_readme.py`` puts in the README (:func:`markdown`).

    python -m fairseq_headprune.evaluation.head_table eval.json runs.tsv -o OUT
"""

import argparse
import csv
import io
import json
import os
from typing import Dict, List

from fairseq_headprune.io import write_json, write_text

# Voita et al. (2019), WMT EN-RU transformer-base (6+6 layers, 8 heads: 48 per type), BLEU with
# the heads kept per type after L0 fine-tuning of all three types (paper, via METHODS_NOTES.md
# 2.7; not re-verified against the PDF). The encoder-only result: 10 of 48 heads, -0.15 BLEU.
PAPER = [
    {"types": "EDA", "heads": {"E": 48, "D": 48, "A": 48}, "bleu": 29.6},
    {"types": "EDA", "heads": {"E": 14, "D": 31, "A": 30}, "bleu": 29.62},
    {"types": "EDA", "heads": {"E": 12, "D": 21, "A": 25}, "bleu": 29.36},
    {"types": "EDA", "heads": {"E": 8, "D": 13, "A": 15}, "bleu": 29.06},
    {"types": "EDA", "heads": {"E": 5, "D": 9, "A": 12}, "bleu": 28.90},
    {"types": "E", "heads": {"E": 10, "D": 48, "A": 48}, "delta": -0.15},
]
SOURCE = "Voita et al. 2019, WMT EN-RU base (METHODS_NOTES.md 2.7, not re-verified)"


def join_rows(evaluated: List[Dict], manifest: List[List[str]], columns: List[str],
              base_values: List) -> List[Dict]:
    """Join a manifest (TSV rows: label, then ``columns``) with the evaluation rows: one row per
    label with its heads, BLEU, difference to ``unpruned`` (first row, ``base_values``) and
    sacrebleu signature."""
    by_label = {r["label"]: r for r in evaluated}
    base = by_label["unpruned"]
    rows = []
    for label, *values in [["unpruned", "unpruned", *base_values]] + manifest:
        r = by_label[label]
        rows.append({"label": label, **dict(zip(["method", *columns], values)),
                     "heads": r["heads"], "bleu": r["bleu"],
                     "delta": round(r["bleu"] - base["bleu"], 2), "signature": r["signature"],
                     "sentences": r["sentences"]})
    return rows


def build_rows(evaluated: List[Dict], manifest: List[List[str]]) -> List[Dict]:
    """Join the manifest (label, method, types, setting) with the evaluation rows."""
    return join_rows(evaluated, manifest, ["types", "setting"], ["", ""])


def write_csv(path: str, rows: List[Dict], columns=("types", "setting")):
    """One line per row: label, method, ``columns``, heads kept per type, BLEU, signature."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["label", "method", *columns, "E", "D", "A", "bleu", "delta", "signature"])
    for r in rows:
        writer.writerow([r["label"], r["method"], *(r[c] for c in columns),
                         *(r["heads"].get(k, "") for k in "EDA"), r["bleu"], r["delta"],
                         r["signature"]])
    write_text(path, buf.getvalue())


def plot(path: str, rows: List[Dict]):
    from fairseq_headprune.evaluation.plots import bleu_figure, save_bleu_figure

    fig, ax = bleu_figure()
    base = rows[0]
    ax.axhline(base["bleu"], color="gray", lw=0.8, ls=":", label="unpruned")
    series: Dict[str, List] = {}
    for r in rows[1:]:
        if r["method"] == "control":
            ax.axhline(r["bleu"], color="gray", lw=0.8, ls="--", label=r["setting"])
            continue
        series.setdefault(f"{r['method']} ({r['types']})", []).append(
            (sum(r["heads"].values()), r["bleu"]))
    for name, points in sorted(series.items()):
        xs, ys = zip(*sorted(points))
        ax.plot(xs, ys, "o-" if "michel" not in name else "s--", label=name)
    save_bleu_figure(fig, ax, path, "heads kept (all types)")


def markdown(path: str) -> str:
    """The README table of a ``voita.json``."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    rows = data["rows"]
    michel = {r["setting"].replace("same heads as ", ""): r for r in rows
              if r["method"] == "michel"}
    lines = ["| gated | setting | heads kept E / D / A | BLEU | diff. | Michel et al., same heads |",
             "|---|---|---|---:|---:|---:|"]
    base = rows[0]
    lines.append(f"| - | unpruned | {' / '.join(str(base['heads'][k]) for k in 'EDA')} | "
                 f"{base['bleu']:.2f} | | |")
    for r in rows[1:]:
        if r["method"] == "michel":
            continue
        if r["method"] == "control":
            lines.append(f"| - | {r['setting']} | "
                         f"{' / '.join(str(r['heads'][k]) for k in 'EDA')} | {r['bleu']:.2f} | "
                         f"{r['delta']:+.2f} | |")
            continue
        m = michel.get(r["label"])
        other = f"{m['bleu']:.2f} ({m['delta']:+.2f})" if m else ""
        lines.append(f"| {r['types']} | {r['method']}, {r['setting']} | "
                     f"{' / '.join(str(r['heads'][k]) for k in 'EDA')} | {r['bleu']:.2f} | "
                     f"{r['delta']:+.2f} | {other} |")
    lines.append(f"\nBLEU on {base['sentences']} test sentences, sacrebleu `{base['signature']}`."
                 f"\n\nThe paper ({data['paper_source']}):\n")
    lines.append("| gated | heads kept E / D / A | BLEU |")
    lines.append("|---|---|---:|")
    for p in data["paper"]:
        bleu = f"{p['bleu']:.2f}" if "bleu" in p else f"{p['delta']:+.2f} (difference)"
        lines.append(f"| {p['types']} | {' / '.join(str(p['heads'][k]) for k in 'EDA')} | "
                     f"{bleu} |")
    return "\n".join(lines) + "\n"


def _read_json(path: str):
    if os.path.isdir(path):
        return {name[:-len(".json")]: _read_json(os.path.join(path, name))
                for name in sorted(os.listdir(path)) if name.endswith(".json")}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def table_main(doc: str, name: str, columns, build, plot_fn, markdown_fn, paper, source,
               inputs: Dict[str, str] = None):
    """The command line of a result table: evaluate rows + manifest -> ``NAME.json``,
    ``NAME.csv`` (manifest ``columns``), ``NAME.png``, and the Markdown printed. ``inputs``
    names further JSON inputs (``--KEY PATH``, required; a folder gives ``{file stem: JSON}`` of
    its ``*.json`` files), passed to ``build`` as keywords."""
    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("evaluated", help="rows JSON of 'fairseq-headprune evaluate'")
    parser.add_argument("manifest", help="TSV: label, method, " + ", ".join(columns))
    parser.add_argument("-o", "--output-dir", required=True, help=f"where {name}.* go")
    for key, help_text in (inputs or {}).items():
        parser.add_argument("--" + key, required=True, help=help_text)
    opts = parser.parse_args()
    extra = {key: _read_json(getattr(opts, key)) for key in inputs or {}}
    with open(opts.evaluated, encoding="utf-8") as f:
        evaluated = json.load(f)
    with open(opts.manifest, encoding="utf-8") as f:
        manifest = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    rows = build(evaluated["rows"], manifest, **extra)
    out = os.path.join(opts.output_dir, name)
    os.makedirs(opts.output_dir, exist_ok=True)
    write_json(out + ".json", {"config": evaluated["config"], "rows": rows, "paper": paper,
                               "paper_source": source})
    write_csv(out + ".csv", rows, tuple(columns))
    plot_fn(out + ".png", rows)
    print(markdown_fn(out + ".json"))


def main():
    table_main(__doc__, "voita", ("types", "setting"), build_rows, plot, markdown, PAPER, SOURCE)


if __name__ == "__main__":
    main()
