"""Cordonnier et al. (2020) collaborative attention: the notes' oracles, exactness of the
re-parametrisation on every attention path, the shared-key cache, removal, the ``collab`` command."""

import copy
import json

import pytest
import torch
from conftest import (
    TINY_MODEL, TRAIN, USER_DIR, assert_same_hypotheses, batch, beam_search, cli, load, run)
from fairseq.modules import MultiheadAttention

from fairseq_headprune.heads.layout import attention_modules, module_prefix
from fairseq_headprune.methods.collab import qk_tensor, reparametrise_module, cp_factors
from fairseq_headprune.model.collaborative import CollaborativeAttention, concatenate_mixing
from fairseq_headprune.pruning.remove import remove_module_heads
from test_attention import B, C, H, S, T, cross_attn, incremental, inputs, self_attn

D = C // H


def collab_of(stock: MultiheadAttention, key_dim: int, heads=H, seed=0) -> CollaborativeAttention:
    """The collaborative re-parametrisation of a stock attention module, through the state dict
    path the ``collab`` command takes."""
    sd = {k: v.clone() for k, v in stock.state_dict().items()}
    sd["kept_heads"] = torch.arange(heads)
    reparametrise_module(sd, "", key_dim, stock.head_dim, seed)
    module = CollaborativeAttention(stock.embed_dim, heads, key_dim, kdim=stock.kdim,
                                    vdim=stock.vdim, bias=stock.v_proj.bias is not None,
                                    self_attention=stock.self_attention,
                                    encoder_decoder_attention=stock.encoder_decoder_attention)
    module.load_state_dict(sd)
    return module.eval()


def stock_module(**kwargs) -> MultiheadAttention:
    torch.manual_seed(0)
    m = MultiheadAttention(C, H, **kwargs)
    with torch.no_grad():  # biases that matter: the query bias becomes the content bias
        for p in (m.q_proj.bias, m.k_proj.bias, m.v_proj.bias, m.out_proj.bias):
            p.copy_(torch.linspace(-1, 1, p.numel()))
    return m.eval()


def toy():
    """METHODS_NOTES 6.5: D_in 2, H 2, head_dim 1, as encoder-decoder attention."""
    m = MultiheadAttention(2, 2, encoder_decoder_attention=True)
    with torch.no_grad():
        m.q_proj.weight.copy_(torch.tensor([[1.0, 2.0], [1.0, 0.0]]))
        m.k_proj.weight.copy_(torch.tensor([[0.0, 1.0], [1.0, 1.0]]))
        m.q_proj.bias.copy_(torch.tensor([0.5, -1.0]))
        m.k_proj.bias.copy_(torch.tensor([0.3, 0.2]))
    return m.eval()


