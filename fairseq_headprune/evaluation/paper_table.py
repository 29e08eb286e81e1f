"""A paper's table with its published numbers beside ours (``scripts/reproduce/*.sh``).

Each table of :data:`PAPERS` lists the paper's rows (an id, what the row is, the published value
and its unit) as METHODS_NOTES.md carries them (sections 1.5, 2.7, 3.9, 4.7, 5.5; read from the
papers or secondary summaries, not all re-verified). Our values come from:

- ``--eval eval.json --manifest runs.tsv``: the rows of ``fairseq-headprune evaluate`` and a
  TSV (our label, the paper row id it stands beside or ``-``, setting): BLEU, or its difference
  to the row labelled ``unpruned`` where the paper gives a difference;
- ``--ablation ablation.json`` (Michel's Table 2, ``ablate --mode best-per-layer``), ``--single
  ablation.json`` (Table 1, ``ablate --mode single --types E``) and ``--sweep results.json``
  (Figure 3, ``sweep``).

Output: ``NAME.json`` (rows: row id, what, paper value, our value, our label and setting, heads
kept, the sacrebleu signature), ``NAME.csv`` and ``NAME.md`` (the Markdown table).

    python -m fairseq_headprune.evaluation.paper_table NAME -o OUT --eval eval.json \\
        --manifest runs.tsv
"""

import argparse
import csv
import io
import json
import os
import sys
from typing import Dict, List, Optional

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.io import write_json, write_text


def _row(rid, what, paper, unit="BLEU", note=""):
    return {"row": rid, "what": what, "paper": paper, "unit": unit, "note": note}


_T2 = {"E": [-1.31, -0.16, 0.12, -0.15, 0.02, -0.36], "A": [0.24, 0.06, 0.05, -0.24, -1.55, -13.56],
       "D": [-0.03, 0.12, 0.18, 0.17, -0.04, 0.24]}
_T2_NAMES = {"E": "Enc-Enc", "A": "Enc-Dec", "D": "Dec-Dec"}


def _gha(column: int, dsp: bool = False) -> List[Dict]:
    """Ni et al. 2023 Tables 1-3, column 0 = IWSLT14 de-en, 5 = WMT14 en-de (METHODS_NOTES 4.7)."""
    t1 = {"vanilla": [34.4, 27.3], "ght": [35.4, 28.6], "ght-ps": [35.2, 28.2]}
    i = 0 if column == 0 else 1
    if dsp:
        return [_row("baseline", "transformer base, all 144 heads (GHA's vanilla row)",
                     t1["vanilla"][i]),
                _row("dsp-30M", "DSP at 30M parameters (2 of 8 heads per module, 25 %), as re-run "
                     "by Ni et al. 2023 Table 2", [33.2, 20.5][i])]
    rows = [_row("vanilla", "vanilla transformer base (44M)", t1["vanilla"][i]),
            _row("ght", "GHT: group constraint (44M)", t1["ght"][i]),
            _row("ght-ps", "GHT-PS: constraint, Voting-to-Stay, heads removed (30M)",
                 t1["ght-ps"][i])]
    rows.append(_row("ght-ps-no-gc", "GHT-PS w/o GC (Table 3: voting without the constraint)",
                     34.0 if i == 0 else None, note="" if i == 0 else "IWSLT only in the paper"))
    return rows


