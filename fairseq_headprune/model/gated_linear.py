"""The head gate: an ``out_proj`` that scales each head's slice of its input by that head's gate."""

from typing import Callable, Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

Gate = Union[None, torch.Tensor, Callable[[], torch.Tensor]]


class HeadGatedLinear(nn.Linear):
    """``nn.Linear`` whose input is the concatenation of ``num_heads`` head contexts of ``head_dim``.

    Michel et al. (2019), eq. 2, put a gate xi_h on each head's context before the output
    projection; Voita et al. (2019) and Li et al. (2021) put their learned gates at the same place.
    ``gate`` is one of:

    - ``None``: no gate (all heads open); the attention may take fairseq's fused fast path.
    - a tensor of shape ``[num_heads]`` (one gate per head) or ``[batch, num_heads]`` (one per
      sentence, used to read per-sentence gradients d L(x) / d xi_h);
    - a callable with no arguments that returns such a tensor: the model's gate module hands each
      attention module a ``GateHandle`` (see :mod:`fairseq_headprune.model.gates`).

    The parameters keep the names ``weight`` and ``bias``, so state dicts match stock fairseq.
    """

    def __init__(self, in_features: int, out_features: int, head_dim: int, bias: bool = True,
                 device=None, dtype=None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.head_dim = head_dim
        self.gate: Gate = None

    def gate_values(self) -> Optional[torch.Tensor]:
        """Return the current gate tensor, or None when no gate is set."""
        if self.gate is None or isinstance(self.gate, torch.Tensor):
            return self.gate
        return self.gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.jit.is_scripting():  # scripted models hold no gate (see __prepare_scriptable__)
            x = self.gated(x)
        return F.linear(x, self.weight, self.bias)

    @torch.jit.unused
    def gated(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` with each head's slice scaled by its gate (``x`` itself when no gate is set)."""
        gate = self.gate_values()
        if gate is not None and x.size(-1) > 0:
            heads = x.unflatten(-1, (-1, self.head_dim))  # T x B x H x d
            x = (heads * gate.unsqueeze(-1).to(heads.dtype)).flatten(-2)  # T x B x (H*d)
        return x
