"""Collaborative multi-head attention (Cordonnier, Loukas & Jaggi 2020), a drop-in for the masked
attention on encoder self, decoder self and encoder-decoder attention."""

from typing import Dict, Optional

import torch
import torch.nn as nn
from fairseq.modules import MultiheadAttention
from fairseq.modules.quant_noise import quant_noise
from torch import Tensor

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.heads.layout import ATTENTION_TYPES, attention_modules, module_prefix
from fairseq_headprune.model.attention import MaskedMultiheadAttention

# The shared projections q_proj/k_proj belong to no head; mixing and content_bias have one row
# per head, values and out_proj head_dim rows/columns per head, as in the masked attention.
COLLAB_HEAD_PARAMS = (
    ("mixing", 0, 1), ("content_bias.weight", 0, 1), ("v_proj.weight", 0, None),
    ("v_proj.bias", 0, None), ("out_proj.weight", 1, None),
)


def concatenate_mixing(num_heads: int, key_dim: int) -> Tensor:
    """The authors' CONCATENATE mixing: head h reads the block ``h*w:(h+1)*w`` of the shared key
    dimensions, ``w = ceil(key_dim / num_heads)``; at ``key_dim = heads x head_dim`` it makes the
    collaborative layer the standard one (``collaborative_attention.py``, ``MixingMatrixInit``)."""
    width = -(-key_dim // num_heads)
    mixing = torch.zeros(num_heads, key_dim)
    for h in range(num_heads):
        mixing[h, h * width:(h + 1) * width] = 1.0
    return mixing


class CollaborativeAttention(MaskedMultiheadAttention):
    """Collaborative multi-head attention (Cordonnier et al. 2020, eq. 7), heads still prunable.

    All heads share one query projection ``q_proj`` and one key projection ``k_proj`` of
    ``key_dim`` (D~k) outputs, without biases; head h re-weights the shared query dimensions with
    its row of ``mixing`` (M, ``[heads, key_dim]``; on the query side, as the authors'
    ``collaborative_attention.py`` and their old NMT code), and ``content_bias`` (``[heads,
    kdim]``) adds a per-head, per-key term that carries the query bias of a re-parametrised layer::

        score_h(i, j) = scaling * ( sum_r (x_i Wq~)_r M[h, r] (y_j Wk~)_r + content_bias(y_j)_h )

    ``scaling`` is the original ``head_dim ** -0.5``, kept as both of the authors' NMT codes keep
    it, so a re-parametrised layer needs no scale correction (their HF swap divides by
    ``sqrt(key_dim / heads)`` instead and is off by ``sqrt(D / key_dim)``; METHODS_NOTES 5.3).
    Values, ``v_proj`` and ``out_proj`` stay per head, with the head gate of
    :class:`MaskedMultiheadAttention`; removing a head deletes its values, its ``out_proj``
    columns, its ``mixing`` row and its ``content_bias`` row.

    Incremental decoding caches the shared keys once, ``[batch, positions, key_dim]``, and the
    content bias ``[batch, heads, positions]``: ``key_dim + heads`` numbers per position where the
    standard layer caches ``heads x head_dim`` keys (and the authors' fairseq fork caches
    ``heads x key_dim`` mixed keys). Values are cached as fairseq caches them.
    """

    HEAD_PARAMS = COLLAB_HEAD_PARAMS

    def __init__(self, embed_dim: int, num_heads: int, key_dim: int, **kwargs):
        if kwargs.get("add_bias_kv") or kwargs.get("add_zero_attn"):
            raise HeadPruneError("collaborative attention does not support --add-bias-kv or "
                                 "--add-zero-attn.")
        if key_dim < 1:
            raise HeadPruneError(f"the collaborative key size must be at least 1, not {key_dim}.")
        super().__init__(embed_dim, num_heads, **kwargs)
        self.key_dim = key_dim
        noise = (kwargs.get("q_noise", 0.0), kwargs.get("qn_block_size", 8))
        self.q_proj = quant_noise(nn.Linear(embed_dim, key_dim, bias=False), *noise)
        self.k_proj = quant_noise(nn.Linear(self.kdim, key_dim, bias=False), *noise)
        self.mixing = nn.Parameter(concatenate_mixing(num_heads, key_dim))
        self.content_bias = nn.Linear(self.kdim, num_heads, bias=False)
        nn.init.xavier_uniform_(self.q_proj.weight, gain=2 ** -0.5)
        nn.init.xavier_uniform_(self.k_proj.weight, gain=2 ** -0.5)
        nn.init.zeros_(self.content_bias.weight)

    @classmethod
    def like(cls, module: MultiheadAttention, key_dim: int) -> "CollaborativeAttention":
        """A collaborative attention with the options of ``module`` (fresh parameters)."""
        return cls(
            module.original_num_heads * module.head_dim, module.original_num_heads, key_dim,
            kdim=module.kdim, vdim=module.vdim, dropout=module.dropout_module.p,
            bias=module.v_proj.bias is not None, self_attention=module.self_attention,
            encoder_decoder_attention=module.encoder_decoder_attention,
        )

    @property
    def skip_embed_dim_check(self) -> bool:
        return True  # never fairseq's fused path: it has no shared keys

    @skip_embed_dim_check.setter
    def skip_embed_dim_check(self, value: bool):
        pass

    def head_projections(self):
        return (self.v_proj,)

    def set_kept_heads(self, kept):
        super().set_kept_heads(kept)
        self.content_bias.out_features = self.num_heads

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
        """fairseq's ``MultiheadAttention.forward`` contract (Time x Batch x Channel in and out,
        the same cache keys and reordering), computed with shared keys."""
        tgt_len, bsz, _ = query.size()
        if self.num_heads == 0:  # the bias, and the masked attention's weights of no head
            return super().forward(query, key, value, need_weights=need_weights,
                                   need_head_weights=need_head_weights)
        saved = None
        if incremental_state is not None:
            saved = self._get_input_buffer(incremental_state)
            if saved is not None and "prev_key" in saved and static_kv:
                key = value = None  # encoder keys already cached
        if self.self_attention:
            key = value = query
        elif self.encoder_decoder_attention and key is not None and self.beam_size > 1 \
                and bsz == key.size(1):  # T x (B*beam) x C -> T x B x C, as fairseq
            key = value = key.view(key.size(0), -1, self.beam_size, key.size(2))[:, :, 0]
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.view(
                    -1, self.beam_size, key_padding_mask.size(1))[:, 0]
        H, d = self.num_heads, self.head_dim
        q = self.q_proj(query) * self.scaling  # T x B x R
        k = bias = v = None
        if key is not None:
            k = self.k_proj(key).transpose(0, 1)  # B' x S x R, shared by the heads
            bias = self.content_bias(key).permute(1, 2, 0) * self.scaling  # B' x H x S
            v = self.v_proj(value).view(-1, value.size(1), H, d).permute(1, 2, 0, 3)  # B' x H x S x d
        if saved is not None:
            if "prev_key" in saved:
                if static_kv:
                    k, bias, v = saved["prev_key"], saved["prev_content_bias"], saved["prev_value"]
                else:
                    k = torch.cat([saved["prev_key"], k], dim=1)
                    bias = torch.cat([saved["prev_content_bias"], bias], dim=2)
                    v = torch.cat([saved["prev_value"], v], dim=2)
            key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
                key_padding_mask=key_padding_mask,
                prev_key_padding_mask=saved.get("prev_key_padding_mask"),
                batch_size=k.size(0), src_len=k.size(1), static_kv=static_kv)
            saved.update(prev_key=k, prev_content_bias=bias, prev_value=v,
                         prev_key_padding_mask=key_padding_mask)
            self._set_input_buffer(incremental_state, saved)
        kv_bsz, src_len = k.size(0), k.size(1)
        # queries of the beam grouped by source sentence: B' x X x T x H x R (X = B / B')
        mixed = q.transpose(0, 1).view(kv_bsz, -1, tgt_len, 1, self.key_dim) * self.mixing
        scores = torch.einsum("bxthr,bsr->bxhts", mixed, k)
        scores = scores + bias.unsqueeze(1).unsqueeze(3)  # B' x X x H x T x S
        if attn_mask is not None:
            scores = scores + attn_mask
        if key_padding_mask is not None and key_padding_mask.dim() > 0:
            scores = scores.masked_fill(
                key_padding_mask.view(kv_bsz, 1, 1, 1, src_len).to(torch.bool), float("-inf"))
        scores = scores.reshape(bsz * H, tgt_len, src_len)
        if before_softmax:
            return scores, v.reshape(-1, src_len, d)
        probs_float = torch.softmax(scores, dim=-1, dtype=torch.float32)
        probs = self.dropout_module(probs_float.type_as(scores))
        context = torch.einsum("bxhts,bhsd->bxthd", probs.view(kv_bsz, -1, H, tgt_len, src_len), v)
        context = context.reshape(bsz, tgt_len, H * d).transpose(0, 1)  # T x B x (H*d)
        out = self.out_proj(context)
        weights = None
        if need_weights or need_head_weights:
            weights = probs_float.view(bsz, H, tgt_len, src_len).transpose(1, 0)
            if not need_head_weights:
                weights = weights.mean(dim=0)
        return out, weights

    def upgrade_state_dict_named(self, state_dict, name):
        prefix = name + "." if name else ""
        if prefix + "mixing" not in state_dict and prefix + "v_proj.weight" in state_dict:
            raise HeadPruneError(
                f"checkpoint module {name} is a standard attention, but the model expects a "
                f"collaborative one (--collab-key-dim): the checkpoint does not match its options.")
        super().upgrade_state_dict_named(state_dict, name)


