"""``fairseq-headprune compare``: any set of checkpoints side by side on one subset.

Every run (the unpruned model, each method's pruned or re-parametrised result, a fine-tuned
control) is decoded with the same options on the same sentences (:func:`score_checkpoint`, as
``evaluate``), scored with sacrebleu's BLEU and chrF (signatures recorded), and tested against
the first run with sacrebleu's own paired bootstrap resampling
(:class:`sacrebleu.significance.PairedTest`, ``test_type="bs"``; Koehn 2004, the Moses
``bootstrap-hypothesis-difference-significance.pl``): its p-value, the bootstrap mean and 95%
confidence half-width of every run, with the number of resamples and the seed beside them. Each
row also holds the heads kept per attention type, the parameters, the file size and the decoding
speed measured by :func:`run_bench` against the first run (both models forced to the same
number of decoding steps, interleaved rounds, medians with their range).

Runs are ``LABEL=PATH`` (or ``PATH``: the label is the file name without ``.pt``). A label
``METHOD/SETTING`` (``michel/50``) names the method, and the runs of one method are one line of
the plot (BLEU against the share kept); a label without ``/`` is its own method. Collaborative
attention (Cordonnier et al. 2020) keeps every head: its share is the shared key size over the
full one (heads x head_dim), and the table says so.

Decoded hypotheses are kept in ``decoded.json``; a rerun with the same settings decodes and
benchmarks only runs that are new or whose checkpoint changed, then rewrites ``compare.json``,
``compare.csv``, ``compare.md`` and ``compare.png`` from all of them.
"""

import contextlib
import csv
import io
import json
import logging
import os
from typing import Dict, List, Optional, Sequence, Tuple

from tqdm import tqdm

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.evaluation.bench import figure, rounds_note, run_bench
from fairseq_headprune.evaluation.decode import check_data
from fairseq_headprune.evaluation.evaluate import decoding_config, file_stamp, score_checkpoint
from fairseq_headprune.io import data_fingerprint, load_rows, write_json, write_text
from fairseq_headprune.model.collaborative import collaborative_types
from fairseq_headprune.pruning.checkpoint import (
    load_checkpoint, model_args, parameter_bytes, require_headprune)

logger = logging.getLogger(__name__)

SIGNIFICANCE = "paired bootstrap resampling (sacrebleu.significance.PairedTest, test_type bs)"


def parse_runs(texts: Sequence[str]) -> List[Tuple[str, str]]:
    """``[LABEL=]PATH`` arguments -> ``[(label, path)]``; one sentence for a bad list: fewer than
    two runs, an empty label or path, or a label given twice."""
    runs = []
    for text in texts:
        label, sep, path = text.partition("=")
        if not sep:
            label, path = os.path.splitext(os.path.basename(text))[0], text
        if not label or not path:
            raise HeadPruneError(f"--runs '{text}' is not LABEL=PATH or PATH.")
        runs.append((label, path))
    if len(runs) < 2:
        raise HeadPruneError(f"compare needs at least 2 runs (the first is the baseline of the "
                             f"significance test), got {len(runs)}.")
    labels = [label for label, _ in runs]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise HeadPruneError(f"--runs gives the label {twice[0]} to more than one checkpoint; "
                             f"name them LABEL=PATH.")
    return runs


def method_of(label: str) -> str:
    """The method of a run: its label up to the first ``/`` (``michel/50`` -> ``michel``)."""
    return label.split("/", 1)[0]


def inspect_run(path: str, data: str, subset: str) -> Dict:
    """Check a run before any decoding (a readable ``transformer_headprune`` checkpoint without
    gates, whose dictionaries are DATA's) and return what the checkpoint itself says: the bytes
    of its parameters (in their stored dtype), the shared
    key size of its collaborative types and the full key size (heads x head_dim) of each type."""
    state = load_checkpoint(path)
    require_headprune(state, path)
    check_data(state, path, data, subset)
    args = model_args(state)
    key_dims = {kind: dim for dim, kinds in collaborative_types(state["model"]).items()
                for kind in kinds}
    full = {"E": args.encoder_embed_dim, "D": args.decoder_embed_dim, "A": args.decoder_embed_dim}
    return {"parameter_bytes": parameter_bytes(state["model"]),
            "key_dims": {k: key_dims[k] for k in "EDA" if k in key_dims},
            "full_key_dims": {k: full[k] for k in "EDA" if k in key_dims}}


