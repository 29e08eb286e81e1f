"""The Markdown summary of ``analyze``'s ``roles.json`` that the demo summary and
``scripts/update_readme.py`` show: roles per attention type, the rank correlation with Michel et
al.'s importance, which heads each method keeps, and the heatmaps (image links next to the
JSON file).

    python -m fairseq_headprune.evaluation.roles_table roles.json
"""

import argparse
import json
import os
import statistics

from fairseq_headprune.heads.layout import ATTENTION_TYPES, TYPE_NAMES

ROLES = ("positional", "syntactic", "rare")
FIGURES = (("relevance", "LRP relevance"), ("confidence", "confidence"),
           ("positional_share", "positional"), ("rare_share", "rare-word"),
           ("syntactic_margin", "syntactic"), ("overlay", "pruning overlay"))


def _rho(value) -> str:
    return "-" if value is None else f"{value:+.2f}"


def markdown(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        r = json.load(f)
    kinds = [k for k in ATTENTION_TYPES if k in r["roles"]]
    lines = [f"Head roles on {r['sentences']} sentences of '{r['subset']}' (LRP on "
             f"{r['lrp']['sentences']} sentences, {r['lrp']['predictions']} predictions; "
             f"positional at >= {r['thresholds']['positional_share']:.0%} of tokens, rare-word "
             f"at >= {r['thresholds']['rare_share']:.0%}, syntactic at "
             f"+{r['thresholds']['syntactic_margin'] * 100:.0f} points over the positional "
             f"baseline" + ("" if "syntactic" in r else ", not measured: no parses") + "):\n",
             "| type | heads | positional | syntactic | rare-word | no role | mean confidence |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for kind in kinds:
        heads = [h for row in r["roles"][kind] for h in row if h is not None]
        counts = [sum(role in h for h in heads) for role in ROLES]
        conf = [v for row in r["measures"]["confidence"].get(kind, []) for v in row
                if v is not None]
        lines.append(f"| {kind}: {TYPE_NAMES[kind]} | {len(heads)} | " + " | ".join(
            str(c) for c in counts) + f" | {sum(not h for h in heads)} | "
            + (f"{statistics.mean(conf):.2f}" if conf else "-") + " |")
    spearman = r.get("correlation", {}).get("spearman")
    if spearman:
        lines += ["", "Spearman's rho against Michel et al.'s importance of the same model:", "",
                  "| measure | " + " | ".join(kinds) + " | all |",
                  "|---|" + "---:|" * (len(kinds) + 1)]
        for name, rho in spearman.items():
            lines.append(f"| {name.split('_vs_')[0]} | " + " | ".join(
                _rho(rho.get(k)) for k in [*kinds, "all"]) + " |")
    overlay = r.get("overlay", {}).get("methods")
    if overlay:
        lines += ["", "Heads each method keeps, and how many of them have a role:", "",
                  "| method | " + " | ".join(f"{k} kept (with a role)" for k in kinds) + " |",
                  "|---|" + "---:|" * len(kinds)]
        for name, method in overlay.items():
            cells = []
            for kind in kinds:
                kept = [r["roles"][kind][layer][h] for layer, heads in
                        enumerate(method["kept"].get(kind, [])) for h in heads]
                cells.append(f"{len(kept)} ({sum(bool(x) for x in kept)})")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    folder = os.path.dirname(path)
    images = [f"![{title}]({os.path.join(folder, name + '.png')})" for name, title in FIGURES
              if os.path.exists(os.path.join(folder, name + ".png"))]
    if images:
        lines += [""] + images
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("roles_json", help="analyze's roles.json")
    print(markdown(parser.parse_args().roles_json))


if __name__ == "__main__":
    main()
