"""LRP of every head of a fairseq Transformer for its top-1 predictions (Voita et al. 2019,
Sec. 4.2), in the authors' order (voita ``transformer_lrp.py`` ``relprop_decode`` /
``relprop_encode``): output projection, decoder layers from the top (feed-forward,
encoder-decoder attention, self-attention blocks), then the encoder, which receives the summed
key/value relevance of every encoder-decoder attention. The rule and the per-block functions
are in :mod:`.lrp`.
"""

from typing import Dict, List, Tuple

import torch
import torch.nn.functional as F

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.heads.layout import attention_modules
from fairseq_headprune.methods.analysis.lrp import (
    _scaled, attention_parts, relprop_attention, relprop_ffn, relprop_layer_norm,
    relprop_linear, relprop_residual, total, transition)


class LayerInputs:
    """Forward hooks that keep, for one forward pass, every encoder and decoder layer's input
    and output, the encoder output the decoder reads, and the features before the output
    projection."""

    def __init__(self, model):
        self.model = model
        self.store: Dict[str, torch.Tensor] = {}
        self.handles = []

    def __enter__(self):
        def keep_in(name, arg=0):
            def hook(module, args, kwargs):
                self.store[name] = args[arg] if len(args) > arg else kwargs["encoder_out"]
            return hook

        def keep_out(name):
            def hook(module, args, output):
                self.store[name] = output[0] if isinstance(output, tuple) else output
            return hook

        for stack in ("encoder", "decoder"):
            for i, layer in enumerate(getattr(self.model, stack).layers):
                self.handles.append(layer.register_forward_pre_hook(
                    keep_in(f"{stack}.{i}.in"), with_kwargs=True))
                self.handles.append(layer.register_forward_hook(keep_out(f"{stack}.{i}.out")))
        self.handles.append(self.model.decoder.layers[0].register_forward_pre_hook(
            keep_in("encoder_out", 1), with_kwargs=True))
        self.handles.append(self.model.decoder.output_projection.register_forward_pre_hook(
            lambda module, args: self.store.__setitem__("features", args[0])))
        return self.store

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()


def check_supported(model):
    """One sentence for a model this LRP does not cover."""
    for stack in (model.encoder, model.decoder):
        for layer in stack.layers:
            extras = ("attn_ln", "ffn_layernorm", "c_attn", "w_resid")
            if any(getattr(layer, name, None) is not None for name in extras):
                raise HeadPruneError("LRP does not support NormFormer layers (--scale-attn, "
                                     "--scale-fc, --scale-heads, --scale-resids).")
    if any(hasattr(module, "key_dim") for _, _, module in attention_modules(model)):
        raise HeadPruneError("LRP is not implemented for collaborative attention; run analyze "
                             "with --lrp-sentences 0.")
    if getattr(model.decoder, "output_projection", None) is None or getattr(
            model.decoder, "adaptive_softmax", None) is not None:
        raise HeadPruneError("LRP needs a plain output projection (no adaptive softmax).")