@contextlib.contextmanager
def _sacrebleu_seed(seed: int):
    """sacrebleu's resampling reads its seed from ``SACREBLEU_SEED``."""
    old = os.environ.get("SACREBLEU_SEED")
    os.environ["SACREBLEU_SEED"] = str(seed)
    try:
        yield
    finally:
        if old is None:
            del os.environ["SACREBLEU_SEED"]
        else:
            os.environ["SACREBLEU_SEED"] = old


def paired_bootstrap(named_hypotheses: Sequence[Tuple[str, Sequence[str]]],
                     references: Sequence[str], n_samples: int = 1000, seed: int = 12345
                     ) -> Tuple[Dict[str, str], List[Dict[str, Dict]]]:
    """sacrebleu's paired bootstrap test of every system against the first (Koehn 2004).

    Args:
        named_hypotheses: ``[(name, hypotheses)]``, the baseline first.
        references: one reference per sentence.
        n_samples: bootstrap resamples (sacrebleu's default 1000).
        seed: the resampling seed (>= 1: sacrebleu leaves a seed of 0 unseeded).
    Returns:
        ``({"bleu": signature, "chrf": signature}, [{"bleu": {score, p_value, mean, ci},
        "chrf": {...}}] per system)``; the signatures carry ``bs`` and ``seed``; the baseline's
        p-value is None (it is not tested against itself). ``equal`` marks a score exactly the
        baseline's: when every resample then differs by the same amount (both BLEU 0, or the
        same hypotheses), sacrebleu's p-value is its floor 1 / (n_samples + 1), which is no
        evidence of a difference; it is kept as sacrebleu gives it, and the table says "equal".
    """
    import sacrebleu
    from sacrebleu.significance import PairedTest

    metrics = {"bleu": sacrebleu.metrics.BLEU(), "chrf": sacrebleu.metrics.CHRF()}
    quiet = logging.getLogger("sacrebleu")
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        with _sacrebleu_seed(seed):
            test = PairedTest(list(named_hypotheses), metrics, [list(references)],
                              test_type="bs", n_samples=n_samples)
            signatures, scores = test()
    finally:
        quiet.setLevel(level)
    names = [n for n in scores if n != "System"]  # sacrebleu's own names: BLEU, chrF2
    ours = dict(zip(names, metrics))
    results = [{ours[n]: {"score": round(scores[n][i].score, 2),
                          "p_value": None if i == 0 else round(scores[n][i].p_value, 4),
                          "equal": i > 0 and scores[n][i].score == scores[n][0].score,
                          "mean": round(float(scores[n][i].mean), 2),
                          "ci": round(float(scores[n][i].ci), 2)} for n in names}
               for i in range(len(named_hypotheses))]
    return {ours[n]: str(signatures[n]) for n in names}, results


def _share(row: Dict) -> float:
    """The row's x in the plot: percent of heads kept; for collaborative attention (every head
    kept) percent of the full key size."""
    if row["key_dims"]:
        return round(100 * sum(row["key_dims"].values()) / sum(row["full_key_dims"].values()), 2)
    return row["heads_kept_percent"]


