"""The demo's summary table, generated from its results files (``python -m`` this module)."""

import argparse
import glob
import json
import os
from typing import Dict, Optional

from fairseq_headprune.evaluation import (
    budget_table, collab_table, compare, gha_table, head_table, roles_table)
from fairseq_headprune.evaluation.bench import figure, speed_table
from fairseq_headprune.heads.layout import TYPE_NAMES
from fairseq_headprune.io import write_text


def _load(path: str) -> Optional[Dict]:
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


# (folder and table name, table module, the sentence before the table) of each reproduction
REPRODUCTIONS = (
    ("voita", head_table,
     "Voita et al. (2019): Hard Concrete gates + L0 fine-tuned from this model "
     "(`scripts/reproduce/voita_demo.sh`), heads removed with `fold`, beside Michel et al.'s "
     "ranking at the same head counts (pruned, not fine-tuned, as in their paper) and the same "
     "fine-tuning without gates (the control row: this small model is under-trained, so extra "
     "updates alone add BLEU):"),
    ("dsp", budget_table,
     "Li et al. (2021) DSP on this model (`scripts/reproduce/dsp_demo.sh`), beside Voita et "
     "al.'s gates cut to the same K and Michel et al.'s ranking at the same K (pruned, not "
     "fine-tuned), every pruned model with exactly K heads; BLEU (difference to the unpruned "
     "model):"),
    ("gha", gha_table,
     "Ni et al. (2023) GHA on this model (`scripts/reproduce/gha_demo.sh`): the group "
     "constraint, Voting-to-Stay, heads removed and fine-tuned, in their Table 1 layout:"),
    ("collab", collab_table,
     "Cordonnier et al. (2020) collaborative attention re-parametrised from this model "
     "(`scripts/reproduce/collab_demo.sh`: `fairseq-headprune collab`, CP decomposition of each "
     "module's query-key products), without retraining and after plain fine-tuning, in the "
     "layout of their translation table:"),
    ("roles", roles_table,
     "Voita et al. (2019) head roles of this model (`scripts/reproduce/analysis_demo.sh`: "
     "`fairseq-headprune analyze`), with the heads Michel et al.'s ranking and the other "
     "methods keep:"),
    ("compare", compare,
     "Every method on this model at the same budgets (`scripts/compare.sh`, then "
     "`fairseq-headprune compare`): the share of all heads kept (collaborative attention: of "
     "the key size), each pruned model fine-tuned the same number of updates, p from "
     "sacrebleu's paired bootstrap against the unpruned model:"),
)


def summarize(out_dir: str) -> str:
    """Markdown summary of ``corpus.json``, ``sweep/results.json`` and ``bench.json``."""
    corpus = _load(os.path.join(out_dir, "corpus", "corpus.json"))
    sweep = _load(os.path.join(out_dir, "sweep", "results.json"))
    bench = _load(os.path.join(out_dir, "bench.json"))
    ablation = _load(os.path.join(out_dir, "ablation", "ablation.json"))
    lines = []
    if corpus:
        p = corpus["pairs"]
        manifest = corpus.get("manifest_sha256")
        lines.append(f"Corpus {corpus['pair']} from {corpus['catalogs']} gettext catalogs: "
                     f"{p['train']:,} train / {p['valid']:,} valid / {p['test']:,} test pairs"
                     + (f" (manifest sha256 `{manifest[:16]}`: results compare only with a "
                        f"corpus of the same manifest)" if manifest else
                        " (built before corpus manifests)") + ".\n")
    if sweep:
        rows = sweep["rows"]
        curves = list(dict.fromkeys(r["curve"] for r in rows))
        levels = sorted(set(r["level"] for r in rows))
        table = {(r["curve"], r["level"]): r for r in rows}
        lines.append("| heads pruned | " + " | ".join(
            "all types" if c == "all" else f"{c} only" for c in curves) + " |")
        lines.append("|---:|" + "---:|" * len(curves))
        for lv in levels:
            cells = [f"{table[(c, lv)]['bleu']:.2f}" if (c, lv) in table else "" for c in curves]
            lines.append(f"| {lv * 100:.0f}% | " + " | ".join(cells) + " |")
        lines.append(f"\nBLEU on {rows[0]['sentences']} sentences of "
                     f"'{sweep['config']['subset']}', beam {sweep['config']['beam']}; "
                     f"sacrebleu `{rows[0]['signature']}`.")
        base = table.get(("all", 0.0))
        if base:
            for lv in (0.2, 0.5):
                if ("all", lv) in table:
                    lines.append(f"- {lv:.0%} of all heads pruned: "
                                 f"{table[('all', lv)]['bleu'] - base['bleu']:+.2f} BLEU")
            drops = {c: sum(base["bleu"] - table[(c, lv)]["bleu"] for lv in levels
                            if (c, lv) in table) for c in curves if c != "all"}
            if drops:
                worst = max(drops, key=drops.get)
                lines.append(f"- most sensitive type (largest BLEU loss summed over levels): "
                             f"{worst} ({TYPE_NAMES[worst]})")
    if bench:
        lines.append(f"\nDecoding, {bench['full']['heads']} -> {bench['pruned']['heads']} heads "
                     f"(beam {bench['beam']}, {bench['device']}): parameters x"
                     f"{bench['parameter_ratio']}, KV cache x{bench['kv_cache_ratio']}, ideal "
                     f"speedup {bench['ideal_speedup']}x.\n")
        lines.append("| batch | full sent/s | pruned sent/s | speedup | of ideal |")
        lines.append("|---:|---:|---:|---:|---:|")
        for row in bench["rows"]:
            lines.append(f"| {row['batch_size']} | {figure(row['full']['sentences_per_s'])} | "
                         f"{figure(row['pruned']['sentences_per_s'])} | {figure(row['speedup'])}x | "
                         f"{row['measured_over_ideal']} |")
    if ablation and ablation["config"]["mode"] == "best-per-layer":
        lines.append("\nKeeping only the most important head of one layer (Michel et al., "
                     "Table 2), BLEU difference to the unpruned model:\n")
        lines.append("| layer | heads removed | BLEU | difference |")
        lines.append("|---|---|---:|---:|")
        for row in ablation["rows"][1:]:
            layer = ":".join(row["spec"].split(":")[:2])
            n = len(row["spec"].split(":")[2].split(","))
            lines.append(f"| {layer} | {n} | {row['bleu']:.2f} | {row['delta']:+.2f} |")
    speed = sorted(glob.glob(os.path.join(glob.escape(out_dir), "bench_*.json")))
    if speed:
        lines.append(speed_table([_load(path) for path in speed]))
    for name, module, intro in REPRODUCTIONS:
        path = os.path.join(out_dir, name, name + ".json")
        if os.path.exists(path):
            lines.append("\n" + intro + "\n")
            lines.append(module.markdown(path))
            if module is compare:
                lines.append(compare.readings(path))
                lines.append(compare.timing_and_plot(os.path.join(out_dir, name)))
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out_dir", help="the demo's results folder")
    opts = parser.parse_args()
    text = summarize(opts.out_dir)
    write_text(os.path.join(opts.out_dir, "summary.md"), text)
    print(text)


if __name__ == "__main__":
    main()
