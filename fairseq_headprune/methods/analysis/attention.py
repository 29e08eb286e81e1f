"""Per-head attention maps of every attention module during one forward pass.

fairseq's ``MultiheadAttention`` returns per-head weights (``[heads, batch, tgt, src]``) when
called with ``need_head_weights=True`` on its unfused path; the layers call it with
``need_weights=False``. :func:`record_attention` adds a forward pre-hook that asks every module
for per-head weights (and forces the unfused path, which computes the same outputs) and a
forward hook that keeps them. Works for :class:`MaskedMultiheadAttention` (pruned or not, zero
heads give no map) and for collaborative attention, which return the same shape.
"""

import contextlib
from typing import Dict, Tuple

import torch

from fairseq_headprune.heads.layout import attention_modules

Maps = Dict[Tuple[str, int], torch.Tensor]  # (type, layer) -> [kept heads, batch, tgt, src]


@contextlib.contextmanager
def record_attention(model):
    """Within the block, every forward of ``model`` stores its per-head attention weights in
    the yielded dict, keyed ``(type, layer)`` (type ``E``, ``D`` or ``A``, layer 0-based);
    weights are the softmax output before attention dropout, in float32."""
    maps: Maps = {}
    handles, saved = [], []

    def ask(module, args, kwargs):
        kwargs = dict(kwargs)
        kwargs["need_weights"] = True
        kwargs["need_head_weights"] = True
        return args, kwargs

    def keep(key):
        def hook(module, args, kwargs, output):
            weights = output[1] if isinstance(output, tuple) else None
            if weights is not None:
                maps[key] = weights.detach().float()
        return hook

    try:
        for kind, layer, module in attention_modules(model):
            # the private flag where a property wraps it (ours), else fairseq's attribute
            saved.append((module, getattr(module, "_skip_embed_dim_check",
                                          module.skip_embed_dim_check)))
            module.skip_embed_dim_check = True  # the unfused path returns per-head weights
            handles.append(module.register_forward_pre_hook(ask, with_kwargs=True))
            handles.append(module.register_forward_hook(keep((kind, layer)), with_kwargs=True))
        yield maps
    finally:
        for handle in handles:
            handle.remove()
        for module, flag in saved:
            module.skip_embed_dim_check = flag
