"""MaskedMultiheadAttention against fairseq's MultiheadAttention: gates, removal, every code path."""

import copy

import pytest
import torch
from fairseq.modules import MultiheadAttention

from fairseq_headprune.model.attention import MaskedMultiheadAttention

T, S, B, C, H = 5, 7, 3, 16, 4  # target len, source len, batch, channels, heads
D = C // H


def pair(**kwargs):
    torch.manual_seed(0)
    stock = MultiheadAttention(C, H, **kwargs)
    masked = MaskedMultiheadAttention(C, H, **kwargs)
    masked.load_state_dict(stock.state_dict(), strict=False)
    with torch.no_grad():  # non-zero biases so that zero-head layers are tested for real
        for m in (stock, masked):
            for p in (m.q_proj.bias, m.k_proj.bias, m.v_proj.bias, m.out_proj.bias):
                p.copy_(torch.linspace(-1, 1, p.numel()))
    return stock.eval(), masked.eval()


def inputs():
    torch.manual_seed(1)
    x = torch.randn(T, B, C)
    enc = torch.randn(S, B, C)
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[0, -2:] = True
    return x, enc, pad


def self_attn(m, x):
    causal = torch.triu(torch.full((T, T), float("-inf")), 1)
    return m(x, x, x, attn_mask=causal, need_weights=False)[0]


def cross_attn(m, x, enc, pad):
    return m(x, enc, enc, key_padding_mask=pad, static_kv=True)[0]


def incremental(m, x, **kw):
    """Decode step by step with fairseq's incremental state; return outputs and the cache."""
    state, outs = {}, []
    for t in range(T):
        q = x[t:t + 1]
        if m.encoder_decoder_attention:
            outs.append(m(q, kw["enc"], kw["enc"], key_padding_mask=kw["pad"],
                          incremental_state=state, static_kv=True)[0])
        else:
            outs.append(m(q, q, q, incremental_state=state)[0])
    return torch.cat(outs), m._get_input_buffer(state)


def test_no_gate_is_exactly_stock_fast_path():
    stock, masked = pair(self_attention=True)
    x, _, _ = inputs()
    assert not masked.skip_embed_dim_check
    assert torch.equal(self_attn(stock, x), self_attn(masked, x))


def test_gate_of_ones_equals_stock_on_slow_path():
    stock, masked = pair(self_attention=True)
    x, _, _ = inputs()
    masked.head_gate = torch.ones(H)
    assert masked.skip_embed_dim_check
    assert torch.allclose(self_attn(stock, x), self_attn(masked, x), atol=1e-6)


def test_gate_scales_head_context_before_out_proj():
    """Hand-computed: with heads 0 and 2 closed, out = out_proj(ctx with those slices zeroed)."""
    _, masked = pair(self_attention=True)
    x, _, _ = inputs()
    ctx = []
    masked.out_proj.register_forward_hook(lambda mod, inp, out: ctx.append(inp[0]))
    full = self_attn(masked, x)
    masked.head_gate = torch.tensor([0.0, 1.0, 0.0, 1.0])
    gated = self_attn(masked, x)
    zeroed = ctx[0].clone()
    zeroed[..., 0:D] = 0
    zeroed[..., 2 * D:3 * D] = 0
    w, b = masked.out_proj.weight, masked.out_proj.bias
    assert torch.allclose(full, ctx[0] @ w.T + b, atol=1e-6)
    assert torch.allclose(gated, zeroed @ w.T + b, atol=1e-6)


def test_gate_gradient_is_available_and_per_sentence():
    _, masked = pair(self_attention=True)
    x, _, _ = inputs()
    gate = torch.ones(B, H, requires_grad=True)
    masked.head_gate = gate
    self_attn(masked, x).sum().backward()
    per_sentence = gate.grad.clone()
    batch_gate = torch.ones(H, requires_grad=True)
    masked.head_gate = batch_gate
    self_attn(masked, x).sum().backward()
    assert per_sentence.shape == (B, H)
    assert torch.allclose(per_sentence.sum(0), batch_gate.grad, atol=1e-5)


CASES = [([1], "one head"), ([0, 3], "two heads"), ([0, 1, 2, 3], "all heads")]


@pytest.mark.parametrize("closed,_name", CASES)
@pytest.mark.parametrize("path", ["self", "cross", "incremental_self", "incremental_cross"])
def test_removed_equals_masked(closed, _name, path):
    kind = {"self_attention": True} if "self" in path else {"encoder_decoder_attention": True}
    _, masked = pair(**kind)
    removed = copy.deepcopy(masked)
    masked.head_gate = torch.tensor([0.0 if h in closed else 1.0 for h in range(H)])
    removed.set_kept_heads([h for h in range(H) if h not in closed])
    kept = H - len(closed)
    assert removed.q_proj.weight.shape == (kept * D, C)
    assert removed.out_proj.weight.shape == (C, kept * D)
    assert removed.out_proj.in_features == kept * D
    x, enc, pad = inputs()
    if path == "self":
        a, b = self_attn(masked, x), self_attn(removed, x)
    elif path == "cross":
        a, b = cross_attn(masked, x, enc, pad), cross_attn(removed, x, enc, pad)
    else:
        (a, _), (b, cache) = incremental(masked, x, enc=enc, pad=pad), \
            incremental(removed, x, enc=enc, pad=pad)
        if kept:  # the cache holds only the surviving heads
            length = S if "cross" in path else T
            assert cache["prev_key"].shape == (B, kept, length, D)
            assert cache["prev_value"].shape == (B, kept, length, D)
        else:
            assert cache == {}
    assert torch.allclose(a, b, atol=1e-6)
    if kept == 0:
        assert torch.allclose(b, removed.out_proj.bias.expand(T, B, C))


def test_set_kept_heads_moves_weights_and_grows_with_zeros():
    _, masked = pair(self_attention=True)
    q = masked.q_proj.weight.detach().clone()
    masked.set_kept_heads([1, 3])
    assert masked.kept_heads.tolist() == [1, 3]
    assert torch.equal(masked.q_proj.weight[:D], q[D:2 * D])
    assert torch.equal(masked.q_proj.weight[D:], q[3 * D:])
    masked.set_kept_heads([0, 3])
    assert torch.equal(masked.q_proj.weight[:D], torch.zeros(D, C))
    assert torch.equal(masked.q_proj.weight[D:], q[3 * D:])


def test_state_dict_adopts_checkpoint_layout():
    _, masked = pair(encoder_decoder_attention=True)
    pruned = copy.deepcopy(masked)
    pruned.set_kept_heads([2])
    fresh = MaskedMultiheadAttention(C, H, encoder_decoder_attention=True)
    sd = pruned.state_dict()
    fresh.upgrade_state_dict_named(sd, "")
    fresh.load_state_dict(sd)
    assert fresh.kept_heads.tolist() == [2] and fresh.num_heads == 1
    x, enc, pad = inputs()
    assert torch.equal(cross_attn(fresh.eval(), x, enc, pad), cross_attn(pruned, x, enc, pad))
