"""Analytic decoding cost of a (pruned) Transformer: multiply-adds and key/value cache bytes.

Beam search as fairseq runs it: the encoder once per sentence; encoder-decoder keys/values once
per sentence (shared by the beam); every decoder step once per hypothesis, self-attention over
the t tokens so far. Used to state the *ideal* speedup of removing heads, against which the
measured one is judged.
"""

from typing import Dict

from fairseq_headprune.heads.layout import HeadLayout


def _dims(args) -> Dict[str, int]:
    return {"C_enc": args.encoder_embed_dim, "C_dec": args.decoder_embed_dim,
            "F_enc": args.encoder_ffn_embed_dim, "F_dec": args.decoder_ffn_embed_dim,
            "d_E": args.encoder_embed_dim // args.encoder_attention_heads,
            "d_D": args.decoder_embed_dim // args.decoder_attention_heads}


def decode_macs(layout: HeadLayout, args, vocab: int, src_len: float, tgt_len: float,
                beam: int) -> float:
    """Multiply-adds to translate one sentence of ``src_len`` tokens into ``tgt_len`` tokens."""
    m = _dims(args)
    S, T = src_len, tgt_len
    enc = 0.0
    for kept in layout.kept.get("E", []):
        n = len(kept) * m["d_E"]  # q/k/v/out width left
        enc += S * (4 * m["C_enc"] * n + 2 * n * S + 2 * m["C_enc"] * m["F_enc"])
    steps = T * (T + 1) / 2  # sum over steps of the self-attention context length
    dec = 0.0
    for kept in layout.kept.get("D", []):
        n = len(kept) * m["d_D"]
        dec += beam * (T * 4 * m["C_dec"] * n + 2 * n * steps)
    for kept in layout.kept.get("A", []):
        n = len(kept) * m["d_D"]
        dec += 2 * m["C_enc"] * n * S  # encoder keys/values, once per sentence
        dec += beam * T * (2 * m["C_dec"] * n + 2 * n * S)
    layers = args.decoder_layers
    dec += beam * T * (layers * 2 * m["C_dec"] * m["F_dec"] + m["C_dec"] * vocab)
    return enc + dec


def kv_cache_bytes(layout: HeadLayout, args, src_len: float, tgt_len: float, beam: int,
                   bytes_per_value: int = 4) -> float:
    """Decoder key/value cache of one sentence at the end of decoding (all hypotheses)."""
    m = _dims(args)
    self_attn = sum(len(k) for k in layout.kept.get("D", [])) * m["d_D"] * 2 * tgt_len * beam
    cross = sum(len(k) for k in layout.kept.get("A", [])) * m["d_D"] * 2 * src_len
    return (self_attn + cross) * bytes_per_value
