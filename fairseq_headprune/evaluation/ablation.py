"""``fairseq-headprune ablate``: Michel et al. (2019)'s two ablations, as BLEU differences.

- ``single`` (their Table 1): remove one head at a time, every head of the chosen types.
- ``best-per-layer`` (their Table 2): in one layer at a time, keep only the head that the
  importance file ranks highest and remove the others.

Each row is written at once to ``ablation.json`` (atomically); a rerun skips finished rows.
"""

import os
from typing import Dict, List, Optional, Sequence

from tqdm import tqdm

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.evaluation.decode import load_model, translate
from fairseq_headprune.heads.layout import HeadLayout
from fairseq_headprune.heads.scores import read_importance
from fairseq_headprune.heads.spec import HeadSpec, format_head_spec
from fairseq_headprune.io import data_fingerprint, load_rows, sha256_file, write_json
from fairseq_headprune.pruning.masking import pruned_copy

MODES = ("single", "best-per-layer")


def ablation_specs(layout: HeadLayout, mode: str, types: Sequence[str],
                   importance: Optional[str] = None) -> List[HeadSpec]:
    """The head sets to remove, one per row, in type, layer, head order."""
    if mode not in MODES:
        raise HeadPruneError(f"unknown ablation '{mode}': expected one of {', '.join(MODES)}.")
    specs = []
    if mode == "single":
        for kind in types:
            for layer, kept in enumerate(layout.kept.get(kind, [])):
                specs.extend({kind: {layer: [h]}} for h in kept)
        return specs
    if importance is None:
        raise HeadPruneError("the best-per-layer ablation needs --importance.")
    scores = read_importance(importance)
    for kind in types:
        for layer, kept in enumerate(layout.kept.get(kind, [])):
            if len(kept) > 1:
                best = max(kept, key=lambda h: float(scores[kind][layer, h]))
                specs.append({kind: {layer: [h for h in kept if h != best]}})
    return specs


def run_ablation(data: str, path: str, output_dir: str, mode: str = "single",
                 types: Sequence[str] = "EDA", importance: Optional[str] = None,
                 subset: str = "test", beam: int = 5, max_tokens: int = 4000,
                 max_sentences: Optional[int] = None, device: str = "cpu") -> Dict:
    """Decode the unpruned model and every ablation; BLEU and its difference per row."""
    base, task = load_model(path, data, device, subset)
    config = {"checkpoint": os.path.abspath(path), "checkpoint_sha256": sha256_file(path),
              "data": os.path.abspath(data), "data_sha256": data_fingerprint(data, subset),
              "mode": mode, "types": "".join(types),
              "importance": importance and os.path.abspath(importance),
              "importance_sha256": importance and os.path.isfile(importance)
              and sha256_file(importance), "subset": subset,
              "beam": beam, "max_sentences": max_sentences}
    results_path = os.path.join(output_dir, "ablation.json")
    rows = load_rows(results_path, config, "an ablation")
    specs = [{}] + ablation_specs(HeadLayout.from_model(base), mode, types, importance)
    done = {r["spec"] for r in rows}
    for spec in tqdm(specs, desc=f"ablate {mode}", unit="run", initial=len(done)):
        text = format_head_spec(spec)
        if text in done:
            continue
        bleu, signature = translate(pruned_copy(base, spec), task, subset, beam, max_tokens,
                                    max_sentences=max_sentences, device=device).bleu()
        baseline = rows[0]["bleu"] if rows else bleu
        rows.append({"spec": text, "bleu": round(bleu, 2),
                     "delta": round(bleu - baseline, 2), "signature": signature})
        write_json(results_path, {"config": config, "rows": rows})
    return {"config": config, "rows": rows}