PAPERS = {
    "michel-wmt14-enfr": {
        "source": "Michel et al. 2019, WMT14 en-fr transformer-big (Ott et al. 2018), "
                  "newstest2013; Table 1, Table 2, Figure 3 (METHODS_NOTES.md 1.5)",
        "rows": [_row("unpruned", "unpruned model, newstest2013", 36.05)]
        + [_row(f"table2-{t}{layer + 1}", f"Table 2: only the best head of {_T2_NAMES[t]} "
                f"layer {layer + 1}", _T2[t][layer], "BLEU diff.") for t in "EAD"
           for layer in range(6)]
        + [_row("table1-changed", "Table 1: encoder heads whose removal changes BLEU", 8,
                "heads", "paper: significant at p < 0.01 (paired bootstrap); ours: any change"),
           _row("table1-improved", "Table 1: encoder heads whose removal improves BLEU", 4,
                "heads", "paper: significant at p < 0.01; ours: any improvement")]
        + [_row(f"fig3-{p}", f"Figure 3: {p} % of all heads pruned (importance order)", None,
                "BLEU", "paper: curve only; about 20 % prunable without noticeable loss, steep "
                "drop past 60 %") for p in (20, 40, 60)],
    },
    "voita-wmt-enru": {
        "source": "Voita et al. 2019, WMT EN-RU transformer-base, all three types gated, "
                  "heads kept E/D/A (METHODS_NOTES.md 2.7; per-row lambdas not published)",
        "rows": [_row("baseline", "baseline, 48/48/48 heads", 29.6),
                 _row("eda-1", "gates on E, D, A: 14/31/30 heads", 29.62),
                 _row("eda-2", "gates on E, D, A: 12/21/25 heads", 29.36),
                 _row("eda-3", "gates on E, D, A: 8/13/15 heads", 29.06),
                 _row("eda-4", "gates on E, D, A: 5/9/12 heads", 28.90),
                 _row("enc-10", "gates on E only: 10 of 48 encoder heads", -0.15, "BLEU diff.")],
    },
    "dsp-iwslt14-deen": {
        "source": "Li et al. 2021 (DSP) as re-run by Ni et al. 2023 Table 2, IWSLT14 de-en; "
                  "DSP's own tables could not be read (METHODS_NOTES.md 3.9, 4.7)",
        "rows": _gha(0, dsp=True)},
    "dsp-wmt14-ende": {
        "source": "Li et al. 2021 (DSP) as re-run by Ni et al. 2023 Table 2, WMT14 en-de "
                  "(METHODS_NOTES.md 3.9, 4.7)",
        "rows": _gha(5, dsp=True)},
    "gha-iwslt14-deen": {
        "source": "Ni et al. 2023 Tables 1 and 3, IWSLT14 de-en, transformer base, C = 2 "
                  "(METHODS_NOTES.md 4.7)",
        "rows": _gha(0)},
    "gha-wmt14-ende": {
        "source": "Ni et al. 2023 Table 1, WMT14 en-de, transformer base (METHODS_NOTES.md 4.7)",
        "rows": _gha(5)},
    "collab-wmt17-ende": {
        "source": "Cordonnier et al. 2020, NMT table (collab-nmt-old nmt/README.md), WMT17 "
                  "en-de, 16 heads, trained from scratch (METHODS_NOTES.md 5.5)",
        "rows": [_row("concat-1024", "standard attention, D_k 1024", 27.8)]
        + [_row(f"concat-{k}", f"standard attention, D_k {k} (concatenated heads)", v)
           for k, v in ((256, 27.7), (128, 27.4), (64, 26.6), (32, 25.5))]
        + [_row(f"collab-{k}", f"collaborative attention, shared D~k {k}", v)
           for k, v in ((256, 27.8), (128, 27.8), (64, 27.3), (32, 27.1))]},
}


def _ours(label, value, setting="", heads=None, signature="", sentences=None):
    return {"label": label, "ours": value, "setting": setting, "heads": heads,
            "signature": signature, "sentences": sentences}


def from_eval(table: Dict, evaluated: List[Dict], manifest: List[List[str]]) -> Dict[str, List]:
    """{paper row id or '-': [our values]} from evaluate rows and the manifest."""
    by_label = {r["label"]: r for r in evaluated}
    units = {r["row"]: r["unit"] for r in table["rows"]}
    base = by_label.get("unpruned")
    out: Dict[str, List] = {}
    for line in manifest:
        label, rid, setting = (line + ["", ""])[:3]
        if label not in by_label:
            raise HeadPruneError(f"the manifest names {label!r}, which the evaluation rows lack.")
        if rid != "-" and rid not in units:
            raise HeadPruneError(f"the manifest puts {label!r} beside row {rid!r}, which the "
                                 f"paper's table has not (rows: {', '.join(units)}).")
        r = by_label[label]
        value = r["bleu"]
        if units.get(rid) == "BLEU diff.":
            if base is None:
                raise HeadPruneError("a difference row needs an evaluation row labelled "
                                     "'unpruned'.")
            value = round(r["bleu"] - base["bleu"], 2)
        out.setdefault(rid, []).append(_ours(label, value, setting, r["heads"], r["signature"],
                                             r["sentences"]))
    return out


def from_michel(ablation: Optional[Dict], single: Optional[Dict], sweep: Optional[Dict]
                ) -> Dict[str, List]:
    """Michel et al.'s rows from ``ablate`` (best-per-layer; single, encoder) and ``sweep``."""
    out: Dict[str, List] = {}
    if ablation:
        rows = ablation["rows"]
        base = rows[0]
        out["unpruned"] = [_ours("unpruned", base["bleu"], "", None, base["signature"])]
        for r in rows[1:]:  # spec T:layer:pruned heads -> the layer it keeps one head of
            kind, layer, _ = r["spec"].split(":")
            out.setdefault(f"table2-{kind}{layer}", []).append(
                _ours(r["spec"], r["delta"], "best head by importance", None, r["signature"]))
    if single:
        deltas = [r["delta"] for r in single["rows"][1:]]
        sig = single["rows"][0]["signature"]
        out["table1-changed"] = [_ours("ablate single E", sum(d != 0 for d in deltas),
                                       f"of {len(deltas)} heads", None, sig)]
        out["table1-improved"] = [_ours("ablate single E", sum(d > 0 for d in deltas),
                                        f"of {len(deltas)} heads", None, sig)]
    if sweep:
        for r in sweep["rows"]:
            pct = round(r["level"] * 100)
            if r["curve"] == "all" and pct in (20, 40, 60):
                out[f"fig3-{pct}"] = [_ours(f"sweep all {pct}%", r["bleu"],
                                            f"{r['heads_pruned']}/{r['heads_total']} pruned",
                                            None, r["signature"])]
    return out


