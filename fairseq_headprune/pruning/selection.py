"""Which heads to remove for a target: Michel et al. (2019)'s global ranking and its variants.

Input: importance tables ``{type: [layers, original heads]}`` (NaN = already removed). Output: a
head spec (0-based ``{type: {layer: [heads]}}``) of the heads to remove *in addition* to those
already gone, as :func:`fairseq_headprune.spec.format_head_spec` and ``prune`` read it.
"""

import math
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.heads.scores import Scores
from fairseq_headprune.heads.spec import HeadSpec, normalized

Head = Tuple[str, int, int]  # type, layer, head (0-based)


def _ranked(scores: Scores, kinds: Sequence[str]) -> List[Tuple[float, Head]]:
    """Present heads, least important first; ties broken by type, layer, head for determinism."""
    order = {k: i for i, k in enumerate("EDA")}
    heads = [(float(v), (k, layer, h)) for k in kinds for layer, row in enumerate(scores[k].tolist())
             for h, v in enumerate(row) if not math.isnan(v)]
    return sorted(heads, key=lambda item: (item[0], order[item[1][0]], item[1][1], item[1][2]))


def _target(amount: float, total: int) -> int:
    """``amount`` < 1 is a fraction of ``total`` (rounded), >= 1 a count."""
    if amount < 0:
        raise HeadPruneError(f"the amount to prune must be >= 0, got {amount}.")
    count = int(round(amount * total)) if amount < 1 else int(amount)
    if count > total:
        raise HeadPruneError(f"cannot prune {count} heads: the model has {total}.")
    return count


def choose_heads(scores: Scores, amount: float, scope: str = "global",
                 types: Optional[Sequence[str]] = None, keep_one_per_layer: bool = False
                 ) -> HeadSpec:
    """Pick the least important heads to remove.

    Args:
        scores: importance per type, ``[layers, original heads]``; NaN marks removed heads.
        amount: fraction (< 1) or count (>= 1) of the *original* heads in scope to have removed
            in the end; heads already removed count towards it.
        scope: ``global`` ranks all heads of ``types`` together (the paper); ``type`` applies the
            amount to each attention type separately; ``layer`` to each layer separately.
        types: attention types in scope (default: every type in ``scores``).
        keep_one_per_layer: never remove the last head of a layer.

    Returns:
        the heads to remove now, ``{type: {layer: [heads]}}``.
    """
    types = [k for k in (types or "EDA") if k in scores]
    if scope not in SCOPES:
        raise HeadPruneError(f"unknown scope '{scope}': expected one of {', '.join(SCOPES)}.")
    spec: HeadSpec = {}
    for group in SCOPES[scope](scores, types):
        total = sum(scores[k][layer].numel() for k, layer in group)
        already = sum(int(torch.isnan(scores[k][layer]).sum()) for k, layer in group)
        wanted = max(_target(amount, total) - already, 0)
        present = {(k, layer): int((~torch.isnan(scores[k][layer])).sum()) for k, layer in group}
        for _, (k, layer, h) in _ranked({k: scores[k] for k in types}, types):
            if wanted == 0:
                break
            if (k, layer) not in present or (keep_one_per_layer and present[(k, layer)] == 1):
                continue
            spec.setdefault(k, {}).setdefault(layer, []).append(h)
            present[(k, layer)] -= 1
            wanted -= 1
    return normalized(spec)


def choose_to_keep(scores: Scores, keep: Dict[str, int]) -> HeadSpec:
    """The least important heads to remove so that exactly ``keep[type]`` heads of each type
    remain, ranked within the type (e.g. Michel et al.'s ranking at the head counts another
    method ended with). Types not in ``keep`` are left alone."""
    spec: HeadSpec = {}
    for kind, count in keep.items():
        if kind not in scores:
            raise HeadPruneError(f"the importance file has no {kind} heads.")
        total = scores[kind].numel()
        if not 0 <= count <= total:
            raise HeadPruneError(f"cannot keep {count} {kind} heads: the model has {total}.")
        remove = total - count
        spec = merge_specs(spec, choose_heads(scores, remove if remove >= 1 else 0, "type", kind))
    return spec


def choose_per_module(scores: Scores, keep: int, types: Optional[Sequence[str]] = None
                      ) -> HeadSpec:
    """The heads to remove so that each module of ``types`` keeps its ``keep`` highest-scored
    present heads, ties to the lower head index (Ni et al. 2023's Voting-to-Stay rule,
    ``voting_on_pruneindicators``: stable sort by votes, descending)."""
    types = [k for k in (types or "EDA") if k in scores]
    if keep < 1:
        raise HeadPruneError(f"--per-module must be at least 1, got {keep}.")
    spec: HeadSpec = {}
    for kind in types:
        for layer, row in enumerate(scores[kind].tolist()):
            present = [(h, v) for h, v in enumerate(row) if not math.isnan(v)]
            if len(present) < keep:
                pruned = ("" if len(present) == len(row)
                          else f" left of its {len(row)} after pruning")
                raise HeadPruneError(f"cannot keep {keep} heads of {kind}:{layer + 1}: it has "
                                     f"{len(present)}{pruned}.")
            ranked = sorted(present, key=lambda item: -item[1])  # stable: lower index first
            for h, _ in ranked[keep:]:
                spec.setdefault(kind, {}).setdefault(layer, []).append(h)
    return normalized(spec)


def parse_keep(text: str) -> Dict[str, int]:
    """``"E:10,D:24,A:20"`` -> ``{"E": 10, "D": 24, "A": 20}``."""
    keep = {}
    for item in filter(None, text.replace(" ", "").split(",")):
        kind, _, count = item.partition(":")
        if kind not in "EDA" or len(kind) != 1 or not count.isdigit():
            raise HeadPruneError(f"malformed --keep-per-type item '{item}': expected TYPE:COUNT "
                                 f"with TYPE one of E, D, A, e.g. E:10,D:24,A:20.")
        keep[kind] = int(count)
    return keep


def _global(scores, types):
    return [[(k, layer) for k in types for layer in range(scores[k].size(0))]]


def _per_type(scores, types):
    return [[(k, layer) for layer in range(scores[k].size(0))] for k in types]


def _per_layer(scores, types):
    return [[(k, layer)] for k in types for layer in range(scores[k].size(0))]


SCOPES: Dict[str, object] = {"global": _global, "type": _per_type, "layer": _per_layer}


def merge_specs(*specs: HeadSpec) -> HeadSpec:
    """Union of head specs."""
    out: Dict[str, Dict[int, set]] = {}
    for spec in specs:
        for k, layers in spec.items():
            for layer, heads in layers.items():
                out.setdefault(k, {}).setdefault(layer, set()).update(heads)
    return normalized(out)


def mask_scores(scores: Scores, spec: HeadSpec) -> Scores:
    """Scores with the heads of ``spec`` marked removed (NaN)."""
    out = {k: v.clone() for k, v in scores.items()}
    for k, layers in spec.items():
        for layer, heads in layers.items():
            out[k][layer, heads] = math.nan
    return out