def collaborative_types(state_dict, name: str = "") -> Dict[int, str]:
    """``{key_dim: types}`` of the attention modules that are collaborative in a state dict
    (``name``: the model's prefix in it), e.g. ``{32: "EDA"}``."""
    found: Dict[int, str] = {}
    prefix = name + "." if name else ""
    for kind in ATTENTION_TYPES:
        layer = 0
        while prefix + module_prefix(kind, layer) + "v_proj.weight" in state_dict:
            key = prefix + module_prefix(kind, layer)
            if key + "mixing" in state_dict:
                key_dim = state_dict[key + "q_proj.weight"].size(0)
                if kind not in found.get(key_dim, ""):
                    found[key_dim] = found.get(key_dim, "") + kind
            layer += 1
    return found


def make_collaborative(model: nn.Module, types: str, key_dim: int):
    """Replace the attention modules of ``types`` (letters of E, D, A) of a fairseq Transformer
    by collaborative ones with shared key size ``key_dim`` (fresh parameters: a checkpoint's
    state dict, or training, fills them)."""
    for kind, layer, module in list(attention_modules(model)):
        if kind in types and not isinstance(module, CollaborativeAttention):
            stack, attr = ATTENTION_TYPES[kind]
            like = module.v_proj.weight  # a model already on its device / in its dtype
            setattr(getattr(model, stack).layers[layer], attr,
                    CollaborativeAttention.like(module, key_dim).to(like.device, like.dtype))


def key_dims(model: nn.Module) -> Dict[str, int]:
    """``{type: shared key size}`` of the collaborative attention types of a model."""
    return {kind: module.key_dim for kind, _, module in attention_modules(model)
            if isinstance(module, CollaborativeAttention)}