def compare_runs(data: str, runs: Sequence[Tuple[str, str]], output_dir: str,
                 subset: str = "test", beam: int = 5, max_tokens: int = 4000,
                 max_sentences: Optional[int] = None, device: str = "cpu",
                 n_samples: int = 1000, seed: int = 12345, bench: bool = True,
                 bench_batch_sizes: Sequence[int] = (1, 64), bench_sentences: int = 200,
                 repeats: int = 3, note: Optional[str] = None, lenpen: float = 1.0) -> Dict:
    """Compare ``runs`` (``[(label, path)]``, the baseline first; see the module docstring) and
    write the results under ``output_dir``; returns the content of ``compare.json``."""
    if len(runs) < 2:
        raise HeadPruneError(f"compare needs at least 2 runs, got {len(runs)}.")
    infos = {label: inspect_run(path, data, subset) for label, path in runs}  # all, first
    config = {"data": os.path.abspath(data), "subset": subset, "beam": beam,
              "max_tokens": max_tokens, "max_sentences": max_sentences,
              "data_sha256": data_fingerprint(data, subset), "bench": bench,
              "bench_batch_sizes": list(bench_batch_sizes), "bench_sentences": bench_sentences,
              "repeats": repeats, **decoding_config(lenpen)}
    store = os.path.join(output_dir, "decoded.json")
    done = {r["label"]: r for r in load_rows(store, config, "a comparison")}

    def key(label, path):
        return {"label": label, "path": os.path.abspath(path), "stamp": file_stamp(path)}

    base_label, base_path = runs[0]
    for i, (label, path) in enumerate(tqdm(runs, desc="compare", unit="checkpoint")):
        k = key(label, path)
        entry = done.get(label)
        if not entry or any(entry.get(f) != v for f, v in k.items()):
            row, result = score_checkpoint(path, data, subset, beam, max_tokens, max_sentences,
                                           device, lenpen)
            chrf, chrf_signature = result.chrf()
            entry = {**k, **row, "chrf": round(chrf, 2), "chrf_signature": chrf_signature,
                     "file_bytes": os.path.getsize(path), **infos[label],
                     "hypotheses": result.hypotheses, "references": result.references}
            done[label] = entry
            write_json(store, {"config": config, "rows": list(done.values())})
        against = key(base_label, base_path)
        if bench and i > 0 and (entry.get("bench") or {}).get("against") != against:
            report = run_bench(data, base_path, path, subset, beam, bench_batch_sizes,
                               bench_sentences, repeats, device)
            entry["bench"] = {"against": against, **report}
            write_json(store, {"config": config, "rows": list(done.values())})
    entries = [done[label] for label, _ in runs]
    references = entries[0]["references"]
    for e in entries[1:]:
        if e["references"] != references:  # same DATA fingerprint: cannot happen but by a bug
            raise HeadPruneError(f"run {e['label']} was decoded on other references than "
                                 f"{base_label}; delete {store} and rerun.")
    signatures, tests = paired_bootstrap([(e["label"], e["hypotheses"]) for e in entries],
                                         references, n_samples, seed)
    rows = [_row(e, t, entries) for e, t in zip(entries, tests)]
    result = {"config": {**config, "runs": [k for k, _ in runs], "note": note,
                         "significance": {"test": SIGNIFICANCE, "n_samples": n_samples,
                                          "seed": seed, "against": base_label,
                                          "signatures": signatures}},
              "rows": rows}
    out = os.path.join(output_dir, "compare")
    write_json(out + ".json", result)
    write_csv(out + ".csv", rows)
    write_text(out + ".md", markdown(out + ".json"))
    plot(out + ".png", rows)
    return result


