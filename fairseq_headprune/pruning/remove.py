"""Physical head removal on a checkpoint's state dict (the destructive step; masking is reversible).

Head h of a fairseq attention module owns rows ``h*d:(h+1)*d`` of ``q_proj``, ``k_proj`` and
``v_proj`` (weight and bias) and the same columns of ``out_proj.weight``; removing it deletes them
and the head's entry in ``kept_heads``. ``out_proj.bias`` stays. A collaborative module (Cordonnier
et al.) keeps its shared ``q_proj``/``k_proj`` and loses the head's row of ``mixing`` and
``content_bias`` instead (the modules' ``HEAD_PARAMS`` tables). A checkpoint with a gate module
(``--head-gates``) is folded first (:mod:`fairseq_headprune.pruning.fold`).
"""

import logging
from typing import Dict, List

import torch

from fairseq_headprune.heads.layout import HeadLayout, module_prefix
from fairseq_headprune.heads.spec import HeadSpec, check_spec
from fairseq_headprune.model.attention import MaskedMultiheadAttention
from fairseq_headprune.model.collaborative import CollaborativeAttention
from fairseq_headprune.pruning.checkpoint import (
    checkpoint_layout,
    count_parameters,
    load_checkpoint,
    parameter_bytes,
    require_headprune,
    save_checkpoint,
    strip_training_state,
)

logger = logging.getLogger(__name__)



def _index(keep: List[int], width: int) -> torch.Tensor:
    return torch.tensor([p * width + i for p in keep for i in range(width)], dtype=torch.long)


def remove_module_heads(state_dict: Dict[str, torch.Tensor], prefix: str, heads: List[int]) -> int:
    """Remove original heads ``heads`` (0-based) from one attention module in ``state_dict``.

    Returns:
        the number of heads actually removed (heads already gone are skipped with a warning).
    """
    kept = state_dict[prefix + "kept_heads"].tolist()
    gone = sorted(set(heads) - set(kept))
    if gone:
        logger.warning("%s: heads %s were already removed", prefix.rstrip("."),
                       ",".join(str(h + 1) for h in gone))
    keep = [pos for pos, h in enumerate(kept) if h not in heads]
    if len(keep) == len(kept):
        return 0
    head_dim = state_dict[prefix + "v_proj.weight"].size(0) // len(kept)
    table = (CollaborativeAttention if prefix + "mixing" in state_dict
             else MaskedMultiheadAttention).HEAD_PARAMS
    for name, dim, width in table:
        if prefix + name in state_dict:
            rows = _index(keep, width or head_dim)
            state_dict[prefix + name] = state_dict[prefix + name].index_select(dim, rows).clone()
    state_dict[prefix + "kept_heads"] = torch.tensor([kept[p] for p in keep], dtype=torch.long)
    return len(kept) - len(keep)


def remove_heads(state_dict: Dict[str, torch.Tensor], layout: HeadLayout, spec: HeadSpec) -> int:
    """Remove every head named in ``spec`` (original 0-based indices) from ``state_dict``.

    Args:
        state_dict: a ``transformer_headprune`` state dict, modified in place.
        layout: its current layout (for range checks against the original model).
        spec: heads to remove, ``{type: {layer: [heads]}}``.

    Returns:
        the number of heads removed.
    """
    check_spec(spec, layout)
    removed = 0
    for kind, layers in spec.items():
        for layer, heads in layers.items():
            removed += remove_module_heads(state_dict, module_prefix(kind, layer), heads)
    return removed


def prune_checkpoint(path: str, spec: HeadSpec, output: str) -> Dict[str, int]:
    """Remove the heads of ``spec`` from checkpoint ``path`` and write ``output`` atomically.

    The optimizer state is dropped and the ``--head-layout`` model option updated.

    Returns:
        ``removed``, and ``heads_``, ``params_`` and ``bytes_`` (of the parameters)
        ``before``/``after``.
    """
    state = load_checkpoint(path)
    args = require_headprune(state, path)
    layout = checkpoint_layout(state)
    report = {"heads_before": layout.count(), "params_before": count_parameters(state["model"]),
              "bytes_before": parameter_bytes(state["model"])}
    report["removed"] = remove_heads(state["model"], layout, spec)
    layout = checkpoint_layout(state)
    args.head_layout = layout.to_json()
    strip_training_state(state)
    save_checkpoint(state, output)
    report.update(heads_after=layout.count(), params_after=count_parameters(state["model"]),
                  bytes_after=parameter_bytes(state["model"]))
    return report
