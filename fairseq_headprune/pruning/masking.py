"""Reversible head masking: fixed 0/1 gates on a live model (attach -> score -> choose -> remove)."""

from copy import deepcopy
from typing import Optional

import torch
import torch.nn as nn

from fairseq_headprune.heads.layout import HeadLayout, attention_modules
from fairseq_headprune.heads.spec import HeadSpec, check_spec


def mask_heads(model: nn.Module, spec: Optional[HeadSpec]):
    """Close (gate to 0) the original heads named in ``spec``; every other head gets gate 1.

    Modules with no head named keep no gate, so they stay on fairseq's fused path. Heads already
    removed from the model are ignored.
    """
    spec = spec or {}
    check_spec(spec, HeadLayout.from_model(model))
    for kind, layer, module in attention_modules(model):
        closed = set(spec.get(kind, {}).get(layer, []))
        kept = module.kept_heads.tolist()
        if closed & set(kept):
            gate = torch.tensor([0.0 if h in closed else 1.0 for h in kept],
                                device=module.kept_heads.device)
            module.head_gate = gate
        else:
            module.head_gate = None


def remove_heads_from_model(model: nn.Module, spec: HeadSpec):
    """Physically remove the heads named in ``spec`` from a live model (in place)."""
    check_spec(spec, HeadLayout.from_model(model))
    for kind, layer, module in attention_modules(model):
        closed = set(spec.get(kind, {}).get(layer, []))
        if closed:
            module.set_kept_heads([h for h in module.kept_heads.tolist() if h not in closed])


def pruned_copy(model: nn.Module, spec: HeadSpec) -> nn.Module:
    """A copy of ``model`` with the heads of ``spec`` removed; ``model`` is left as it is."""
    copy = deepcopy(model)
    remove_heads_from_model(copy, spec)
    return copy
