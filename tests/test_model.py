"""transformer_headprune as a whole: equal to stock fairseq when open, masked equals removed."""

from argparse import Namespace

import pytest
import torch
from conftest import assert_same_hypotheses, batch, beam_search, load, loss, old_format

from fairseq_headprune.heads.layout import HeadLayout, attention_modules
from fairseq_headprune.heads.spec import parse_head_spec
from fairseq_headprune.pruning.checkpoint import (
    checkpoint_layout,
    count_parameters,
    load_checkpoint,
    save_checkpoint,
)
from fairseq_headprune.pruning.convert import convert_state
from fairseq_headprune.pruning.masking import mask_heads, remove_heads_from_model
from fairseq_headprune.pruning.remove import remove_heads


@pytest.fixture(scope="module")
def converted(stock_checkpoint, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("conv") / "converted.pt")
    save_checkpoint(convert_state(load_checkpoint(stock_checkpoint), stock_checkpoint), path)
    return path


def outputs(model, sample):
    with torch.no_grad():
        enc = model.encoder(**{k: sample["net_input"][k] for k in ("src_tokens", "src_lengths")})
        logits, extra = model(**sample["net_input"])
    return enc["encoder_out"][0], logits


def test_converted_equals_stock(stock_checkpoint, converted, data_dir):
    stock, task = load(stock_checkpoint, data_dir)
    ours, _ = load(converted, data_dir)
    assert type(ours).__name__ == "HeadPruneTransformerModel"
    sample = batch(task)
    for a, b in zip(outputs(stock, sample), outputs(ours, sample)):
        assert torch.allclose(a, b, atol=1e-6)
    assert torch.allclose(loss(stock, task, sample), loss(ours, task, sample), atol=1e-6)
    assert_same_hypotheses(beam_search(stock, task, sample), beam_search(ours, task, sample))


def test_convert_old_published_format(stock_checkpoint, data_dir, tmp_path):
    """An args-style checkpoint with 2018 weight names (the published models Michel et al.
    used) converts: today's names, options as ``cfg`` only (no ``args`` left to rebuild them
    from on the next load), all heads listed; outputs equal stock fairseq's on the original,
    and the result prunes."""
    import fairseq_headprune.cli as entry

    old = old_format(stock_checkpoint, str(tmp_path / "old.pt"))
    stock, task = load(stock_checkpoint, data_dir)
    upgraded_by_fairseq, _ = load(old, data_dir)  # the fixture is a format fairseq still reads
    sample = batch(task)
    for a, b in zip(outputs(stock, sample), outputs(upgraded_by_fairseq, sample)):
        assert torch.equal(a, b)

    out = str(tmp_path / "converted.pt")
    entry.main(["convert", "--path", old, "-o", out])
    raw = torch.load(out, weights_only=False)
    assert raw["args"] is None and raw["cfg"]["model"].arch == "transformer_headprune"
    assert not [k for k in raw["model"] if "in_proj" in k or "layer_norms" in k or "embed_out" in k]
    assert all(raw["model"][k].device.type == "cpu" for k in raw["model"])
    assert checkpoint_layout(load_checkpoint(out)).count() == 24
    ours, _ = load(out, data_dir)
    assert type(ours).__name__ == "HeadPruneTransformerModel"
    for a, b in zip(outputs(stock, sample), outputs(ours, sample)):
        assert torch.allclose(a, b, atol=1e-6)
    assert_same_hypotheses(beam_search(stock, task, sample), beam_search(ours, task, sample))
    pruned = str(tmp_path / "pruned.pt")
    entry.main(["prune", "--path", out, "--heads", "E:1:2", "-o", pruned])
    assert checkpoint_layout(load_checkpoint(pruned)).count("E") == 7


def test_open_gates_equal_stock_on_gated_path(stock_checkpoint, converted, data_dir):
    """Gates of 1 force fairseq's unfused path everywhere; results still match stock."""
    stock, task = load(stock_checkpoint, data_dir)
    ours, _ = load(converted, data_dir)
    for _, _, module in attention_modules(ours):
        module.head_gate = torch.ones(module.num_heads)
    sample = batch(task)
    for a, b in zip(outputs(stock, sample), outputs(ours, sample)):
        assert torch.allclose(a, b, atol=1e-6)
    assert_same_hypotheses(beam_search(stock, task, sample), beam_search(ours, task, sample))


