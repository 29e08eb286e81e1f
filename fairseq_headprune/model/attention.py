"""fairseq ``MultiheadAttention`` with a gate per head and physically removable heads."""

from typing import Dict, Optional, Sequence

import torch
import torch.nn as nn
from fairseq.modules import MultiheadAttention
from fairseq.modules.fairseq_dropout import FairseqDropout
from fairseq.modules.quant_noise import quant_noise
from torch import Tensor

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.heads.layout import check_kept
from fairseq_headprune.model.gated_linear import Gate, HeadGatedLinear


def stock_dropout_names(module: nn.Module, stock: str):
    """Give the dropout modules a module owns the name the stock class gives them, so that
    ``--retain-dropout-modules TransformerEncoder`` (matched on that name) reaches ours too."""
    for child in module.children():
        if isinstance(child, FairseqDropout) and child.module_name == type(module).__name__:
            child.module_name = stock


def gate_active(gate: Gate) -> bool:
    """Whether a gate slot value can change the output (a gate handle may know it cannot)."""
    return gate is not None and getattr(gate, "active", True)


# (state-dict name, dim, entries per head: None for head_dim) of every tensor of an attention
# module whose slices along dim belong to one head each; removal deletes a head's slices.
HEAD_PARAMS = (
    ("q_proj.weight", 0, None), ("q_proj.bias", 0, None), ("k_proj.weight", 0, None),
    ("k_proj.bias", 0, None), ("v_proj.weight", 0, None), ("v_proj.bias", 0, None),
    ("bias_k", 2, None), ("bias_v", 2, None), ("out_proj.weight", 1, None),
)


