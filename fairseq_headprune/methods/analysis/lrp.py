"""Layer-wise relevance propagation (LRP) of each head for the model's top-1 prediction, as
Voita et al. (2019, Sec. 4.2) compute it, on fairseq Transformers.

The rule is the authors' (voita ``lib/layers/lrp.py``, ``LRP.relprop``; read, not copied): for a
function y = f(x) linearised at its input, the contribution of input i to output j is
z_ji = f(0)_j / n + J_ji x_i (zero reference input; the reference output f(0), the bias, spread
uniformly over the n inputs of a sample); each output's relevance R_j is split over the inputs
by the two-sided rule R_i = sum_j R_j (alpha z+_ji / (sum_i z+_ji + eps) + beta z-_ji /
(sum_i z-_ji - eps)), alpha = beta = 0.5, eps = 1e-5, and the input relevances are rescaled
so that their absolute values sum to the relevance that entered (``LRP.rescale``). With a
non-negative start, every relevance stays non-negative. Two departures, both about exact
conservation: ``rescale`` divides by the input total without the authors' + eps (which loses
about 1e-5 of the relevance at every step), and a residual block passes on exactly the
relevance that entered it (a block whose module has no heads left, a constant, would otherwise
keep the share the addition gave it).

It is applied (:mod:`.lrp_model`, in the authors' order: ``transformer_lrp.py``,
``attn_lrp.py``, ``basic.py``) to: the output projection (relevance 1 on the top-1 logit),
layer norms (their Jacobian), residual additions (per element between the two summands, rescaled per position), the
feed-forward block (two linear maps; the ReLU passes relevance through), and attention: the
output projection gives the relevance of each head's context (**the head's relevance**), the
softmax core per head (its Jacobian w.r.t. q, k, v), then the q/k/v projections. The encoder
receives the sum of the relevances of every cross-attention's keys and values. Samples: each
target prediction of a sentence is its own sample (relevance rescaled per prediction).

No library fits: Captum's LRP has rules for linear, convolution and pooling layers (no
attention, no layer norm) and no alpha = beta = 0.5 rule; zennit's AlphaBeta rule requires
alpha - beta = 1 and has no softmax-attention rule; neither spreads the bias over the inputs and
rescales as the authors do. So the rule is written here, with the Jacobians written out (as the
authors do), on our own modules: fairseq post-norm and pre-norm layers and
:class:`MaskedMultiheadAttention`, pruned or not. Collaborative attention and fairseq's
NormFormer extras are not supported.
"""

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

from fairseq_headprune.errors import HeadPruneError

ALPHA, BETA, EPS = 0.5, 0.5, 1e-5  # voita lib/layers/lrp.py, class LRP
ATTN_BIAS = -1e9  # masked logits, as the authors' attention (attn_lrp.py ATTN_BIAS_VALUE)


def transition(impact: torch.Tensor) -> torch.Tensor:
    """The two-sided rule: ``impact[..., out, in]`` (z_ji) -> the share of each output's
    relevance that goes to each input."""
    pos, neg = impact.clamp(min=0), impact.clamp(max=0)
    return (ALPHA * pos / (pos.sum(-1, keepdim=True) + EPS)
            + BETA * neg / (neg.sum(-1, keepdim=True) - EPS))


def rescale(reference: torch.Tensor, *inputs: torch.Tensor) -> List[torch.Tensor]:
    """Scale ``inputs`` together so that, per sample (dim 0), their absolute values sum to
    those of ``reference`` (the authors' ``LRP.rescale``, batch axis 0)."""
    def total(x):
        return x.abs().reshape(x.size(0), -1).sum(-1)

    # the authors add eps to the denominator; a guard against 0 keeps the conservation exact
    factor = total(reference) / (sum(total(x) for x in inputs)).clamp_min(1e-30)
    return [x * factor.view(-1, *[1] * (x.dim() - 1)) for x in inputs]