SPECS = [
    "E:1:2",                                # one encoder self-attention head
    "D:2:1,4",                              # decoder self-attention
    "A:1:3",                                # encoder-decoder attention
    "E:2:1-4",                              # a zero-head encoder layer
    "D:1:1-4 A:2:1-4",                      # zero-head decoder layers of both kinds
    "E:1:1,2 E:2:4 D:1:3 D:2:1,2,3 A:1:1 A:2:2,3,4",  # different counts everywhere
]


@pytest.mark.parametrize("spec", SPECS)
def test_removed_equals_masked(converted, data_dir, tmp_path, spec):
    heads = parse_head_spec(spec)
    masked, task = load(converted, data_dir)
    mask_heads(masked, heads)
    state = load_checkpoint(converted)
    remove_heads(state["model"], checkpoint_layout(state), heads)
    path = str(tmp_path / "pruned.pt")
    save_checkpoint(state, path)
    removed, _ = load(path, data_dir)
    expected = HeadLayout.from_model(masked)
    for kind, layers in heads.items():
        for layer, hs in layers.items():
            expected.kept[kind][layer] = [h for h in expected.kept[kind][layer] if h not in hs]
    assert HeadLayout.from_model(removed) == expected
    sample = batch(task)
    for a, b in zip(outputs(masked, sample), outputs(removed, sample)):
        assert torch.allclose(a, b, atol=1e-6)
    assert torch.allclose(loss(masked, task, sample), loss(removed, task, sample), atol=1e-5)
    assert_same_hypotheses(beam_search(masked, task, sample), beam_search(removed, task, sample),
                           atol=1e-5)


def test_in_memory_removal_matches_state_dict_removal(converted, data_dir):
    heads = parse_head_spec(SPECS[-1])
    live, _ = load(converted, data_dir)
    remove_heads_from_model(live, heads)
    state = load_checkpoint(converted)
    remove_heads(state["model"], checkpoint_layout(state), heads)
    sd = live.state_dict()
    assert sd.keys() == state["model"].keys()
    for key, value in state["model"].items():
        assert torch.equal(sd[key], value), key
    assert count_parameters(sd) == sum(p.numel() for p in live.parameters())


def test_pruning_twice_composes(converted):
    once = load_checkpoint(converted)
    remove_heads(once["model"], checkpoint_layout(once), parse_head_spec("E:1:1,3 A:2:2"))
    twice = load_checkpoint(converted)
    remove_heads(twice["model"], checkpoint_layout(twice), parse_head_spec("E:1:3"))
    remove_heads(twice["model"], checkpoint_layout(twice), parse_head_spec("E:1:1,3 A:2:2"))
    assert once["model"].keys() == twice["model"].keys()
    for key in once["model"]:
        assert torch.equal(once["model"][key], twice["model"][key])


def test_head_layout_option_builds_exact_shapes(converted, data_dir):
    """A model built from --head-layout alone has the pruned shapes before any weight is loaded."""
    from fairseq import tasks

    model, task = load(converted, data_dir)
    layout = HeadLayout.from_model(model)
    layout.kept["E"][0] = [1]
    layout.kept["A"][1] = []
    args = model.args
    args.head_layout = layout.to_json()
    rebuilt = tasks.setup_task(args).build_model(args)
    assert HeadLayout.from_model(rebuilt) == layout
    assert rebuilt.encoder.layers[0].self_attn.q_proj.weight.shape == (4, 16)
    assert rebuilt.decoder.layers[1].encoder_attn.out_proj.weight.shape == (16, 0)


def _tiny(cls, **extra):
    from argparse import Namespace

    from fairseq.data import Dictionary
    from fairseq.models.transformer import base_architecture

    d = Dictionary()
    for i in range(20):
        d.add_symbol(f"w{i}")
    args = Namespace(encoder_layers=2, decoder_layers=2, encoder_embed_dim=16,
                     decoder_embed_dim=16, encoder_attention_heads=4, decoder_attention_heads=4,
                     encoder_ffn_embed_dim=32, decoder_ffn_embed_dim=32, **extra)
    base_architecture(args)
    return cls.build_model(args, Namespace(source_dictionary=d, target_dictionary=d))


