"""fairseq ``MultiheadAttention`` with a gate per head and physically removable heads."""

from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
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


def append_padding_mask(new: Optional[Tensor], prev: Optional[Tensor], batch: int, src_len: int,
                        static_kv: bool, device: torch.device) -> Optional[Tensor]:
    """The key padding mask of the whole cached source, ``[batch, src_len]`` bool (True: pad):
    the cached one for static keys, else the cached and the new masks end to end, positions
    without a mask counting as not padded."""
    if prev is not None and static_kv:
        return prev
    if prev is None and new is None:
        return None
    mask = torch.zeros(batch, src_len, dtype=torch.bool, device=device)
    if prev is not None:
        mask[:, : prev.size(1)] = prev.to(torch.bool)
    if new is not None:
        mask[:, src_len - new.size(1):] = new.to(torch.bool)
    return mask


def attention_mask(attn_mask: Optional[Tensor], key_padding_mask: Optional[Tensor], kv_bsz: int,
                   group: int, src_len: int, dtype: torch.dtype) -> Optional[Tensor]:
    """One additive mask for grouped queries, ``[B' or 1, 1, X*T or 1, S]``, from fairseq's
    ``attn_mask`` (``[T, S]``, additive, or bool with True for masked) and ``key_padding_mask``
    (``[B', S]``, True or 1 for pad)."""
    mask: Optional[Tensor] = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros(attn_mask.shape, dtype=dtype, device=attn_mask.device
                                    ).masked_fill(attn_mask, float("-inf"))
        mask = attn_mask.to(dtype).repeat(group, 1).view(1, 1, -1, attn_mask.size(-1))
    if key_padding_mask is not None and key_padding_mask.dim() > 0:
        pad = torch.zeros(kv_bsz, 1, 1, src_len, dtype=dtype, device=key_padding_mask.device
                          ).masked_fill(key_padding_mask.view(kv_bsz, 1, 1, src_len).to(torch.bool),
                                        float("-inf"))
        mask = pad if mask is None else mask + pad
    return mask


