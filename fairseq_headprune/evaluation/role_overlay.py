"""Inputs of ``analyze`` from other methods: the heads each method keeps for the pruning
overlay (``--overlay NAME=FILE``) and Michel et al.'s importance for the rank correlation."""

import json
import math
import os
from typing import Dict

import torch

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.heads.layout import HeadLayout


def _same_shape(tables, layout: HeadLayout, what: str):
    """One sentence unless ``tables`` has the analysed model's types, layers and heads."""
    shape = {k: [layout.num_layers(k), layout.num_heads[k]] for k in layout.kept}
    theirs = {k: list(t.shape) for k, t in tables.items()}
    if theirs != shape:
        raise HeadPruneError(f"{what} is for a model with layers x heads {theirs}, not the "
                             f"analysed model's {shape}.")


def _is_checkpoint(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"PK"  # a torch zip file, as fairseq writes


def overlay_survivors(name: str, path: str, layout: HeadLayout, keep: float) -> Dict:
    """The heads of the analysed model that a method keeps: from a checkpoint (its kept heads,
    e.g. Voita's gates folded and removed), a head spec JSON (``choose -o``: the heads it
    prunes) or an importance/votes JSON (its ``keep`` best heads: a fraction < 1 of the
    analysed model's heads, or a count)."""
    what = f"--overlay {name}={path}"
    if not os.path.isfile(path):
        raise HeadPruneError(f"{what}: the file does not exist.")
    if _is_checkpoint(path):
        from fairseq_headprune.pruning.checkpoint import (
            checkpoint_layout, load_checkpoint, require_headprune)

        state = load_checkpoint(path)
        require_headprune(state, path)  # gated checkpoints: fold first (the hint says how)
        theirs = checkpoint_layout(state)
        _same_shape({k: torch.empty(theirs.num_layers(k), theirs.num_heads[k])
                     for k in theirs.kept}, layout, what)
        kept, source = theirs.kept, "checkpoint"
    else:
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except ValueError as err:
            raise HeadPruneError(f"{what}: not JSON and not a checkpoint ({err}).") from err
        if isinstance(data, dict) and isinstance(data.get("importance"), dict):
            from fairseq_headprune.heads.scores import read_importance

            scores = read_importance(path)
            _same_shape(scores, layout, what)
            present = [(float(scores[k][layer, h]), k, layer, h) for k in layout.kept
                       for layer, heads in enumerate(layout.kept[k]) for h in heads
                       if not math.isnan(float(scores[k][layer, h]))]
            total = layout.count()
            n = int(round(keep * total)) if keep < 1 else min(int(keep), total)
            order = {k: i for i, k in enumerate("EDA")}
            best = sorted(present, key=lambda x: (-x[0], order[x[1]], x[2], x[3]))[:n]
            kept = {k: [sorted(h for _, kk, ll, h in best if kk == k and ll == layer)
                        for layer in range(layout.num_layers(k))] for k in layout.kept}
            source = "importance"
        else:
            from fairseq_headprune.heads.spec import spec_from_json

            pruned = spec_from_json(data)
            kept = {k: [[h for h in heads if h not in pruned.get(k, {}).get(layer, [])]
                        for layer, heads in enumerate(layout.kept[k])] for k in layout.kept}
            source = "head spec (pruned heads)"
    kept = {k: [[h for h in kept[k][layer] if h in layout.kept[k][layer]]
                for layer in range(layout.num_layers(k))] for k in layout.kept if k in kept}
    return {"source": os.path.abspath(path), "read_as": source, "kept": kept,
            "counts": {k: sum(len(x) for x in v) for k, v in kept.items()}}


def read_scores(importance: str, layout: HeadLayout):
    """Michel et al.'s importance of the analysed model (one sentence for a file of another
    shape), NaN where the model has no head."""
    from fairseq_headprune.heads.scores import read_importance

    scores = read_importance(importance)
    _same_shape(scores, layout, f"--importance {importance}")
    for kind, table in scores.items():
        for layer, kept in enumerate(layout.kept[kind]):
            gone = [h for h in range(table.size(1)) if h not in kept]
            table[layer, gone] = math.nan
    return scores


def compare_with_importance(tables, scores, importance: str):
    """Spearman's rho of relevance and confidence against the importance ``scores``, per type
    and over all heads."""
    from fairseq_headprune.heads.rank import correlate

    correlation = {f"{name}_vs_importance": correlate(tables[name], scores)
                   for name in ("relevance", "confidence") if name in tables}
    return {"importance": os.path.abspath(importance), "spearman": correlation}