def build(name: str, ours: Dict[str, List]) -> List[Dict]:
    """The paper's rows in order, each with every value of ours beside it (a row we did not
    run keeps ``ours`` None), then our rows that stand beside no paper row."""
    if name not in PAPERS:
        raise HeadPruneError(f"unknown table {name!r}; expected one of {', '.join(PAPERS)}.")
    rows = []
    for p in PAPERS[name]["rows"]:
        for o in ours.get(p["row"]) or [_ours("", None)]:
            rows.append({**p, **o})
    for o in ours.get("-", []):
        rows.append({**_row("-", "ours only", None), **o})
    return rows


def _fmt(value, unit):
    if value is None:
        return "-"
    if unit == "BLEU diff.":
        return f"{value:+.2f}"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def markdown(data: Dict) -> str:
    lines = ["| paper row | paper | ours | our run | heads E/D/A |", "|---|---:|---:|---|---|"]
    for r in data["rows"]:
        heads = " / ".join(str(r["heads"].get(k, "-")) for k in "EDA") if r["heads"] else ""
        run = ", ".join(x for x in (r["label"], r["setting"]) if x)
        unit = "" if r["unit"] == "BLEU" else f" ({r['unit']})"
        lines.append(f"| {r['what']}{unit} | {_fmt(r['paper'], r['unit'])} | "
                     f"{_fmt(r['ours'], r['unit'])} | {run} | {heads} |")
    sigs = sorted({r["signature"] for r in data["rows"] if r["signature"]})
    lines.append(f"\nPaper: {data['source']}. Ours: sacrebleu on Moses-detokenised text, "
                 + (", ".join(f"`{s}`" for s in sigs) or "no score yet") + ".")
    notes = sorted({r["note"] for r in data["rows"] if r["note"]})
    lines += [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def readme_block(name: str, results: str) -> str:
    """The README block of table ``name``: ``markdown`` of ``RESULTS/NAME/NAME.json`` when a
    reproduction's results are committed there, else the paper's numbers alone."""
    path = os.path.join(results, name, f"{name}.json")
    if os.path.exists(path):
        return markdown(_load(path))
    paper = PAPERS[name]
    lines = ["| paper row | paper |", "|---|---:|"]
    for r in paper["rows"]:
        unit = "" if r["unit"] == "BLEU" else f" ({r['unit']})"
        lines.append(f"| {r['what']}{unit} | {_fmt(r['paper'], r['unit'])} |")
    lines.append(f"\nPaper: {paper['source']}. Not yet run here at full scale.")
    lines += [f"- {n}" for n in sorted({r["note"] for r in paper["rows"] if r["note"]})]
    return "\n".join(lines) + "\n"


def write_csv(path: str, rows: List[Dict]):
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["row", "what", "unit", "paper", "ours", "label", "setting", "E", "D", "A",
                "signature"])
    for r in rows:
        heads = r["heads"] or {}
        w.writerow([r["row"], r["what"], r["unit"], r["paper"], r["ours"], r["label"],
                    r["setting"], *(heads.get(k, "") for k in "EDA"), r["signature"]])
    write_text(path, buf.getvalue())


def _load(path):
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as err:
        raise HeadPruneError(f"cannot read {path}: {err}.") from None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=sorted(PAPERS), help="the paper's table")
    parser.add_argument("-o", "--output-dir", required=True, help="where NAME.{json,csv,md} go")
    parser.add_argument("--eval", help="rows JSON of 'fairseq-headprune evaluate'")
    parser.add_argument("--manifest", help="TSV: our label, paper row id or -, setting")
    parser.add_argument("--ablation", help="ablate --mode best-per-layer JSON (Michel Table 2)")
    parser.add_argument("--single", help="ablate --mode single JSON (Michel Table 1)")
    parser.add_argument("--sweep", help="sweep results.json (Michel Figure 3)")
    opts = parser.parse_args(argv)
    try:
        if opts.eval or opts.manifest:
            if not (opts.eval and opts.manifest):
                raise HeadPruneError("--eval and --manifest go together.")
            with open(opts.manifest, encoding="utf-8") as f:
                manifest = [line.rstrip("\n").split("\t") for line in f if line.strip()]
            ours = from_eval(PAPERS[opts.name], _load(opts.eval)["rows"], manifest)
        else:
            ours = from_michel(_load(opts.ablation), _load(opts.single), _load(opts.sweep))
        data = {"name": opts.name, "source": PAPERS[opts.name]["source"],
                "rows": build(opts.name, ours)}
    except HeadPruneError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    out = os.path.join(opts.output_dir, opts.name)
    write_json(out + ".json", data)
    write_csv(out + ".csv", data["rows"])
    text = markdown(data)
    write_text(out + ".md", text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
