"""TorchScript: a transformer_headprune model, pruned down to zero-head layers, and fairseq's
SequenceGenerator over it script as the stock transformer does, with equal outputs."""

import io

import pytest
import torch
from conftest import batch, load
from fairseq.sequence_generator import SequenceGenerator

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.heads.spec import parse_head_spec
from fairseq_headprune.pruning.checkpoint import checkpoint_layout, load_checkpoint, save_checkpoint
from fairseq_headprune.pruning.convert import convert_state
from fairseq_headprune.pruning.masking import mask_heads
from fairseq_headprune.pruning.remove import remove_heads

SPEC = "E:1:1,3 E:2:1-4 D:1:2 D:2:1-4 A:1:4 A:2:1-4"  # zero heads in one layer of each type


@pytest.fixture(scope="module")
def pruned(stock_checkpoint, tmp_path_factory):
    state = convert_state(load_checkpoint(stock_checkpoint), stock_checkpoint)
    remove_heads(state["model"], checkpoint_layout(state), parse_head_spec(SPEC))
    path = str(tmp_path_factory.mktemp("export") / "pruned.pt")
    save_checkpoint(state, path)
    return path


def reloaded(scripted):
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    buffer.seek(0)
    return torch.jit.load(buffer)


def test_scripted_pruned_model_equals_eager(pruned, data_dir):
    model, task = load(pruned, data_dir)
    assert [m.num_heads for m in (model.encoder.layers[1].self_attn,
                                  model.decoder.layers[1].encoder_attn)] == [0, 0]
    scripted = reloaded(torch.jit.script(model))
    sample = batch(task)
    with torch.no_grad():
        eager_out = model(**sample["net_input"])[0]
        script_out = scripted(**sample["net_input"])[0]
    assert eager_out.shape == script_out.shape
    assert torch.allclose(eager_out, script_out, atol=1e-6)


def test_scripted_sequence_generator_equals_eager(pruned, data_dir):
    model, task = load(pruned, data_dir)
    sample = batch(task)
    net_input = {k: sample["net_input"][k] for k in ("src_tokens", "src_lengths")}
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=3, max_len_b=12)
    with torch.no_grad():
        eager = generator.generate([model], {"net_input": net_input})
    scripted = reloaded(torch.jit.script(generator))
    with torch.no_grad():
        ours = scripted({"net_input": net_input})
    assert len(ours) == len(eager)
    for a, b in zip(eager, ours):
        assert [h["tokens"].tolist() for h in a] == [h["tokens"].tolist() for h in b]
        assert torch.allclose(torch.stack([h["score"] for h in a]),
                              torch.stack([h["score"] for h in b]), atol=1e-5)


def test_alignment_from_a_layer_without_cross_heads(pruned, data_dir):
    """--print-alignment reads the last layer's per-head cross attention, which SPEC empties:
    generation goes on (it raised an IndexError) and the hypotheses' attention, the mean over
    no heads, is NaN: undefined, as the README says, not a made-up alignment."""
    from fairseq.sequence_generator import SequenceGeneratorWithAlignment

    model, task = load(pruned, data_dir)
    sample = batch(task)
    generator = SequenceGeneratorWithAlignment([model], task.target_dictionary, beam_size=2,
                                               max_len_b=6, print_alignment="hard")
    with torch.no_grad():
        hypos = generator.generate([model], sample)
    for hyps in hypos:
        assert hyps[0]["attention"].shape[1] == len(hyps[0]["tokens"])
        assert torch.isnan(hyps[0]["attention"]).all()


def test_gated_model_is_refused_in_one_sentence(pruned, data_dir):
    model, _ = load(pruned, data_dir)
    mask_heads(model, parse_head_spec("E:1:2"))
    with pytest.raises(HeadPruneError, match=r"^a model with head gates cannot be scripted: fold"):
        torch.jit.script(model)