def test_oracle_query_key_tensor_and_scores():
    m = toy()
    t = qk_tensor(m.q_proj.weight, m.k_proj.weight, 2)
    assert torch.equal(t[:, 0, :], torch.tensor([[0.0, 1.0], [0.0, 2.0]]))
    assert torch.equal(t[:, 1, :], torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
    x, y = torch.tensor([1.0, 1.0]), torch.tensor([2.0, -1.0])
    assert torch.einsum("q,qhk,k->h", x, t, y).tolist() == [-3.0, 1.0]


def test_oracle_content_bias_and_the_constant_that_cancels():
    """Full scores -2.45 / 0; collaborative = product + content bias = -3.5 / 0; the difference
    is the key-constant term (x W_Q,h + b_Q,h) b_K,h = 1.05 / 0."""
    m = toy()
    collab = collab_of(m, 2, heads=2)
    assert torch.allclose(collab.content_bias.weight, torch.tensor([[0.0, 0.5], [-1.0, -1.0]]))
    assert torch.equal(collab.mixing, torch.eye(2))
    x, y = torch.tensor([[[1.0, 1.0]]]), torch.tensor([[[2.0, -1.0]]])
    full = m(x, y, y, static_kv=True, before_softmax=True)[0].flatten()
    ours = collab(x, y, y, static_kv=True, before_softmax=True)[0].flatten()
    assert torch.allclose(full, torch.tensor([-2.45, 0.0]))
    assert torch.allclose(ours, torch.tensor([-3.5, 0.0]))
    assert torch.allclose(full - ours, torch.tensor([1.05, 0.0]))


def test_concatenate_mixing_is_the_block_indicator():
    assert concatenate_mixing(2, 4).tolist() == [[1, 1, 0, 0], [0, 0, 1, 1]]
    assert concatenate_mixing(3, 4).tolist() == [[1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 0, 0]]


@pytest.mark.parametrize("path", ["self", "cross", "incremental_self", "incremental_cross"])
def test_full_size_is_exact_on_every_path(path):
    kind = {"self_attention": True} if "self" in path else {"encoder_decoder_attention": True}
    stock = stock_module(**kind)
    collab = collab_of(stock, H * D)
    x, enc, pad = inputs()
    if path == "self":
        a, b = self_attn(stock, x), self_attn(collab, x)
    elif path == "cross":
        a, b = cross_attn(stock, x, enc, pad), cross_attn(collab, x, enc, pad)
    else:
        (a, _), (b, cache) = incremental(stock, x, enc=enc, pad=pad), \
            incremental(collab, x, enc=enc, pad=pad)
        length = S if "cross" in path else T
        assert cache["prev_key"].shape == (B, length, H * D)  # shared keys, once per position
        assert cache["prev_content_bias"].shape == (B, H, length)
        assert cache["prev_value"].shape == (B, H, length, D)
    assert torch.allclose(a, b, atol=1e-5)


def test_beam_cross_attention_reads_each_source_once():
    """fairseq's beam search hands encoder-decoder attention B*beam queries over B sources."""
    stock, beam = stock_module(encoder_decoder_attention=True), 2
    collab = collab_of(stock, H * D)
    x, enc, pad = inputs()
    x = x.repeat_interleave(beam, dim=1)  # T x (B*beam) x C
    enc, pad = enc.repeat_interleave(beam, dim=1), pad.repeat_interleave(beam, dim=0)
    for m in (stock, collab):
        m.set_beam_size(beam)
    (a, _), (b, cache) = incremental(stock, x, enc=enc, pad=pad), \
        incremental(collab, x, enc=enc, pad=pad)
    assert cache["prev_key"].shape == (B, S, H * D)
    assert torch.allclose(a, b, atol=1e-5)


def test_reduced_size_uses_the_original_scaling():
    """Below the full size the scores are head_dim**-0.5 times the CP reconstruction of the
    unscaled query-key tensor: no sqrt(D / D~k) factor (the authors' HF swap has one)."""
    stock = MultiheadAttention(C, H, bias=False, encoder_decoder_attention=True).eval()
    key_dim = 6
    collab = collab_of(stock, key_dim)
    a, b, c = cp_factors(qk_tensor(stock.q_proj.weight.double(), stock.k_proj.weight.double(), H),
                         key_dim, seed=0)
    x, enc, _ = inputs()
    scores = collab(x, enc, enc, static_kv=True, before_softmax=True)[0]  # (B*H) x T x S
    approx = torch.einsum("qr,hr,kr->qhk", a, b, c).float()
    expected = torch.einsum("tbq,qhk,sbk->bhts", x, approx, enc) * D ** -0.5
    assert torch.allclose(scores.view(B, H, T, S), expected, atol=1e-4)


def test_reconstruction_error_falls_as_the_key_size_grows():
    stock = stock_module(self_attention=True)
    t = qk_tensor(stock.q_proj.weight.double(), stock.k_proj.weight.double(), H)
    errors = []
    for key_dim in (2, 4, 8, 12):
        sd = {k: v.clone() for k, v in stock.state_dict().items()}
        sd["kept_heads"] = torch.arange(H)
        errors.append(reparametrise_module(sd, "", key_dim, D, seed=0))
        assert sd["q_proj.weight"].shape == (key_dim, C) and sd["mixing"].shape == (H, key_dim)
        assert "q_proj.bias" not in sd and "k_proj.bias" not in sd
    assert all(e1 > e2 for e1, e2 in zip(errors, errors[1:])), errors
    assert 0 < errors[-1] < 1 and t.norm() > 0


def test_same_seed_same_factors():
    stock = stock_module(self_attention=True)
    first, second = collab_of(stock, 5, seed=3), collab_of(stock, 5, seed=3)
    assert torch.equal(first.q_proj.weight, second.q_proj.weight)
    assert not torch.equal(first.q_proj.weight, collab_of(stock, 5, seed=4).q_proj.weight)


@pytest.mark.parametrize("path", ["self", "incremental_cross"])
def test_removed_equals_masked_and_state_dict_removal(path):
    kind = {"self_attention": True} if path == "self" else {"encoder_decoder_attention": True}
    collab = collab_of(stock_module(**kind), 10)
    closed = [0, 2]
    masked, removed = copy.deepcopy(collab), copy.deepcopy(collab)
    masked.head_gate = torch.tensor([0.0, 1.0, 0.0, 1.0])
    removed.set_kept_heads([1, 3])
    assert removed.q_proj.weight.shape == (10, C) and removed.mixing.shape == (2, 10)
    assert removed.content_bias.weight.shape == (2, C) and removed.v_proj.weight.shape == (2 * D, C)
    sd = {k: v.clone() for k, v in collab.state_dict().items()}
    assert remove_module_heads(sd, "", closed) == 2
    assert {k: v.shape for k, v in sd.items()} == \
        {k: v.shape for k, v in removed.state_dict().items()}
    assert all(torch.equal(sd[k], v) for k, v in removed.state_dict().items())
    x, enc, pad = inputs()
    if path == "self":
        a, b = self_attn(masked, x), self_attn(removed, x)
    else:
        (a, _), (b, cache) = incremental(masked, x, enc=enc, pad=pad), \
            incremental(removed, x, enc=enc, pad=pad)
        assert cache["prev_content_bias"].shape == (B, 2, S)
    assert torch.allclose(a, b, atol=1e-6)


def test_bias_kv_is_refused():
    from fairseq_headprune.errors import HeadPruneError

    with pytest.raises(HeadPruneError, match="collaborative attention does not support"):
        CollaborativeAttention(C, H, 8, add_bias_kv=True, self_attention=True)


# ---- the ``collab`` command on a trained checkpoint ------------------------------------------


@pytest.fixture(scope="module")
def collab_full(headprune_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("collab") / "full.pt"
    run(["fairseq-headprune", "collab", "--path", headprune_checkpoint, "--key-dim", "16",
         "-o", str(out)])
    return str(out)


def test_full_size_checkpoint_equals_the_original(collab_full, headprune_checkpoint, data_dir):
    original, task = load(headprune_checkpoint, data_dir)
    collab, _ = load(collab_full, data_dir)
    assert all(type(m).__name__ == "CollaborativeAttention"
               for layer in collab.decoder.layers for m in (layer.self_attn, layer.encoder_attn))
    sample = batch(task)
    with torch.no_grad():
        a = original.get_normalized_probs(original(**sample["net_input"]), log_probs=True)
        b = collab.get_normalized_probs(collab(**sample["net_input"]), log_probs=True)
    assert torch.allclose(a, b, atol=1e-5)
    assert_same_hypotheses(beam_search(original, task, sample), beam_search(collab, task, sample),
                           atol=1e-5)


def test_collab_prune_fine_tune_generate(collab_full, headprune_checkpoint, data_dir, tmp_path):
    """Re-parametrised at half size, pruned, fine-tuned by stock fairseq-train --restore-file
    (without --collab-key-dim: the checkpoint's tensors say which modules are collaborative),
    decoded by stock fairseq-generate --user-dir."""
    half, pruned = tmp_path / "half.pt", tmp_path / "pruned.pt"
    report = tmp_path / "report.json"
    proc = run(["fairseq-headprune", "collab", "--path", headprune_checkpoint, "--key-dim", "8",
                "--types", "E", "-o", str(half), "--report", str(report)])
    data = json.loads(report.read_text())
    assert [m["module"] for m in data["modules"]] == ["E:1", "E:2"]
    assert all(0 < m["error"] < 1 for m in data["modules"])
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("E:")]
    assert rows == [[m["module"], "4", "16", f"{m['error']:.6f}"] for m in data["modules"]]
    state = torch.load(half, weights_only=False)
    assert state["headprune_collab"] == data
    sd = state["model"]
    assert sd[module_prefix("E", 0) + "q_proj.weight"].shape == (8, 16)
    assert sd[module_prefix("D", 0) + "q_proj.weight"].shape == (16, 16)  # D untouched
    run(["fairseq-headprune", "prune", "--path", str(half), "--heads", "E:1:2 A:2:1",
         "-o", str(pruned)])
    sd = torch.load(pruned, weights_only=False)["model"]
    assert sd[module_prefix("E", 0) + "mixing"].shape == (3, 8)
    tuned = tmp_path / "tuned"
    run(["fairseq-train", data_dir, "--user-dir", USER_DIR, "--arch", "transformer_headprune",
         *TINY_MODEL, *TRAIN, "--restore-file", str(pruned), "--reset-optimizer",
         "--reset-dataloader", "--reset-meters", "--max-update", "2", "--save-dir", str(tuned),
         "--no-epoch-checkpoints"])
    after = torch.load(tuned / "checkpoint_last.pt", weights_only=False)["model"]
    assert {k: v.shape for k, v in after.items()} == {k: v.shape for k, v in sd.items()}
    assert not torch.equal(after[module_prefix("E", 0) + "mixing"],
                           sd[module_prefix("E", 0) + "mixing"])  # the mixing trained
    gen = run(["fairseq-generate", data_dir, "--user-dir", USER_DIR, "--path",
               str(tuned / "checkpoint_last.pt"),
               "--gen-subset", "valid", "--beam", "2", "--cpu", "--max-tokens", "400"])
    assert sum(line.startswith("H-") for line in gen.stdout.splitlines()) == 24


@pytest.mark.parametrize("argv, message", [
    (["--key-dim", "0"], "--key-dim must be at least 1, not 0."),
    (["--key-dim", "17"], "--key-dim 17 is above the full key size of E:1 (16 = 4 heads x 4); "
                          "the largest useful value is 16."),
    (["--key-dim", "8", "--types", "X"], "argument --types: must be letters among E (encoder "
                                         "self), D (decoder self), A (encoder-decoder), got 'X'"),
])
def test_bad_input(argv, message, headprune_checkpoint, tmp_path, capsys):
    out = tmp_path / "out.pt"
    status, err = cli(["collab", "--path", headprune_checkpoint, *argv, "-o", str(out)],
                      capsys, tmp_path)
    assert status == 2 and not out.exists()
    assert err.strip().splitlines()[-1].endswith(message)


def test_already_collaborative_is_refused(collab_full, tmp_path, capsys):
    out = tmp_path / "again.pt"
    status, err = cli(["collab", "--path", collab_full, "--key-dim", "8", "-o", str(out)],
                      capsys, tmp_path)
    assert status == 2 and not out.exists()
    assert err.strip().splitlines()[-1] == (
        f"fairseq-headprune collab: error: {collab_full} is already collaborative (key size 16 "
        f"on E,D,A): re-parametrise the original checkpoint instead.")


def test_train_from_scratch_with_collaborative_attention(data_dir, tmp_path):
    """--collab-key-dim in stock fairseq-train: E and A collaborative, D standard."""
    save = tmp_path / "scratch"
    run(["fairseq-train", data_dir, "--user-dir", USER_DIR, "--arch", "transformer_headprune",
         *TINY_MODEL, *TRAIN, "--max-update", "2", "--save-dir", str(save),
         "--no-epoch-checkpoints", "--collab-key-dim", "6", "--collab-types", "E,A"])
    model, _ = load(str(save / "checkpoint_last.pt"), data_dir)
    kinds = {kind: type(m).__name__ for kind, _, m in attention_modules(model)}
    assert kinds == {"E": "CollaborativeAttention", "D": "MaskedMultiheadAttention",
                     "A": "CollaborativeAttention"}
    assert model.decoder.layers[1].encoder_attn.k_proj.weight.shape == (6, 16)


def test_a_zero_key_size_is_refused_by_fairseq_train(data_dir, tmp_path):
    proc = run(["fairseq-train", data_dir, "--user-dir", USER_DIR, "--arch",
                "transformer_headprune", *TINY_MODEL, *TRAIN, "--max-update", "1", "--save-dir",
                str(tmp_path / "x"), "--collab-key-dim", "0"], check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith(
        "the collaborative key size must be at least 1, not 0.")
    assert not (tmp_path / "x" / "checkpoint_last.pt").exists()


def test_inspect_names_the_collaborative_types(collab_full):
    out = run(["fairseq-headprune", "inspect", "--path", collab_full]).stdout.splitlines()
    assert out[1] == ("collaborative attention (Cordonnier et al.) on E,D,A: shared query/key "
                      "size 16")


def test_a_type_the_model_lacks_is_refused(headprune_checkpoint, tmp_path, capsys):
    """A model without encoder-decoder attention (--no-cross-attention) and --types A."""
    from fairseq_headprune.pruning.checkpoint import save_checkpoint

    state = torch.load(headprune_checkpoint, weights_only=False)
    state["model"] = {k: v for k, v in state["model"].items() if ".encoder_attn." not in k}
    no_cross = tmp_path / "no_cross.pt"
    save_checkpoint(state, str(no_cross))
    out = tmp_path / "out.pt"
    status, err = cli(["collab", "--path", str(no_cross), "--key-dim", "8", "--types", "E,A",
                       "-o", str(out)], capsys, tmp_path)
    assert status == 2 and not out.exists()
    assert err.strip().splitlines()[-1] == (
        f"fairseq-headprune collab: error: --types names encoder-decoder attention (A), which "
        f"{no_cross} does not have.")