def _row(entry: Dict, test: Dict, entries: List[Dict]) -> Dict:
    """One output row: what was measured, without the hypotheses."""
    base = entries[0]
    kept, total = sum(entry["heads"].values()), sum(entry["heads_total"].values())
    row = {k: entry[k] for k in ("label", "path", "heads", "heads_total", "key_dims",
                                 "full_key_dims", "params", "parameter_bytes", "file_bytes",
                                 "bleu", "signature", "chrf", "chrf_signature", "sentences",
                                 "decode_seconds")}
    row["method"] = method_of(entry["label"])
    row["heads_kept"] = kept
    row["heads_kept_percent"] = round(100 * kept / total, 2)
    row["share_kept_percent"] = _share(row)
    row["bleu_delta"] = round(entry["bleu"] - base["bleu"], 2)
    row["chrf_delta"] = round(entry["chrf"] - base["chrf"], 2)
    row["significance"] = test
    speed = None
    if entry is base and len(entries) > 1 and entries[1].get("bench"):
        speed = {"rows": [speed_row(r, "full") for r in entries[1]["bench"]["rows"]],
                 "report": {k: v for k, v in entries[1]["bench"].items() if k not in (
                     "rows", "full", "pruned", "against")},
                 **{k: v for k, v in entries[1]["bench"]["full"].items()}}
    elif entry.get("bench"):
        b = entry["bench"]
        speed = {"rows": [speed_row(r, "pruned") for r in b["rows"]],
                 "report": {k: v for k, v in b.items() if k not in ("rows", "full", "pruned",
                                                                    "against")},
                 **b["pruned"]}
    row["speed"] = speed
    return row


def speed_row(row: Dict, side: str) -> Dict:
    """One batch size of a bench report for one side: the medians as plain numbers (the
    tables'), with the bench's median/min/max figures kept under ``spread``."""
    figures = row[side]
    return {"batch_size": row["batch_size"], **{k: figure(v) for k, v in figures.items()},
            "speedup": 1.0 if side == "full" else figure(row["speedup"]),
            "spread": {**figures, **({"speedup": row["speedup"]} if side == "pruned" else {})}}


def write_csv(path: str, rows: List[Dict]):
    """One line per run: heads, sizes, scores with their p-values and signatures, speeds."""
    sizes = [r["batch_size"] for r in (rows[0]["speed"] or {}).get("rows", [])]
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["label", "method", "E", "D", "A", "heads_kept", "heads_kept_percent",
                     "key_dims", "share_kept_percent", "params", "parameter_bytes",
                     "file_bytes", "bleu", "bleu_p_value", "chrf", "chrf_p_value",
                     *[f"sentences_per_s_batch{b}" for b in sizes],
                     *[f"speedup_batch{b}" for b in sizes], "bleu_signature", "chrf_signature"])
    for r in rows:
        speed = {s["batch_size"]: s for s in (r["speed"] or {}).get("rows", [])}
        writer.writerow([
            r["label"], r["method"], *(r["heads"].get(k, "") for k in "EDA"), r["heads_kept"],
            r["heads_kept_percent"], " ".join(f"{k}:{v}" for k, v in r["key_dims"].items()),
            r["share_kept_percent"], r["params"], r["parameter_bytes"], r["file_bytes"],
            r["bleu"], r["significance"]["bleu"]["p_value"], r["chrf"],
            r["significance"]["chrf"]["p_value"],
            *[speed.get(b, {}).get("sentences_per_s", "") for b in sizes],
            *[speed.get(b, {}).get("speedup", "") for b in sizes], r["signature"],
            r["chrf_signature"]])
    write_text(path, buf.getvalue())


def _p(test: Dict) -> str:
    value = test["p_value"]
    if value is None:
        return "-"
    if test.get("equal"):
        return "equal"
    return f"{value:.3f}" + ("*" if value < 0.05 else "")


