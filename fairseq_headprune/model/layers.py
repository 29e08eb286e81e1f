"""Encoder/decoder stacks and layers of fairseq's Transformer, built with masked attention.

Only the construction seams are overridden (``build_encoder_layer``, ``build_decoder_layer``,
``build_self_attention``, ``build_encoder_attention``); every forward is fairseq's own.
"""

from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.model.attention import MaskedMultiheadAttention


def _no_activation_checkpointing(cfg):
    if cfg.checkpoint_activations:
        raise HeadPruneError("transformer_headprune does not support --checkpoint-activations.")


class HeadPruneEncoderLayer(TransformerEncoderLayerBase):
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
    def build_encoder_layer(self, cfg):
        _no_activation_checkpointing(cfg)
        return HeadPruneEncoderLayer(cfg, return_fc=self.return_fc)


class HeadPruneDecoder(TransformerDecoderBase):
    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        _no_activation_checkpointing(cfg)
        return HeadPruneDecoderLayer(cfg, no_encoder_attn)
