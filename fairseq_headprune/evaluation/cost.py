"""Analytic decoding cost of a (pruned) Transformer: multiply-adds and key/value cache bytes.

Beam search as fairseq runs it: the encoder once per sentence; encoder-decoder keys/values once
per sentence (shared by the beam); every decoder step once per hypothesis, self-attention over
the t tokens so far. Used to state the *ideal* speedup of removing heads, against which the
measured one is judged.

A collaborative module (Cordonnier et al. 2020; ``key_dims`` gives its shared key size R per
type) projects queries and keys to R, adds a content bias (``heads`` per key), mixes the query
per head (``heads x R``) and scores ``heads x R`` per query-key pair; it caches ``R + heads`` key
numbers per position instead of ``heads x head_dim``. Values and ``out_proj`` are as standard.
"""

from typing import Dict, Optional

from fairseq_headprune.heads.layout import HeadLayout


def _dims(args) -> Dict[str, int]:
    return {"C_enc": args.encoder_embed_dim, "C_dec": args.decoder_embed_dim,
            "F_enc": args.encoder_ffn_embed_dim, "F_dec": args.decoder_ffn_embed_dim,
            "d_E": args.encoder_embed_dim // args.encoder_attention_heads,
            "d_D": args.decoder_embed_dim // args.decoder_attention_heads}


def _attention(heads: int, head_dim: int, key_dim: Optional[int]):
    """(query-side width, key-side width, score width per pair, cached key numbers per
    position) of one module with ``heads`` heads; ``key_dim`` None for standard attention."""
    n = heads * head_dim
    if key_dim is None:
        return n, n, n, n
    return key_dim, key_dim + heads, heads * key_dim, key_dim + heads


def decode_macs(layout: HeadLayout, args, vocab: int, src_len: float, tgt_len: float,
                beam: int, key_dims: Optional[Dict[str, int]] = None) -> float:
    """Multiply-adds to translate one sentence of ``src_len`` tokens into ``tgt_len`` tokens.

    ``key_dims``: shared key size of the collaborative types (``{"E": 32}``), none by default.
    """
    m, key_dims = _dims(args), key_dims or {}
    S, T = src_len, tgt_len
    enc = 0.0
    for kept in layout.kept.get("E", []):
        h, n = len(kept), len(kept) * m["d_E"]  # heads and value/out width left
        q, k, score, _ = _attention(h, m["d_E"], key_dims.get("E"))
        mixing = h * q if "E" in key_dims else 0
        enc += S * (m["C_enc"] * (q + k + 2 * n) + mixing + (score + n) * S
                    + 2 * m["C_enc"] * m["F_enc"])
    steps = T * (T + 1) / 2  # sum over steps of the self-attention context length
    dec = 0.0
    for kept in layout.kept.get("D", []):
        h, n = len(kept), len(kept) * m["d_D"]
        q, k, score, _ = _attention(h, m["d_D"], key_dims.get("D"))
        mixing = h * q if "D" in key_dims else 0
        dec += beam * (T * (m["C_dec"] * (q + k + 2 * n) + mixing) + (score + n) * steps)
    for kept in layout.kept.get("A", []):
        h, n = len(kept), len(kept) * m["d_D"]
        q, k, score, _ = _attention(h, m["d_D"], key_dims.get("A"))
        mixing = h * q if "A" in key_dims else 0
        dec += m["C_enc"] * (k + n) * S  # encoder keys/values, once per sentence
        dec += beam * T * (m["C_dec"] * (q + n) + mixing + (score + n) * S)
    layers = args.decoder_layers
    dec += beam * T * (layers * 2 * m["C_dec"] * m["F_dec"] + m["C_dec"] * vocab)
    return enc + dec


def kv_cache_bytes(layout: HeadLayout, args, src_len: float, tgt_len: float, beam: int,
                   bytes_per_value: int = 4, key_dims: Optional[Dict[str, int]] = None) -> float:
    """Decoder key/value cache of one sentence at the end of decoding (all hypotheses)."""
    m, key_dims = _dims(args), key_dims or {}
    total = 0.0
    for kind, positions in (("D", tgt_len * beam), ("A", src_len)):
        for kept in layout.kept.get(kind, []):
            cached_keys = _attention(len(kept), m["d_D"], key_dims.get(kind))[3]
            total += (cached_keys + len(kept) * m["d_D"]) * positions
    return total * bytes_per_value