def markdown(path: str) -> str:
    """The Markdown table of a ``compare.json`` (``compare.md``, and the README's section)."""
    data = _read(path)
    rows, config = data["rows"], data["config"]
    sig = config["significance"]
    base = rows[0]
    speed_rows = (base["speed"] or {}).get("rows", [])
    batch = speed_rows[-1]["batch_size"] if speed_rows else None
    lines = [f"{config['note']}\n" if config.get("note") else ""]
    lines.append("| run | heads kept E / D / A | kept | parameters | weights / file (MiB) | BLEU "
                 "| p | chrF | p |" + (f" sent/s (batch {batch}) | speedup |" if batch else ""))
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if batch else ""))
    collab = False
    for r in rows:
        heads = " / ".join(str(r["heads"].get(k, "-")) for k in "EDA")
        if r["key_dims"]:
            collab = True
            kept = f"key {r['share_kept_percent']:g}% (a)"
        else:
            kept = f"{r['heads_kept_percent']:g}%"
        delta = "" if r is base else f" ({r['bleu_delta']:+.2f})"
        cdelta = "" if r is base else f" ({r['chrf_delta']:+.2f})"
        size = f"{r['parameter_bytes'] / 2**20:.2f} / {r['file_bytes'] / 2**20:.2f}"
        cells = [r["label"], heads, kept, f"{r['params']:,}", size,
                 f"{r['bleu']:.2f}{delta}", _p(r["significance"]["bleu"]),
                 f"{r['chrf']:.2f}{cdelta}", _p(r["significance"]["chrf"])]
        if batch:
            s = next((s for s in (r["speed"] or {}).get("rows", []) if s["batch_size"] == batch),
                     None)
            cells += [f"{s['sentences_per_s']:.1f}" if s else "",
                      f"{s['speedup']:.2f}x" if s else ""]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(f"\nBLEU and chrF on {base['sentences']} sentences of '{config['subset']}', "
                 f"beam {config['beam']}"
                 + (f", lenpen {config['lenpen']:g}" if "lenpen" in config else "")
                 + f"; sacrebleu `{base['signature']}` and "
                 f"`{base['chrf_signature']}`. p: sacrebleu's paired bootstrap resampling against "
                 f"`{sig['against']}` ({sig['n_samples']} resamples, seed {sig['seed']}; "
                 f"`{sig['signatures']['bleu']}`); * marks p < 0.05; \"equal\": the same score "
                 f"as `{sig['against']}`. Weights: the parameters' bytes; file: the checkpoint "
                 f"on disk (a training checkpoint also holds its optimizer state).")
    if batch:
        report = base["speed"]["report"]
        lines.append(f"\nSpeed: `fairseq-headprune bench` of each run against `{sig['against']}`"
                     f" on {report['device']}, {config['bench_sentences']} sentences, every "
                     f"hypothesis forced to {report['fixed_length']} tokens, "
                     f"{rounds_note(report)}; `{sig['against']}`'s speed is "
                     f"from its timing beside `{rows[1]['label']}`.")
    if collab:
        lines.append("\n(a) Collaborative attention (Cordonnier et al. 2020) removes no head: "
                     "every head is kept, and the share is the shared key size D~k over the "
                     "full key size (heads x head_dim).")
    return "\n".join(lines).lstrip("\n") + "\n"


def _read(path: str) -> Dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _control(rows: List[Dict]) -> Optional[Dict]:
    """The run labelled ``control`` (the unpruned model trained as long as any run), if any."""
    return next((r for r in rows[1:] if r["label"] == "control"), None)


def readings(path: str) -> str:
    """Bullets under a ``compare.json``'s table, every number read from it: per budget (the
    SETTING of ``METHOD/SETTING`` labels) the runs by BLEU, and the best one that removes heads
    against the baseline (with its p) and against a run labelled ``control``; then the spread of
    the speedups at the largest batch size timed."""
    rows = _read(path)["rows"]
    base, control = rows[0], _control(rows)
    budgets: Dict[str, List[Dict]] = {}
    for r in rows[1:]:
        _, sep, setting = r["label"].partition("/")
        if sep:
            budgets.setdefault(setting, []).append(r)

    def order(setting):
        try:
            return 0, float(setting), setting
        except ValueError:
            return 1, 0.0, setting

    lines = []
    for setting in sorted(budgets, key=order):
        runs = sorted(budgets[setting], key=lambda r: (-r["bleu"], r["label"]))
        line = f"- `*/{setting}`: " + ", ".join(f"{r['method']} {r['bleu']:.2f}" for r in runs)
        removing = [r for r in runs if not r["key_dims"]]
        if removing:
            best = removing[0]
            line += (f"; best that removes heads: {best['method']}, {best['bleu_delta']:+.2f} "
                     f"BLEU against {base['label']} (p {_p(best['significance']['bleu'])})")
            if control:
                line += f", {best['bleu'] - control['bleu']:+.2f} against {control['label']}"
        lines.append(line + ".")
    timed = [r for r in rows[1:] if r["speed"] and r["label"] != "control"]
    if timed:
        batch = max(s["batch_size"] for s in timed[0]["speed"]["rows"])
        for removes, what in ((True, "runs that remove heads"), (False, "collaborative runs")):
            ups = [s["speedup"] for r in timed if (not r["key_dims"]) == removes
                   for s in r["speed"]["rows"] if s["batch_size"] == batch]
            if ups:
                lines.append(f"- decoding speed at batch {batch}, {what}: {min(ups):.2f}x to "
                             f"{max(ups):.2f}x of {base['label']} (medians of the rounds).")
    return "\n".join(lines) + "\n" if lines else ""