def ungroup(x: Tensor, group: int, tgt_len: int) -> Tensor:
    """``[B', H, X*T, ...]`` (queries grouped by cached source sentence) -> ``[B'*X, H, T, ...]``."""
    kv_bsz, heads = x.size(0), x.size(1)
    rest = x.shape[3:]
    x = x.reshape([kv_bsz, heads, group, tgt_len] + list(rest)).transpose(1, 2)
    return x.reshape([kv_bsz * group, heads, tgt_len] + list(rest))


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
    :class:`HeadGatedLinear`. Every layout and gate takes the same path (see :meth:`forward`):
    ``F.scaled_dot_product_attention``, or explicit probabilities where the caller asks for the
    weights, on training, static encoder keys and incremental (beam search) decoding alike. With
    all heads and no gate it computes what fairseq's ``MultiheadAttention`` computes (to float
    rounding), and the module scripts with ``torch.jit.script`` as the stock one does.

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
        # compute the attention probabilities explicitly even when nobody asks for the weights
        # (hooks on dropout_module read them there, as GHA's attn_matrix feature does)
        self.explicit_path = False
        stock_dropout_names(self, "MultiheadAttention")

    HEAD_PARAMS = HEAD_PARAMS
    __jit_unused_properties__ = ["skip_embed_dim_check", "head_gate"]

    # fairseq's own forward (used here only with add_bias_kv / add_zero_attn) takes
    # F.multi_head_attention_forward, which bypasses out_proj (and so the gate) and needs
    # embed_dim == num_heads * head_dim, unless this flag is set.
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
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """fairseq's ``MultiheadAttention.forward`` contract (Time x Batch x Channel in and out, the
        same incremental cache and reordering), on one path for every head layout and gate.

        Attention is ``F.scaled_dot_product_attention`` unless the caller needs the weights
        (``need_weights``, ``need_head_weights``, ``before_softmax``: fairseq's alignment layer,
        ``--print-alignment``, the analysis) or :attr:`explicit_path` is set (hooks that read the
        probabilities); then the probabilities are computed explicitly. The gate is applied by
        ``out_proj`` to each head's context, so no gate forces a slower path. Encoder-decoder
        attention in beam search computes keys once per source sentence (fairseq's
        ``beam_size`` sharing) and attends with the beam's queries grouped by sentence.
        """
        if need_head_weights:
            need_weights = True
        tgt_len, bsz, _ = query.size()
        if self.num_heads == 0:  # out: T x B x C, the bias; weights of no head (their mean: 0)
            none: Optional[Tensor] = None
            if need_weights:
                keys = key.size(0) if key is not None else tgt_len
                none = query.new_zeros(bsz, tgt_len, keys)
                if need_head_weights:
                    none = query.new_zeros(0, bsz, tgt_len, keys)
            return self.out_proj(query.new_zeros(tgt_len, bsz, 0)), none
        if self.bias_k is not None or self.add_zero_attn:
            return self._stock_forward(query, key, value, key_padding_mask, incremental_state,
                                       need_weights, static_kv, attn_mask, before_softmax,
                                       need_head_weights)
        saved: Optional[Dict[str, Optional[Tensor]]] = None
        if incremental_state is not None:
            saved = self._get_input_buffer(incremental_state)
            if static_kv and "prev_key" in saved:
                key = None  # encoder keys and values already cached
        H, d = self.num_heads, self.head_dim
        if self.self_attention:
            key = query
            value = query
        elif self.encoder_decoder_attention:
            if key is not None and self.beam_size > 1 and bsz == key.size(1):
                # T x (B*beam) x C -> T x B x C: the beam's copies of a sentence are equal
                key = key.view(key.size(0), -1, self.beam_size, key.size(2))[:, :, 0]
                if key_padding_mask is not None:
                    key_padding_mask = key_padding_mask.view(
                        -1, self.beam_size, key_padding_mask.size(1))[:, 0]
            value = key
        q = self.q_proj(query).view(tgt_len, bsz, H, d).permute(1, 2, 0, 3)  # B x H x T x d
        k: Optional[Tensor] = None
        v: Optional[Tensor] = None
        if key is not None:
            assert value is not None
            k = self.k_proj(key).view(key.size(0), -1, H, d).permute(1, 2, 0, 3)  # B' x H x S x d
            v = self.v_proj(value).view(value.size(0), -1, H, d).permute(1, 2, 0, 3)
        if saved is not None:
            prev_key = saved.get("prev_key")
            prev_value = saved.get("prev_value")
            if prev_key is not None and prev_value is not None:
                if static_kv or k is None or v is None:
                    k, v = prev_key, prev_value
                else:
                    k = torch.cat([prev_key, k], dim=2)
                    v = torch.cat([prev_value, v], dim=2)
            assert k is not None and v is not None
            key_padding_mask = append_padding_mask(
                key_padding_mask, saved.get("prev_key_padding_mask"), k.size(0), k.size(2),
                static_kv, k.device)
            saved["prev_key"] = k
            saved["prev_value"] = v
            saved["prev_key_padding_mask"] = key_padding_mask
            self._set_input_buffer(incremental_state, saved)
        assert k is not None and v is not None
        kv_bsz, src_len = k.size(0), k.size(2)
        group = bsz // kv_bsz  # beam queries per cached source sentence (1 outside beam search)
        q = q.reshape(kv_bsz, group, H, tgt_len, d).transpose(1, 2).reshape(
            kv_bsz, H, group * tgt_len, d)  # B' x H x (X*T) x d
        mask = attention_mask(attn_mask, key_padding_mask, kv_bsz, group, src_len, q.dtype)
        weights: Optional[Tensor] = None
        if need_weights or before_softmax or self.explicit_path:
            scores = torch.matmul(q * self.scaling, k.transpose(2, 3))  # B' x H x (X*T) x S
            if mask is not None:
                scores = scores + mask
            if before_softmax:
                return (ungroup(scores, group, tgt_len).reshape(bsz * H, tgt_len, src_len),
                        v.reshape(kv_bsz * H, src_len, d))
            probs_float = torch.softmax(scores, dim=-1, dtype=torch.float32)
            probs = self.dropout_module(  # fairseq's [B*H, T, S] layout outside beam search
                probs_float.type_as(scores).view(kv_bsz * H, group * tgt_len, src_len))
            context = torch.matmul(probs.view(kv_bsz, H, group * tgt_len, src_len), v)
            if need_weights:
                weights = ungroup(probs_float, group, tgt_len).transpose(0, 1)  # H x B x T x S
                if not need_head_weights:
                    weights = weights.mean(dim=0)
        else:
            dropout = self.dropout_module.p if (
                self.training or self.dropout_module.apply_during_inference) else 0.0
            context = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout, scale=self.scaling)
        context = ungroup(context, group, tgt_len)  # B x H x T x d
        out = self.out_proj(context.permute(2, 0, 1, 3).reshape(tgt_len, bsz, H * d))
        return out, weights

    @torch.jit.unused
    def _stock_forward(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor],
                       key_padding_mask: Optional[Tensor],
                       incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]],
                       need_weights: bool, static_kv: bool, attn_mask: Optional[Tensor],
                       before_softmax: bool, need_head_weights: bool
                       ) -> Tuple[Tensor, Optional[Tensor]]:
        """fairseq's own forward, for ``add_bias_kv`` / ``add_zero_attn`` (no stock Transformer
        architecture sets them; not available under TorchScript)."""
        return super().forward(
            query, key, value, key_padding_mask=key_padding_mask,
            incremental_state=incremental_state, need_weights=need_weights,
            static_kv=static_kv, attn_mask=attn_mask, before_softmax=before_softmax,
            need_head_weights=need_head_weights,
        )

    def __prepare_scriptable__(self):
        """``torch.jit.script`` scripts inference models: a set gate (a training or scoring
        state) is refused in one sentence instead of being silently dropped."""
        if self.head_gate is not None:
            raise HeadPruneError(
                "a model with head gates cannot be scripted: fold or remove the gates first "
                "('fairseq-headprune fold', or 'prune --from-gates').")
        return self

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