def test_retain_dropout_modules_takes_the_stock_class_names():
    """fairseq matches --retain-dropout-modules on the dropout modules' names: ours carry the
    names the stock transformer gives them."""
    from fairseq.models.transformer import TransformerModel
    from fairseq.modules.fairseq_dropout import FairseqDropout

    from fairseq_headprune.model.transformer import HeadPruneTransformerModel

    def names(model):
        return sorted((n, m.module_name) for n, m in model.named_modules()
                      if isinstance(m, FairseqDropout))

    stock, ours = _tiny(TransformerModel), _tiny(HeadPruneTransformerModel)
    assert names(ours) == names(stock)
    ours.prepare_for_inference_(Namespace(generation=Namespace(
        retain_dropout=True, retain_dropout_modules=["TransformerEncoder", "MultiheadAttention"])))
    applied = {n for n, m in ours.named_modules() if isinstance(m, FairseqDropout)
               and m.apply_during_inference}
    assert "encoder.dropout_module" in applied and "decoder.dropout_module" not in applied
    assert "decoder.layers.1.encoder_attn.dropout_module" in applied


@pytest.mark.parametrize("kind, flags", [
    ("hard_concrete", dict(checkpoint_activations=True)),
    ("subset", dict(offload_activations=True, subset_heads="50%")),
])
def test_trained_gates_with_activation_checkpointing_are_refused(kind, flags):
    """Stochastic gates drawn inside a checkpointed layer would get no gradient (fairseq runs
    its first pass without one) and a different sample on recomputation: one sentence."""
    from fairseq_headprune.errors import HeadPruneError
    from fairseq_headprune.model.transformer import HeadPruneTransformerModel

    flag = "--checkpoint-activations" if "checkpoint_activations" in flags else \
        "--offload-activations"
    with pytest.raises(HeadPruneError) as err:
        _tiny(HeadPruneTransformerModel, head_gates=kind, head_gates_types="E,D,A", **flags)
    assert str(err.value) == (
        f"{kind} gates cannot be trained with {flag}: their sample is drawn once per batch "
        f"inside the first layer, which activation checkpointing runs without gradients and "
        f"recomputes; drop {flag}.")
    masked = _tiny(HeadPruneTransformerModel, head_gates="mask", checkpoint_activations=True)
    assert masked.head_gates.kind == "mask"  # fixed gates have nothing to train


def test_checkpoint_activations_give_the_same_loss_and_gradients():
    """--checkpoint-activations (and --offload-activations) wrap our layers as fairseq wraps the
    stock ones; recomputation in backward gives the same gradients, heads removed included."""
    from fairseq_headprune.model.transformer import HeadPruneTransformerModel

    torch.manual_seed(0)
    plain = _tiny(HeadPruneTransformerModel)
    for offload in (False, True):
        ckpt = _tiny(HeadPruneTransformerModel, checkpoint_activations=True,
                     offload_activations=offload)
        assert hasattr(ckpt.encoder.layers[0], "precheckpoint_forward")
        ckpt.load_state_dict(plain.state_dict())
        for model in (plain, ckpt):
            model.zero_grad()
        spec = {"E": {0: [1]}, "A": {1: [0, 2]}}
        if offload:
            remove_heads_from_model(plain, spec)
            remove_heads_from_model(ckpt, spec)
        src = torch.randint(4, 24, (3, 7))
        losses = []
        for model in (plain, ckpt):
            model.train()
            torch.manual_seed(1)  # the same dropout masks
            out = model(src, torch.full((3,), 7), src)[0]
            loss = out.logsumexp(-1).sum()
            loss.backward()
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], rel=1e-6)
        for (name, a), (_, b) in zip(plain.named_parameters(), ckpt.named_parameters()):
            assert torch.allclose(a.grad, b.grad, atol=1e-6), name