def relprop(R: torch.Tensor, jacobian: torch.Tensor, x: torch.Tensor,
            reference_output: torch.Tensor) -> torch.Tensor:
    """The rule for one function: ``R [samples, out]``, ``jacobian [out, in]``, input
    ``x [in]``, ``reference_output [out]`` = f(0) -> input relevance ``[samples, in]``,
    rescaled to R."""
    impact = reference_output[:, None] / x.numel() + jacobian * x[None, :]
    return rescale(R, R @ transition(impact))[0]


def relprop_linear(R: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                   bias: Optional[torch.Tensor]) -> torch.Tensor:
    """A linear map applied per position (the authors' ``Dense.relprop``): ``R [samples, T,
    out]``, ``x [T, in]`` -> ``[samples, T, in]``; each position's input its own sample of the
    rule, the result rescaled to R per sample."""
    n = x.size(-1)
    impact = weight.unsqueeze(0) * x.unsqueeze(1)  # T x out x in
    if bias is not None:
        impact = impact + bias.view(1, -1, 1) / n
    return rescale(R, torch.einsum("pto,toi->pti", R, transition(impact)))[0]


def layer_norm_jacobian(x: torch.Tensor, norm) -> torch.Tensor:
    """``[T, D, D]``: d LN(x_t) / d x_t of a layer norm (weight g, eps) at each position
    (the authors' ``LayerNorm._jacobian``): g_i (delta_ij - 1/D - xhat_i xhat_j / D) / sigma."""
    D = x.size(-1)
    sigma = (x.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()  # T x 1
    xhat = (x - x.mean(-1, keepdim=True)) / sigma
    eye = torch.eye(D, dtype=x.dtype, device=x.device)
    jac = (eye - 1.0 / D - xhat.unsqueeze(2) * xhat.unsqueeze(1) / D) / sigma.unsqueeze(2)
    return jac * norm.weight.view(1, -1, 1) if norm.weight is not None else jac


def relprop_layer_norm(R: torch.Tensor, x: torch.Tensor, norm) -> torch.Tensor:
    """A layer norm per position, through its Jacobian (the authors' ``LayerNorm.relprop``)."""
    reference = norm(torch.zeros_like(x[:1]))[0]  # the bias
    impact = reference.view(1, -1, 1) / x.size(-1) + layer_norm_jacobian(x, norm) * x.unsqueeze(1)
    return rescale(R, torch.einsum("pto,toi->pti", R, transition(impact)))[0]


def relprop_add(R: torch.Tensor, a: torch.Tensor, b: torch.Tensor
                ) -> Tuple[torch.Tensor, torch.Tensor]:
    """y = a + b, element by element between the two summands, rescaled per sample and
    position (the authors' ``relprop_add``): ``R, a, b`` broadcast as ``[samples, T, D]``."""
    pos = a.clamp(min=0) + b.clamp(min=0) + EPS
    neg = a.clamp(max=0) + b.clamp(max=0) - EPS
    Ra = R * (ALPHA * a.clamp(min=0) / pos + BETA * a.clamp(max=0) / neg)
    Rb = R * (ALPHA * b.clamp(min=0) / pos + BETA * b.clamp(max=0) / neg)
    P, T = R.shape[:2]
    Ra, Rb = rescale(R.reshape(P * T, -1), Ra.reshape(P * T, -1), Rb.reshape(P * T, -1))
    return Ra.view_as(R), Rb.view_as(R)


def attention_jacobians(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor):
    """Jacobians of one head's output o = softmax(q k^T + mask) v w.r.t. q, k, v (the
    authors' ``_attn_head_jacobian``): ``[T, d, T, d]``, ``[T, d, S, d]``, ``[T, d, S, d]``."""
    A = torch.softmax(q @ k.T + mask, dim=-1)  # T x S
    out = A @ v  # T x d
    T, d = out.shape
    eye_d = torch.eye(d, dtype=q.dtype, device=q.device)
    G = A.unsqueeze(1) * (v.T.unsqueeze(0) - out.unsqueeze(2))  # T x d x S: d o_ta / d logit_ts
    jq = torch.einsum("tas,sc->tac", G, k)  # T x d x d, only for the same position
    jq = torch.einsum("tac,tu->tauc", jq, torch.eye(T, dtype=q.dtype, device=q.device))
    jk = torch.einsum("tas,tc->tasc", G, q)
    jv = torch.einsum("ts,ab->tasb", A, eye_d)
    return jq, jk, jv


def relprop_attention_core(R: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           mask: torch.Tensor):
    """One head (the authors' ``MultiHeadAttn.relprop`` per head): ``R [samples, T, d]``;
    q ``[T, d]``, k and v ``[S, d]``; ``mask [T, S]`` additive -> (Rq, Rk, Rv). The zero
    reference gives a zero output (uniform weights times v = 0): no bias term."""
    jq, jk, jv = attention_jacobians(q, k, v, mask)
    out = q.size(0) * v.size(1)
    jacobian = torch.cat([jq.reshape(out, -1), jk.reshape(out, -1), jv.reshape(out, -1)], 1)
    x = torch.cat([q.reshape(-1), k.reshape(-1), v.reshape(-1)])
    R_in = relprop(R.reshape(R.size(0), -1), jacobian, x, x.new_zeros(out))
    P = R.size(0)
    Rq, Rk, Rv = R_in.split([q.numel(), k.numel(), v.numel()], dim=1)
    return Rq.view(P, *q.shape), Rk.view(P, *k.shape), Rv.view(P, *v.shape)


def attention_parts(module, xq: torch.Tensor, xkv: torch.Tensor, causal: bool):
    """The forward of a fairseq attention module on one sentence (``xq [T, C]``, ``xkv [S,
    C]``), split into the parts LRP needs: (output, q, k, v, context, mask), q scaled,
    q/k/v/context ``[heads, len, head_dim]``."""
    if getattr(module, "bias_k", None) is not None or getattr(module, "add_zero_attn", False):
        raise HeadPruneError("LRP does not support attention with bias_kv or zero_attn.")
    if hasattr(module, "key_dim"):
        raise HeadPruneError("LRP is not implemented for collaborative attention; run analyze "
                             "with --lrp-sentences 0.")
    H, d = module.num_heads, module.head_dim
    T, S = xq.size(0), xkv.size(0)
    mask = xq.new_zeros(T, S)
    if causal:
        mask = mask.masked_fill(torch.ones(T, S, dtype=torch.bool, device=xq.device).triu(1),
                                ATTN_BIAS)
    q = (F.linear(xq, module.q_proj.weight, module.q_proj.bias) * module.scaling)
    k = F.linear(xkv, module.k_proj.weight, module.k_proj.bias)
    v = F.linear(xkv, module.v_proj.weight, module.v_proj.bias)
    q, k, v = (t.view(-1, H, d).transpose(0, 1) for t in (q, k, v))  # H x len x d
    ctx = torch.softmax(q @ k.transpose(1, 2) + mask, dim=-1) @ v  # H x T x d
    flat = ctx.transpose(0, 1).reshape(T, H * d)
    out = F.linear(flat, module.out_proj.weight, module.out_proj.bias)
    return out, q, k, v, flat, mask


def relprop_attention(R: torch.Tensor, module, xq: torch.Tensor, xkv: torch.Tensor,
                      causal: bool, self_attention: bool):
    """Relevance through one attention module: ``R [samples, T, C]`` on its output ->
    (head relevance ``[samples, heads]``, R at the query input, R at the key/value input, or
    None for self-attention, where both are the same input and the first holds the sum)."""
    P = R.size(0)
    H, d = module.num_heads, module.head_dim
    if H == 0:  # the output is out_proj's bias: nothing flows to the inputs
        zero = R.new_zeros(P, xq.size(0), xq.size(1))
        return R.new_zeros(P, 0), zero, None if self_attention else R.new_zeros(
            P, xkv.size(0), xkv.size(1))
    _, q, k, v, flat, mask = attention_parts(module, xq, xkv, causal)
    R_ctx = relprop_linear(R, flat, module.out_proj.weight, module.out_proj.bias)  # P x T x H*d
    heads = R_ctx.view(P, -1, H, d).sum(dim=(1, 3))
    Rq, Rk, Rv = [], [], []
    for h in range(H):
        rq, rk, rv = relprop_attention_core(R_ctx[:, :, h * d:(h + 1) * d], q[h], k[h], v[h],
                                            mask)
        Rq.append(rq), Rk.append(rk), Rv.append(rv)
    Rq, Rk, Rv = (torch.cat(x, dim=-1) for x in (Rq, Rk, Rv))  # P x len x H*d
    Rq, Rk, Rv = rescale(R_ctx, Rq, Rk, Rv)
    W = [module.q_proj, module.k_proj, module.v_proj]
    if self_attention:  # the authors' combined projection
        weight = torch.cat([p.weight for p in W])
        bias = torch.cat([p.bias for p in W]) if W[0].bias is not None else None
        return heads, relprop_linear(torch.cat([Rq, Rk, Rv], -1), xq, weight, bias), None
    R_xq = relprop_linear(Rq, xq, module.q_proj.weight, module.q_proj.bias)
    weight = torch.cat([module.k_proj.weight, module.v_proj.weight])
    bias = torch.cat([module.k_proj.bias, module.v_proj.bias]) \
        if module.k_proj.bias is not None else None
    return heads, R_xq, relprop_linear(torch.cat([Rk, Rv], -1), xkv, weight, bias)


def relprop_ffn(R: torch.Tensor, layer, x: torch.Tensor) -> torch.Tensor:
    """fc2(act(fc1(x))) as the authors' FFN: two linear maps, relevance through the activation
    unchanged."""
    hidden = layer.activation_fn(F.linear(x, layer.fc1.weight, layer.fc1.bias))
    R = relprop_linear(R, hidden, layer.fc2.weight, layer.fc2.bias)
    return relprop_linear(R, x, layer.fc1.weight, layer.fc1.bias)


def total(x: torch.Tensor) -> torch.Tensor:
    """Per sample (dim 0): the sum of absolute relevances."""
    return x.abs().reshape(x.size(0), -1).sum(-1)


def _scaled(x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return x * (target / total(x).clamp_min(1e-30)).view(-1, *[1] * (x.dim() - 1))


def relprop_residual(R: torch.Tensor, x: torch.Tensor, norm, pre_norm: bool, sublayer):
    """A residual block, y = LN(x + f(x)) (post-norm) or y = x + f(LN(x)) (pre-norm), as the
    authors' ``ResidualLayerWrapper.relprop``. ``sublayer(x_in)`` returns f(x_in) and a function
    from R at f's output to (R at x_in, extra), extra being the cross-attention's key/value
    relevance (else None). Returns (R at x, extra); their totals are those of R per sample."""
    entering = total(R)
    inner = norm(x) if pre_norm else x
    update, back = sublayer(inner)
    if not pre_norm:
        R = relprop_layer_norm(R, x + update, norm)
    R_res, R_update = relprop_add(R, x.unsqueeze(0), update.unsqueeze(0))
    R_inner, extra = back(R_update)
    if pre_norm:
        R_inner = relprop_layer_norm(R_inner, x, norm)
    # the block passes on exactly the relevance that entered it: the authors scale the sum to
    # |R_inner| + |R_res| (equal up to eps) and, with key/value relevance, the pair to the
    # entering total; a module with no heads (a constant output) would otherwise absorb its share
    R_x = R_inner + R_res
    if extra is None:
        R_x = _scaled(R_x, entering)
    else:
        share = entering / (total(R_x) + total(extra)).clamp_min(1e-30)
        R_x, extra = _scaled(R_x, total(R_x) * share), _scaled(extra, total(extra) * share)
    return R_x, extra
