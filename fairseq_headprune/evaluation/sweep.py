"""``fairseq-headprune sweep``: BLEU against the share of heads pruned (Michel et al. 2019, Fig. 2).

For every curve (all types together, then each type alone) and level (0%, 10%, ... 90%), the
least important heads are removed physically from a copy of the model, the subset is decoded with
fairseq's generator and scored with sacrebleu. Each finished row is written at once (atomically)
to ``results.json``; a rerun with the same settings skips the rows already there.
"""

import csv
import io
import logging
import os
from typing import List, Optional, Sequence

from fairseq import utils
from tqdm import tqdm

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.evaluation.decode import batches, load_model, translate
from fairseq_headprune.heads.layout import HeadLayout
from fairseq_headprune.heads.scores import from_lists, read_importance
from fairseq_headprune.heads.spec import format_head_spec, spec_from_json, spec_to_json
from fairseq_headprune.io import data_fingerprint, load_rows, sha256_file, write_json, write_text
from fairseq_headprune.methods.importance_task import reduce_importance, scores_to_log
from fairseq_headprune.methods.michel import COUNT, GradientImportance
from fairseq_headprune.pruning.masking import pruned_copy
from fairseq_headprune.pruning.remove import prune_checkpoint
from fairseq_headprune.pruning.selection import choose_heads, merge_specs

logger = logging.getLogger(__name__)

CURVES = {"all": "EDA", "E": "E", "D": "D", "A": "A"}


def rescore(model, task, subset: str, criterion, max_tokens: int, device: str):
    """Gradient importance of the current (pruned) model, computed in-process."""
    scorer = GradientImportance()
    logs = []
    for sample in batches(task, subset, model, max_tokens):
        sample = utils.move_to_cuda(sample) if device != "cpu" else sample
        scores, _, _, log = scorer.batch_scores(model, sample, criterion)
        logs.append({**scores_to_log(scores), "nsentences": log["nsentences"],
                     "ntokens": log["ntokens"],
                     **{k: v for k, v in log.items() if k.startswith(COUNT)}})
    return from_lists(reduce_importance(logs)["importance"])


def write_csv(path: str, rows: List[dict]):
    fields = ["curve", "level", "heads_pruned", "heads_total", "bleu", "signature", "sentences",
              "decode_seconds", "spec"]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    write_text(path, buf.getvalue())


def run_sweep(data: str, path: str, importance: str, output_dir: str,
              levels: Sequence[float], curves: Sequence[str] = tuple(CURVES),
              subset: str = "test", beam: int = 5, max_tokens: int = 4000,
              max_sentences: Optional[int] = None, keep_one_per_layer: bool = False,
              iterative: bool = False, rescore_subset: str = "valid",
              save_levels: Sequence[float] = (), device: str = "cpu") -> List[dict]:
    """Run (or resume) a sweep; returns every row. See the module docstring."""
    for curve in curves:
        if curve not in CURVES:
            raise HeadPruneError(f"unknown curve '{curve}': expected one of {', '.join(CURVES)}.")
    scores = read_importance(importance)
    base, task = load_model(path, data, device, subset)
    config = {"checkpoint": os.path.abspath(path), "checkpoint_sha256": sha256_file(path),
              "importance": os.path.abspath(importance),
              "importance_sha256": sha256_file(importance), "data": os.path.abspath(data),
              "data_sha256": data_fingerprint(data, subset),
              "levels": list(levels), "curves": list(curves), "subset": subset, "beam": beam,
              "max_sentences": max_sentences, "keep_one_per_layer": keep_one_per_layer,
              "iterative": iterative}
    results_path = os.path.join(output_dir, "results.json")
    rows = load_rows(results_path, config, "a sweep")
    layout = HeadLayout.from_model(base)
    criterion = None
    if iterative:
        from fairseq.criterions.label_smoothed_cross_entropy import (
            LabelSmoothedCrossEntropyCriterion,
        )
        criterion = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False,
                                                       label_smoothing=0.0)
    by_spec = {r["spec"]: r for r in rows}  # level 0 of every curve is one decode

    def save(curve, level, spec):
        out = os.path.join(output_dir, f"pruned_{round(level * 100)}.pt")
        if curve == "all" and level in save_levels and not os.path.exists(out):
            prune_checkpoint(path, spec, out)

    with tqdm(total=len(curves) * len(levels), initial=len(rows), desc="sweep",
              unit="level") as bar:
        for curve in curves:
            pruned, current = {}, base
            for level in levels:
                row = next((r for r in rows if (r["curve"], r["level"]) == (curve, level)), None)
                if row is not None:  # resumed: only the heads matter for the next level
                    pruned, current = spec_from_json(row["heads"]), None
                    save(curve, level, pruned)  # a row is finished with its checkpoint
                    continue
                if iterative and curve == "all" and pruned:
                    if current is None:
                        current = pruned_copy(base, pruned)
                    now = rescore(current, task, rescore_subset, criterion, max_tokens, device)
                    more = choose_heads(now, level, keep_one_per_layer=keep_one_per_layer)
                    spec = merge_specs(pruned, more)
                else:
                    spec = choose_heads(scores, level, types=CURVES[curve],
                                        keep_one_per_layer=keep_one_per_layer)
                text, model = format_head_spec(spec), None
                if text in by_spec:
                    same = by_spec[text]
                    bleu, signature = same["bleu"], same["signature"]
                    sentences, seconds = same["sentences"], same["decode_seconds"]
                else:
                    model = pruned_copy(base, spec)
                    out = translate(model, task, subset, beam, max_tokens,
                                    max_sentences=max_sentences, device=device)
                    bleu, signature = out.bleu()
                    sentences, seconds = len(out.hypotheses), out.seconds
                in_scope = sum(layout.num_heads[k] * layout.num_layers(k) for k in CURVES[curve])
                row = {"curve": curve, "level": level,
                       "heads_pruned": sum(len(h) for v in spec.values() for h in v.values()),
                       "heads_total": in_scope, "bleu": round(bleu, 2), "signature": signature,
                       "sentences": sentences, "decode_seconds": round(seconds, 2),
                       "spec": text, "heads": spec_to_json(spec)}
                rows.append(row)
                by_spec.setdefault(text, row)
                write_json(results_path, {"config": config, "rows": rows})
                save(curve, level, spec)
                pruned, current = spec, model
                bar.update(1)
                bar.set_postfix(curve=curve, level=level, bleu=round(bleu, 2))
    write_csv(os.path.join(output_dir, "results.csv"), rows)
    return rows