class HeadRelevance:
    """Per-sentence LRP of every head for each top-1 prediction (see the module docstring).

    ``sentence(sample, positions)`` returns ``{(type, layer): [kept heads]}`` relevance summed
    over the predictions at ``positions`` (target positions, 0-based), each of which starts
    with relevance 1 on its top-1 logit, and fills ``self.trace`` with, per residual block and
    prediction, (name, relevance entering, relevance leaving) for the conservation check.
    """

    def __init__(self, model):
        check_supported(model)
        self.model = model
        self.trace: List[Tuple[str, torch.Tensor, torch.Tensor]] = []

    def _block(self, R, x, norm, pre_norm, sublayer, name):
        entering = total(R)
        R, extra = relprop_residual(R, x, norm, pre_norm, sublayer)
        leaving = total(R) + (total(extra) if extra is not None else 0)
        self.trace.append((name, entering, leaving))
        return R, extra

    @staticmethod
    def _attention_sub(module, causal, kv, heads, key):
        def sub(inner):
            xkv = inner if kv is None else kv
            if module.num_heads == 0:
                bias = module.out_proj.bias
                update = bias.expand_as(inner) if bias is not None else torch.zeros_like(inner)
            else:
                update = attention_parts(module, inner, xkv, causal)[0]

            def back(R_update):
                h, R_q, R_kv = relprop_attention(R_update, module, inner, xkv, causal,
                                                 self_attention=kv is None)
                heads[key] = h
                return R_q, R_kv
            return update, back
        return sub

    @staticmethod
    def _ffn_sub(layer):
        def sub(inner):
            hidden = layer.activation_fn(F.linear(inner, layer.fc1.weight, layer.fc1.bias))
            return F.linear(hidden, layer.fc2.weight, layer.fc2.bias), \
                lambda R_update: (relprop_ffn(R_update, layer, inner), None)
        return sub

    def forward_layer(self, layer, x, enc=None):
        """Our own forward of one layer on one sentence ([T, C]); returns the inputs of its
        blocks (the last is the layer output), to check against fairseq's forward."""
        pre = layer.normalize_before
        points = [x]
        blocks = [(layer.self_attn_layer_norm, self._attention_sub(
            layer.self_attn, enc is not None, None, {}, None))]
        if enc is not None and getattr(layer, "encoder_attn", None) is not None:
            blocks.append((layer.encoder_attn_layer_norm, self._attention_sub(
                layer.encoder_attn, False, enc, {}, None)))
        blocks.append((layer.final_layer_norm, self._ffn_sub(layer)))
        for norm, sub in blocks:
            inner = norm(x) if pre else x
            update = sub(inner)[0]
            x = x + update if pre else norm(x + update)
            points.append(x)
        return points

    def sentence(self, sample, positions) -> Dict[Tuple[str, int], torch.Tensor]:
        model = self.model
        self.trace = []
        with torch.no_grad(), LayerInputs(model) as store:
            logits = model(**sample["net_input"])[0][0]  # T x V (batch of one)
        top = logits.argmax(-1)
        heads: Dict[Tuple[str, int], torch.Tensor] = {}
        with torch.no_grad():
            feats = store["features"][0]  # T x C (batch first after the decoder)
            P = len(positions)
            proj = model.decoder.output_projection
            R = feats.new_zeros(P, *feats.shape)
            for p, t in enumerate(positions):
                impact = proj.weight[top[t]] * feats[t]  # one output: the top-1 logit
                if proj.bias is not None:
                    impact = impact + proj.bias[top[t]] / feats.size(-1)
                R[p, t] = transition(impact.unsqueeze(0))[0]
            R = _scaled(R, torch.ones(P, dtype=R.dtype, device=R.device))
            dec = model.decoder
            last = store[f"decoder.{len(dec.layers) - 1}.out"][:, 0]  # T x C
            if getattr(dec, "project_out_dim", None) is not None:
                normed = dec.layer_norm(last) if dec.layer_norm is not None else last
                R = relprop_linear(R, normed, dec.project_out_dim.weight, None)
            if dec.layer_norm is not None:
                R = relprop_layer_norm(R, last, dec.layer_norm)
            enc = store["encoder_out"][:, 0]  # S x C
            R_enc, enc_scale = None, 0
            for i in reversed(range(len(dec.layers))):
                layer = dec.layers[i]
                points = self.forward_layer(layer, store[f"decoder.{i}.in"][:, 0], enc)
                pre = layer.normalize_before
                R, _ = self._block(R, points[2], layer.final_layer_norm, pre,
                                   self._ffn_sub(layer), f"D{i + 1}.ffn")
                R, R_kv = self._block(R, points[1], layer.encoder_attn_layer_norm, pre,
                                      self._attention_sub(layer.encoder_attn, False, enc, heads,
                                                          ("A", i)), f"A{i + 1}")
                R_enc = R_kv if R_enc is None else R_enc + R_kv
                enc_scale = enc_scale + total(R_kv)
                R, _ = self._block(R, points[0], layer.self_attn_layer_norm, pre,
                                   self._attention_sub(layer.self_attn, True, None, heads,
                                                       ("D", i)), f"D{i + 1}.self")
            R = _scaled(R_enc, enc_scale)
            encoder = model.encoder
            last = store[f"encoder.{len(encoder.layers) - 1}.out"][:, 0]
            if getattr(encoder, "layer_norm", None) is not None:
                R = relprop_layer_norm(R, last, encoder.layer_norm)
            for i in reversed(range(len(encoder.layers))):
                layer = encoder.layers[i]
                points = self.forward_layer(layer, store[f"encoder.{i}.in"][:, 0])
                pre = layer.normalize_before
                R, _ = self._block(R, points[1], layer.final_layer_norm, pre,
                                   self._ffn_sub(layer), f"E{i + 1}.ffn")
                R, _ = self._block(R, points[0], layer.self_attn_layer_norm, pre,
                                   self._attention_sub(layer.self_attn, False, None, heads,
                                                       ("E", i)), f"E{i + 1}")
        self.inputs = R  # relevance of the source embeddings (with positions), per prediction
        return {key: h.sum(0) for key, h in heads.items()}
