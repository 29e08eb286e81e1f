"""Encoder/decoder stacks and layers of fairseq's Transformer, built with masked attention.

Only the construction seams are overridden (``build_encoder_layer``, ``build_decoder_layer``,
``build_self_attention``, ``build_encoder_attention``); every forward is fairseq's own.
"""

from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)

from fairseq_headprune.model.attention import MaskedMultiheadAttention, stock_dropout_names


def _wrapped(layer, cfg):
    """``--checkpoint-activations`` / ``--offload-activations`` and FSDP wrapping of a layer, as
    fairseq's ``build_encoder_layer`` / ``build_decoder_layer`` do for the stock layers."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap if not checkpoint else 0)


class HeadPruneEncoderLayer(TransformerEncoderLayerBase):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        stock_dropout_names(self, "TransformerEncoderLayerBase")

    def build_self_attention(self, embed_dim, cfg):
        return MaskedMultiheadAttention(
            embed_dim,
            cfg.encoder.attention_heads,
            dropout=cfg.attention_dropout,
            self_attention=True,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
            xformers_att_config=cfg.encoder.xformers_att_config,
        )


class HeadPruneDecoderLayer(TransformerDecoderLayerBase):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        stock_dropout_names(self, "TransformerDecoderLayerBase")

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        return MaskedMultiheadAttention(
            embed_dim,
            cfg.decoder.attention_heads,
            dropout=cfg.attention_dropout,
            add_bias_kv=add_bias_kv,
            add_zero_attn=add_zero_attn,
            self_attention=not cfg.cross_self_attention,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
            xformers_att_config=cfg.decoder.xformers_att_config,
        )

    def build_encoder_attention(self, embed_dim, cfg):
        return MaskedMultiheadAttention(
            embed_dim,
            cfg.decoder.attention_heads,
            kdim=cfg.encoder.embed_dim,
            vdim=cfg.encoder.embed_dim,
            dropout=cfg.attention_dropout,
            encoder_decoder_attention=True,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
            xformers_att_config=cfg.encoder.xformers_att_config,
        )


class HeadPruneEncoder(TransformerEncoderBase):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        stock_dropout_names(self, "TransformerEncoder")

    def build_encoder_layer(self, cfg):
        return _wrapped(HeadPruneEncoderLayer(cfg, return_fc=self.return_fc), cfg)


class HeadPruneDecoder(TransformerDecoderBase):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        stock_dropout_names(self, "TransformerDecoder")

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return _wrapped(HeadPruneDecoderLayer(cfg, no_encoder_attn), cfg)
