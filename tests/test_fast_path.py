"""One attention path for every head layout and gate: scaled_dot_product_attention where no
weights are needed, explicit probabilities where they are, equal to stock fairseq on each path."""

import pytest
import torch
import torch.nn.functional as F
from fairseq.modules import MultiheadAttention

import fairseq_headprune.model.attention as attention
from fairseq_headprune.model.attention import (
    MaskedMultiheadAttention, append_padding_mask, attention_mask)

T, S, B, C, H, BEAM = 4, 6, 2, 16, 4, 3


def pair(**kwargs):
    torch.manual_seed(0)
    stock = MultiheadAttention(C, H, **kwargs)
    ours = MaskedMultiheadAttention(C, H, **kwargs)
    ours.load_state_dict(stock.state_dict(), strict=False)
    return stock.eval(), ours.eval()


def run(module, path, need_weights=False):
    """Output (and averaged weights) of one code path; incremental paths decode step by step."""
    torch.manual_seed(1)
    x = torch.randn(T, B, C)
    enc = torch.randn(S, B, C)
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[0, :2] = True  # left padding, as fairseq's source side
    causal = torch.triu(torch.full((T, T), float("-inf")), 1)
    if path == "self":
        return module(x, x, x, attn_mask=causal, need_weights=need_weights)
    if path == "cross":
        return module(x, enc, enc, key_padding_mask=pad, static_kv=True, need_weights=need_weights)
    state, outs, weights = {}, [], []
    beam = BEAM if path == "beam-cross" else 1
    if beam > 1:  # B*beam queries over B cached sources, as SequenceGenerator runs it
        module.set_beam_size(beam)
        x = x.repeat_interleave(beam, dim=1)
        enc = enc.repeat_interleave(beam, dim=1)
        pad = pad.repeat_interleave(beam, dim=0)
    for t in range(T):
        q = x[t:t + 1]
        if path == "incremental-self":
            out, w = module(q, q, q, incremental_state=state, need_weights=need_weights)
        else:
            out, w = module(q, enc, enc, key_padding_mask=pad, incremental_state=state,
                            static_kv=True, need_weights=need_weights)
        outs.append(out)
        weights.append(w)
    w = torch.cat(weights, dim=1) if need_weights and path != "incremental-self" else None
    return torch.cat(outs), w


SELF = dict(self_attention=True)
CROSS = dict(encoder_decoder_attention=True)
PATHS = [("self", SELF), ("cross", CROSS), ("incremental-self", SELF),
         ("incremental-cross", CROSS), ("beam-cross", CROSS)]


@pytest.mark.parametrize("path,kwargs", PATHS, ids=[p for p, _ in PATHS])
@pytest.mark.parametrize("need_weights", [False, True], ids=["sdpa", "explicit"])
def test_every_path_equals_stock(path, kwargs, need_weights):
    stock, ours = pair(**kwargs)
    (a, wa), (b, wb) = run(stock, path, need_weights), run(ours, path, need_weights)
    assert b.shape == (T, B * (BEAM if path == "beam-cross" else 1), C)
    assert torch.allclose(a, b, atol=1e-5)
    if wa is not None:
        assert torch.allclose(wa, wb, atol=1e-6)


@pytest.mark.parametrize("path,kwargs", PATHS, ids=[p for p, _ in PATHS])
def test_gate_and_removal_keep_the_sdpa_path(monkeypatch, path, kwargs):
    """A gate or a removed head computes with scaled_dot_product_attention on every path, and
    equals the explicit computation (which is what a caller asking for weights gets)."""
    calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(attention.F, "scaled_dot_product_attention",
                        lambda *a, **kw: calls.append(a[0].shape) or sdpa(*a, **kw))
    _, ours = pair(**kwargs)
    ours.head_gate = torch.tensor([0.5, 1.0, 0.0, 2.0])
    fast, _ = run(ours, path)
    assert len(calls) == (1 if path in ("self", "cross") else T)
    if path == "beam-cross":  # keys once per source: B groups of BEAM queries each
        assert calls[0] == (B, H, BEAM, C // H)
    calls.clear()
    explicit, _ = run(ours, path, need_weights=True)
    assert not calls
    assert torch.allclose(fast, explicit, atol=1e-5)
    ours.head_gate = None
    ours.set_kept_heads([0, 3])
    run(ours, path)
    assert calls and all(shape[1] == 2 for shape in calls)


def test_explicit_path_flag_routes_through_dropout_module():
    """explicit_path makes the probabilities pass dropout_module in fairseq's [B*H, T, S] layout
    (GHA's attn_matrix hook reads them there)."""
    _, ours = pair(**SELF)
    seen = []
    ours.dropout_module.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    run(ours, "self")
    assert not seen
    ours.explicit_path = True
    run(ours, "self")
    assert seen == [(B * H, T, T)]


def test_before_softmax_matches_stock():
    stock, ours = pair(**CROSS)
    torch.manual_seed(1)
    x, enc = torch.randn(T, B, C), torch.randn(S, B, C)
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[1, :3] = True
    sa, va = stock(x, enc, enc, key_padding_mask=pad, static_kv=True, before_softmax=True)
    sb, vb = ours(x, enc, enc, key_padding_mask=pad, static_kv=True, before_softmax=True)
    assert sb.shape == (B * H, T, S) and vb.shape == (B * H, S, C // H)
    assert torch.equal(torch.isinf(sa), torch.isinf(sb))
    finite = ~torch.isinf(sa)
    assert torch.allclose(sa[finite], sb[finite], atol=1e-5) and torch.allclose(va, vb, atol=1e-6)


def test_padding_mask_cases():
    """Hand cases: cached then new positions, either missing, and static keys."""
    prev = torch.tensor([[True, False]])
    new = torch.tensor([[False, True]])
    cpu = torch.device("cpu")
    assert append_padding_mask(None, None, 1, 3, False, cpu) is None
    assert append_padding_mask(new, prev, 1, 4, False, cpu).tolist() == [[True, False, False, True]]
    assert append_padding_mask(None, prev, 1, 3, False, cpu).tolist() == [[True, False, False]]
    assert append_padding_mask(new, None, 1, 3, False, cpu).tolist() == [[False, False, True]]
    assert append_padding_mask(new, prev, 1, 2, True, cpu) is prev


def test_attention_mask_adds_causal_and_padding():
    causal = torch.triu(torch.full((2, 2), float("-inf")), 1)
    pad = torch.tensor([[False, True], [False, False]])
    mask = attention_mask(causal, pad, 2, 1, 2, torch.float32)
    assert mask.shape == (2, 1, 2, 2)
    inf = float("-inf")
    assert mask[0, 0].tolist() == [[0.0, inf], [0.0, inf]]
    assert mask[1, 0].tolist() == [[0.0, inf], [0.0, 0.0]]
    grouped = attention_mask(torch.tensor([[False, True]]), None, 1, 3, 2, torch.float32)
    assert grouped.shape == (1, 1, 3, 2) and grouped[0, 0, :, 1].tolist() == [inf] * 3
