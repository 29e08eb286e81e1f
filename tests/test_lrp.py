"""LRP head relevance (Voita et al. 2019, Sec. 4.2; the authors' rule in voita
lib/layers/lrp.py): hand-computed toy networks, the Jacobians written out against autograd,
conservation and faithfulness on a real (pruned) fairseq model."""

import pytest
import torch
from conftest import batch, load
from torch.func import jacrev

from fairseq_headprune.methods.analysis import lrp, lrp_model


def linear(R, x, W, b=None):
    """relprop_linear on one sample and one position."""
    W = torch.tensor(W, dtype=torch.float64)
    b = None if b is None else torch.tensor(b, dtype=torch.float64)
    x = torch.tensor([x], dtype=torch.float64)
    R = torch.tensor([[R]], dtype=torch.float64)
    return lrp.relprop_linear(R, x, W, b)[0, 0]


def test_two_sided_rule_gives_half_to_each_sign():
    # z = W x = [2, -1]: alpha 0.5 of the relevance to the positive input, beta 0.5 to the
    # negative one
    R = linear([1.0], [2.0, -0.5], [[1.0, 2.0]])
    assert torch.allclose(R, torch.tensor([0.5, 0.5], dtype=torch.float64), atol=1e-5)


def test_bias_is_spread_uniformly_over_the_inputs():
    # h = [3, 0], y = h1 - h2 + 1: z = 1/2 + W h = [3.5, 0.5], all positive
    R = linear([1.0], [3.0, 0.0], [[1.0, -1.0]], [1.0])
    assert torch.allclose(R, torch.tensor([0.875, 0.125], dtype=torch.float64), atol=1e-5)


def test_two_layer_toy_network_by_hand():
    """x = [1, 1] -> h = relu(W1 x) = [3, 0] -> y = W2 h + 1. Layer 2 (above): R_h = [7/8,
    1/8]. Layer 1: unit 1 (z = [1, 2]) gives 7/8 * [1/6, 1/3]; unit 2 (z = [-1, 1]) gives
    1/8 * [1/2, 1/2]; total [0.2083, 0.3542] = 9/16, rescaled to 1: [10/27, 17/27]."""
    W1, W2 = [[1.0, 2.0], [-1.0, 1.0]], [[1.0, -1.0]]
    R_h = linear([1.0], [3.0, 0.0], W2, [1.0])
    R_x = linear(R_h.tolist(), [1.0, 1.0], W1, [0.0, 0.0])
    assert torch.allclose(R_x, torch.tensor([10 / 27, 17 / 27], dtype=torch.float64), atol=1e-5)
    # conservation: each layer's relevances sum to the relevance that entered it
    assert abs(R_h.sum().item() - 1.0) < 1e-5 and abs(R_x.sum().item() - 1.0) < 1e-5


def test_residual_addition_and_rescale_conserve_per_position():
    R = torch.rand(3, 5, 4)
    a, b = torch.randn(1, 5, 4), torch.randn(1, 5, 4)
    Ra, Rb = lrp.relprop_add(R, a, b)
    assert torch.allclose(Ra.abs().sum(-1) + Rb.abs().sum(-1), R.abs().sum(-1), atol=1e-5)
    # one element with a = 2, b = -1: half to each summand
    Ra, Rb = lrp.relprop_add(torch.ones(1, 1, 1), torch.tensor([[[2.0]]]),
                             torch.tensor([[[-1.0]]]))
    assert torch.allclose(torch.cat([Ra, Rb]).flatten(), torch.tensor([0.5, 0.5]), atol=1e-4)