def method_line(path: str, method: str) -> str:
    """One sentence of a ``compare.json`` on one method, for the README beside its paper: its
    BLEU at every budget with the difference to the baseline and p, and the control's BLEU."""
    rows = _read(path)["rows"]
    base, control = rows[0], _control(rows)
    runs = [r for r in rows[1:] if r["method"] == method and "/" in r["label"]]
    if not runs:
        raise HeadPruneError(f"{path} has no run of method {method!r}.")
    unit = "of the key size" if runs[0]["key_dims"] else "of the heads"
    cells = ", ".join(f"{r['share_kept_percent']:g} % {unit} kept {r['bleu']:.2f} "
                      f"({r['bleu_delta']:+.2f}, p {_p(r['significance']['bleu'])})"
                      for r in sorted(runs, key=lambda r: r["share_kept_percent"]))
    text = (f"In the comparison of all methods on the CPU demo model, {method}: {cells}; "
            f"{base['label']} {base['bleu']:.2f}")
    if control:
        text += f", {control['label']} (fine-tuned as long as any run) {control['bleu']:.2f}"
    return text + ".\n"


def plot(path: str, rows: List[Dict]):
    """BLEU against the share kept, one line per method; the baseline as a dotted line."""
    from fairseq_headprune.evaluation.plots import bleu_figure, save_bleu_figure

    fig, ax = bleu_figure()
    ax.axhline(rows[0]["bleu"], color="gray", lw=0.8, ls=":", label=rows[0]["label"])
    series: Dict[str, List] = {}
    for r in rows[1:]:
        name = r["method"] + (" (x: shared key size)" if r["key_dims"] else "")
        series.setdefault(name, []).append((r["share_kept_percent"], r["bleu"]))
    for name, points in series.items():
        xs, ys = zip(*sorted(points))
        ax.plot(xs, ys, "o-", label=name)
    ax.grid(alpha=0.3)
    save_bleu_figure(fig, ax, path, "heads kept (% of all heads; collab: of the key size)")


def timing_and_plot(folder: str) -> str:
    """The README lines below a comparison's table: how long ``scripts/compare.sh`` took (its
    ``time.json``; only a run that started from nothing says how long the whole takes) and
    the plot, linked by ``folder`` (a path relative to the README)."""
    lines = []
    timing = os.path.join(folder, "time.json")
    if os.path.exists(timing):
        t = _read(timing)
        if t.get("fresh"):
            where = f"{t['cpus']} CPU cores" if t["device"] == "cpu" else t["device"]
            lines.append(f"`scripts/compare.sh` took {t['seconds'] / 60:.0f} minutes on {where} "
                         f"(after `scripts/demo.sh`, which is not counted).")
        else:
            lines.append("Running time not measured: these results come from a resumed run.")
    else:
        lines.append("Running time not measured.")
    if os.path.exists(os.path.join(folder, "compare.png")):
        lines.append(f"\n![BLEU against the share kept, every method]"
                     f"({os.path.join(folder, 'compare.png')})")
    return "\n".join(lines) + "\n"
