"""``fairseq-headprune bench``: unpruned versus physically pruned decoding, side by side."""

import logging
from typing import Dict, List, Optional, Sequence

from fairseq_headprune.evaluation.cost import decode_macs, kv_cache_bytes
from fairseq_headprune.evaluation.decode import load_model, translate
from fairseq_headprune.heads.layout import HeadLayout
from fairseq_headprune.model.collaborative import key_dims

logger = logging.getLogger(__name__)


def run_bench(data: str, full_path: str, pruned_path: str, subset: str = "test", beam: int = 5,
              batch_sizes: Sequence[int] = (1, 64), max_sentences: int = 200,
              repeats: int = 1, device: str = "cpu", fixed_length: Optional[int] = 0) -> Dict:
    """Decode the same sentences with both models at each batch size; report speeds, sizes, the
    key/value cache and the ideal speedup from the removed multiply-adds.

    Timings alternate between the two models (``repeats`` rounds) and keep each model's fastest
    round, so that drift of the machine affects both alike. A pruned model that translates worse
    may stop later (or never, up to the length limit), which says nothing about the cost of its
    attention; so by default (``fixed_length=0``) every hypothesis of both models is forced to
    the mean reference length, and both do exactly the same decoding steps. ``None`` decodes
    freely; a positive number fixes that length.
    """
    models = {name: load_model(p, data, device, subset) for name, p in
              (("full", full_path), ("pruned", pruned_path))}
    task = models["full"][1]
    task.load_dataset(subset)
    dataset = task.dataset(subset)
    n = min(max_sentences, len(dataset))
    src_len = float(sum(dataset.src_sizes[:n])) / n
    tgt_len = float(sum(dataset.tgt_sizes[:n])) / n
    if fixed_length == 0:
        fixed_length = max(round(tgt_len) - 1, 1)  # tokens before the end of sentence
    rows: List[Dict] = []
    for bs in batch_sizes:
        best = {}
        for model, _ in models.values():  # warm-up: allocator, kernels, first-call costs
            translate(model, task, subset, beam, max_tokens=None, batch_size=bs,
                      max_sentences=bs, device=device, fixed_length=fixed_length)
        for _ in range(repeats):
            for name, (model, _) in models.items():
                out = translate(model, task, subset, beam, max_tokens=None, batch_size=bs,
                                max_sentences=max_sentences, device=device,
                                fixed_length=fixed_length)
                if name not in best or out.seconds < best[name].seconds:
                    best[name] = out
        row = {"batch_size": bs, "sentences": len(best["full"].hypotheses)}
        for name, out in best.items():
            row[name] = {"seconds": round(out.seconds, 3),
                         "sentences_per_s": round(len(out.hypotheses) / out.seconds, 2),
                         "tokens_per_s": round(out.hypothesis_tokens / out.seconds, 1),
                         "bleu": round(out.bleu()[0], 2)}
        row["speedup"] = round(best["full"].seconds / best["pruned"].seconds, 3)
        rows.append(row)
    report = {"subset": subset, "beam": beam, "device": device, "src_len": round(src_len, 2),
              "tgt_len": round(tgt_len, 2), "fixed_length": fixed_length, "rows": rows}
    for name, (model, _) in models.items():
        layout, collab = HeadLayout.from_model(model), key_dims(model)
        report[name] = {
            "parameters": sum(p.numel() for p in model.parameters()),
            "heads": layout.count(),
            "collab_key_dims": collab,
            "kv_cache_bytes_per_sentence": round(kv_cache_bytes(
                layout, model.args, src_len, tgt_len, beam, key_dims=collab)),
            "macs_per_sentence": round(decode_macs(
                layout, model.args, len(task.target_dictionary), src_len, tgt_len, beam,
                key_dims=collab))}
    report["ideal_speedup"] = round(report["full"]["macs_per_sentence"]
                                    / report["pruned"]["macs_per_sentence"], 3)
    report["parameter_ratio"] = round(report["pruned"]["parameters"] / report["full"]["parameters"], 3)
    report["kv_cache_ratio"] = round(report["pruned"]["kv_cache_bytes_per_sentence"]
                                     / report["full"]["kv_cache_bytes_per_sentence"], 3)
    for row in rows:  # measured / ideal speedup, and the share of the ideal gain obtained
        row["measured_over_ideal"] = round(row["speedup"] / report["ideal_speedup"], 3)
        row["share_of_ideal_gain"] = round((row["speedup"] - 1) / (report["ideal_speedup"] - 1),
                                           3) if report["ideal_speedup"] > 1 else None
    return report


def format_bench(report: Dict) -> str:
    fixed = report.get("fixed_length")
    lines = [f"subset {report['subset']}, beam {report['beam']}, device {report['device']}, "
             f"mean lengths src {report['src_len']} / tgt {report['tgt_len']} tokens, "
             + (f"every hypothesis forced to {fixed} tokens" if fixed else "free lengths"),
             f"{'':10s} {'params':>12s} {'heads':>6s} {'KV cache/sent':>14s} {'MACs/sent':>14s}"]
    for name in ("full", "pruned"):
        r = report[name]
        lines.append(f"{name:10s} {r['parameters']:>12,} {r['heads']:>6d} "
                     f"{r['kv_cache_bytes_per_sentence']:>12,} B {r['macs_per_sentence']:>14,}")
    lines.append(f"ratios pruned/full: parameters {report['parameter_ratio']}, KV cache "
                 f"{report['kv_cache_ratio']}; ideal speedup from removed MACs "
                 f"{report['ideal_speedup']}x")
    for row in report["rows"]:
        f, p = row["full"], row["pruned"]
        lines.append(f"batch {row['batch_size']:>4d}: full {f['sentences_per_s']:8.2f} sent/s "
                     f"{f['tokens_per_s']:9.1f} tok/s | pruned {p['sentences_per_s']:8.2f} sent/s "
                     f"{p['tokens_per_s']:9.1f} tok/s | speedup {row['speedup']}x "
                     f"= {row['measured_over_ideal']} of ideal "
                     f"({row['share_of_ideal_gain']} of the ideal gain)")
    return "\n".join(lines)