def test_written_out_jacobians_match_autograd():
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2), torch.randn(4, 2), torch.randn(4, 2)
    mask = torch.zeros(3, 4)
    mask[0, 2:] = lrp.ATTN_BIAS

    def core(q, k, v):
        return torch.softmax(q @ k.T + mask, dim=-1) @ v

    for mine, auto in zip(lrp.attention_jacobians(q, k, v, mask),
                          jacrev(core, argnums=(0, 1, 2))(q, k, v)):
        assert mine.shape == auto.shape and torch.allclose(mine, auto, atol=1e-6)
    norm = torch.nn.LayerNorm(6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(5, 6)
    auto = torch.stack([jacrev(norm)(row) for row in x])
    assert torch.allclose(lrp.layer_norm_jacobian(x, norm), auto, atol=1e-5)


@pytest.fixture(scope="module")
def pruned_model(headprune_checkpoint, data_dir):
    from fairseq_headprune.heads.layout import HeadLayout

    model, task = load(headprune_checkpoint, data_dir)
    layout = HeadLayout.from_model(model)
    for kind, layer, gone in (("E", 0, [1]), ("D", 1, [0, 1, 2, 3]), ("A", 0, [2])):
        layout.kept[kind][layer] = [h for h in layout.kept[kind][layer] if h not in gone]
    layout.apply(model)  # E:1:2 D:2:1-4 A:1:3 removed
    return model, task


def test_relevance_on_a_pruned_model_is_conserved_and_faithful(pruned_model):
    model, task = pruned_model
    sample = batch(task, "valid", max_sentences=1)
    rel = lrp_model.HeadRelevance(model)
    with torch.no_grad(), lrp_model.LayerInputs(model) as store:
        model(**sample["net_input"])
    enc = store["encoder_out"][:, 0]
    for stack, extra in (("encoder", None), ("decoder", enc)):  # our forward is fairseq's
        for i, layer in enumerate(getattr(model, stack).layers):
            mine = rel.forward_layer(layer, store[f"{stack}.{i}.in"][:, 0], extra)[-1]
            assert torch.allclose(mine, store[f"{stack}.{i}.out"][:, 0], atol=1e-5)
    T = sample["target"].size(1)
    heads = rel.sentence(sample, list(range(T - 1)))
    assert [name for name, _, _ in rel.trace] == [
        "D2.ffn", "A2", "D2.self", "D1.ffn", "A1", "D1.self", "E2.ffn", "E2", "E1.ffn", "E1"]
    for name, entering, leaving in rel.trace:  # every block passes on what entered it
        assert torch.allclose(entering, leaving, rtol=1e-5, atol=1e-6), name
    assert torch.allclose(rel.trace[0][1], torch.ones(T - 1))  # 1 per top-1 logit
    assert heads[("D", 1)].shape == (0,) and heads[("E", 0)].shape == (3,)
    assert heads[("A", 0)].shape == (3,) and heads[("E", 1)].shape == (4,)
    assert all(bool((h >= 0).all()) for h in heads.values())
    assert all(float(h.sum()) > 0 for k, h in heads.items() if k != ("D", 1))


def test_pre_norm_layers_are_followed_too(headprune_checkpoint, data_dir):
    """The same weights run as pre-norm layers (y = x + f(LN(x))): our forward is still
    fairseq's, and relevance is still conserved block by block."""
    model, task = load(headprune_checkpoint, data_dir)
    for stack in (model.encoder, model.decoder):
        for layer in stack.layers:
            layer.normalize_before = True
    sample = batch(task, "valid", max_sentences=1)
    rel = lrp_model.HeadRelevance(model)
    with torch.no_grad(), lrp_model.LayerInputs(model) as store:
        model(**sample["net_input"])
    layer = model.decoder.layers[1]
    mine = rel.forward_layer(layer, store["decoder.1.in"][:, 0], store["encoder_out"][:, 0])
    assert torch.allclose(mine[-1], store["decoder.1.out"][:, 0], atol=1e-5)
    heads = rel.sentence(sample, [0, 1])
    for name, entering, leaving in rel.trace:
        assert torch.allclose(entering, leaving, rtol=1e-5, atol=1e-6), name
    assert sorted(heads) == [(k, i) for k in "ADE" for i in (0, 1)]