class MaskedMultiheadAttention(MultiheadAttention):
    """Multi-head attention whose heads can be gated (masked) and removed.

    A gate multiplies each head's context before ``out_proj`` (Michel et al. 2019, eq. 2); see
    :class:`HeadGatedLinear`. With no gate set and no head removed, :meth:`forward` is exactly
    fairseq's, fused fast path included, so the model costs what the stock ``transformer`` costs.
    Setting a gate or removing a head switches to fairseq's own unfused path, which the gate
    reaches in every case: training, static encoder keys and incremental (beam search) decoding.

    Removing heads slices the rows of ``q_proj``/``k_proj``/``v_proj`` and the columns of
    ``out_proj`` (fairseq's ``_adaptive_prune_heads`` does the same but leaves
    ``out_proj.in_features`` stale and fails on an empty list, so it is not used). The buffer
    ``kept_heads`` records which of the original heads remain, 0-based, in order; it is saved in the
    state dict, so a checkpoint describes its own layout, and :meth:`upgrade_state_dict_named`
    reshapes the module to the layout of the checkpoint being loaded. A module with zero heads
    returns ``out_proj.bias`` for every position, exactly what all gates at 0 give.
    """

    def __init__(self, embed_dim: int, num_heads: int, **kwargs):
        if kwargs.get("xformers_att_config"):
            raise HeadPruneError("transformer_headprune does not support --*-xformers-att-config.")
        super().__init__(embed_dim, num_heads, **kwargs)
        stock = self.out_proj
        gated = HeadGatedLinear(
            stock.in_features, stock.out_features, self.head_dim,
            bias=stock.bias is not None, device="meta",  # no second random init
        )
        gated.weight, gated.bias = stock.weight, stock.bias
        self.out_proj = quant_noise(gated, kwargs.get("q_noise", 0.0), kwargs.get("qn_block_size", 8))
        self.original_num_heads = num_heads
        self.register_buffer("kept_heads", torch.arange(num_heads))
        stock_dropout_names(self, "MultiheadAttention")

    HEAD_PARAMS = HEAD_PARAMS

    # fairseq takes F.multi_head_attention_forward, which bypasses out_proj (and so the gate) and
    # needs embed_dim == num_heads * head_dim, unless this flag is set.
    @property
    def skip_embed_dim_check(self) -> bool:
        return (
            self._skip_embed_dim_check
            or gate_active(self.out_proj.gate)
            or self.num_heads != self.original_num_heads
        )

    @skip_embed_dim_check.setter
    def skip_embed_dim_check(self, value: bool):
        self._skip_embed_dim_check = value

    @property
    def head_gate(self) -> Gate:
        """The gate on this module's heads (see :class:`HeadGatedLinear`), one entry per kept head."""
        return self.out_proj.gate

    @head_gate.setter
    def head_gate(self, gate: Gate):
        self.out_proj.gate = gate

    def set_kept_heads(self, kept: Sequence[int]):
        """Reshape the module to hold exactly the original heads ``kept`` (0-based, ascending).

        Weights of heads the module already holds move to their new place; a head it does not hold
        gets zeros (only used when a checkpoint with more heads is about to be loaded). A gate
        tensor is cleared, since its length no longer matches; a gate handle stays (the model's
        gate module adopts the new head counts itself).

        Args:
            kept: original head indices to hold, each in ``range(original_num_heads)``.
        """
        kept = torch.as_tensor(sorted(set(int(h) for h in kept)), dtype=torch.long)
        if len(kept) and (kept[0] < 0 or kept[-1] >= self.original_num_heads):
            raise HeadPruneError(
                f"head index {int(kept[-1]) + 1} is out of range: this attention has "
                f"{self.original_num_heads} heads."
            )
        position = {int(h): i for i, h in enumerate(self.kept_heads.tolist())}
        for owner, name, dim, width in self.head_params():
            param = getattr(owner, name)
            if param is not None:
                setattr(owner, name, self._moved(param, kept, position, dim, width))
        for proj in self.head_projections():
            proj.out_features = len(kept) * self.head_dim
        self.out_proj.in_features = len(kept) * self.head_dim
        self.kept_heads = kept.to(self.kept_heads.device)
        self.num_heads = len(kept)
        self.embed_dim = len(kept) * self.head_dim
        if isinstance(self.head_gate, torch.Tensor):
            self.head_gate = None

    def head_params(self):
        """``(owner, attribute, dim, width)`` of every parameter whose slices along ``dim`` belong
        to one head each, ``width`` entries per head (see :data:`HEAD_PARAMS`)."""
        for name, dim, width in type(self).HEAD_PARAMS:
            owner, _, attr = name.rpartition(".")
            yield (self.get_submodule(owner), attr, dim, width or self.head_dim)

    def head_projections(self):
        """The input projections with ``head_dim`` output rows per head."""
        return (self.q_proj, self.k_proj, self.v_proj)

    @staticmethod
    def _moved(param: Tensor, kept: Tensor, position: Dict[int, int], dim: int, width: int):
        shape = list(param.shape)
        shape[dim] = len(kept) * width
        new = param.new_zeros(shape)
        for i, h in enumerate(kept.tolist()):
            if h in position:
                src = param.narrow(dim, position[h] * width, width)
                new.narrow(dim, i * width, width).copy_(src.detach())
        return nn.Parameter(new, requires_grad=param.requires_grad)

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        need_weights: bool = True,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
    ):
        if self.num_heads == 0:
            tgt_len, bsz, _ = query.size()
            return self.out_proj(query.new_zeros(tgt_len, bsz, 0)), None  # T x B x C: the bias
        return super().forward(
            query, key, value, key_padding_mask=key_padding_mask,
            incremental_state=incremental_state, need_weights=need_weights,
            static_kv=static_kv, attn_mask=attn_mask, before_softmax=before_softmax,
            need_head_weights=need_head_weights,
        )

    def upgrade_state_dict_named(self, state_dict, name):
        """Add ``kept_heads`` to stock checkpoints and adopt the layout of pruned ones."""
        super().upgrade_state_dict_named(state_dict, name)
        prefix = name + "." if name else ""
        key = prefix + "kept_heads"
        if key not in state_dict:
            v_rows = state_dict[prefix + "v_proj.weight"].size(0)
            state_dict[key] = torch.arange(v_rows // self.head_dim)
        kept = [int(h) for h in state_dict[key].reshape(-1).tolist()]
        check_kept(kept, self.original_num_heads, state_dict[prefix + "v_proj.weight"].size(0),
                   self.head_dim, f"checkpoint module {name}")
        if kept != self.kept_heads.tolist():
            self.set_kept_heads(kept)
