"""Reversible head masking: fixed 0/1 gates on a live model (attach -> score -> choose -> remove)."""

from copy import deepcopy
from typing import Optional

import torch
import torch.nn as nn

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.heads.layout import HeadLayout, attention_modules
from fairseq_headprune.heads.spec import HeadSpec, check_spec
from fairseq_headprune.model.gates import (
    FixedGates, attach_gates, detach_gates, gated_heads, gates_of, module_key)


def mask_heads(model: nn.Module, spec: Optional[HeadSpec]):
    """Close (gate to 0) the original heads named in ``spec``; every other head gets gate 1.

    The model gets a ``mask`` gate module (:class:`FixedGates`), replacing any ``mask`` gates it
    had; modules with no head named are inactive, so they stay on fairseq's fused path. Heads
    already removed from the model are ignored. An empty spec removes the mask.
    """
    spec = spec or {}
    check_spec(spec, HeadLayout.from_model(model))
    current = gates_of(model)
    if current is not None and not isinstance(current, FixedGates):
        raise HeadPruneError(f"this model has {current.kind} head gates; fold them first.")
    if not any(spec.values()):
        detach_gates(model)
        return
    gates = FixedGates(gated_heads(model, "EDA"))
    values = {}
    for kind, layer, module in attention_modules(model):
        closed = set(spec.get(kind, {}).get(layer, []))
        values[module_key(kind, layer)] = torch.tensor(
            [0.0 if h in closed else 1.0 for h in module.kept_heads.tolist()])
    gates.set_values(values)
    attach_gates(model, gates)


def remove_heads_from_model(model: nn.Module, spec: HeadSpec):
    """Physically remove the heads named in ``spec`` from a live model (in place)."""
    check_spec(spec, HeadLayout.from_model(model))
    if gates_of(model) is not None:
        raise HeadPruneError(f"this model has {gates_of(model).kind} head gates; fold them "
                             f"before removing heads.")
    for kind, layer, module in attention_modules(model):
        closed = set(spec.get(kind, {}).get(layer, []))
        if closed:
            module.set_kept_heads([h for h in module.kept_heads.tolist() if h not in closed])


def pruned_copy(model: nn.Module, spec: HeadSpec) -> nn.Module:
    """A copy of ``model`` with the heads of ``spec`` removed; ``model`` is left as it is."""
    copy = deepcopy(model)
    remove_heads_from_model(copy, spec)
    return copy
