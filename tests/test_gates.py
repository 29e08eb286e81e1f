"""The gate seam: registry, options, one gate module per model, float32 gates, folding."""

import os
from argparse import Namespace

import pytest
import torch
from conftest import USER_DIR, batch, beam_search, load, run
from fairseq import tasks

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.heads.layout import HeadLayout, attention_modules
from fairseq_headprune.heads.spec import parse_head_spec
from fairseq_headprune.model.gates import (
    GATE_REGISTRY, FixedGates, GateHandle, HeadGates, build_gates, gated_heads,
    parse_gate_types, register_gate)
from fairseq_headprune.pruning.checkpoint import load_checkpoint, save_checkpoint
from fairseq_headprune.pruning.fold import fold_checkpoint
from fairseq_headprune.pruning.remove import remove_heads


@register_gate("test_scale")
class ScaleGates(HeadGates):
    """A learned gate kind for these tests: one trainable scale per head, counting computes."""

    calls = 0

    def build(self):
        self.scale = torch.nn.ParameterDict(
            {k: torch.nn.Parameter(torch.full((n,), 0.5)) for k, n in self.heads.items()})

    def compute(self):
        ScaleGates.calls += 1
        return {k: self.scale[k] for k in self.heads}


@register_gate("test_per_sentence")
class PerSentenceGates(HeadGates):
    """A [batch, heads] gate kind: sentence b of the batch gets gate (b + 1) / 10 on every head."""

    batch_size = 1

    def compute(self):
        rows = torch.arange(1, self.batch_size + 1, dtype=torch.float32).unsqueeze(1) / 10
        return {k: rows.expand(self.batch_size, n) for k, n in self.heads.items()}


def test_registry_and_unknown_kind():
    assert {"mask", "test_scale", "test_per_sentence"} <= set(GATE_REGISTRY)
    with pytest.raises(ValueError, match="registered twice"):
        register_gate("mask")(FixedGates)
    with pytest.raises(HeadPruneError) as err:
        build_gates("concrete", {"E0": 4})
    assert str(err.value) == ("unknown gate kind 'concrete': valid kinds are "
                              + ", ".join(sorted(GATE_REGISTRY)) + ".")


@pytest.mark.parametrize("text, expected", [("E,D,A", "EDA"), ("A,E", "EA"), ("D", "D"),
                                            ("EDA", "EDA"), ("A, D", "DA")])
def test_gate_types(text, expected):
    assert parse_gate_types(text) == expected


def test_gate_types_bad_letter():
    with pytest.raises(HeadPruneError) as err:
        parse_gate_types("E,X")
    assert str(err.value) == ("unknown attention type 'X' in --head-gates-types 'E,X': expected "
                              "letters among E (encoder self), D (decoder self), A "
                              "(encoder-decoder), e.g. E,D,A.")


def gated_model(checkpoint, data_dir, kind, types="E,D,A"):
    model, task = load(checkpoint, data_dir)
    args = model.args
    args.head_gates, args.head_gates_types = kind, types
    rebuilt = tasks.setup_task(args).build_model(args)
    rebuilt.load_state_dict(model.state_dict(), strict=False)
    return rebuilt.eval(), task


def test_one_gate_module_owned_by_the_model(headprune_checkpoint, data_dir):
    model, task = gated_model(headprune_checkpoint, data_dir, "test_scale", "E,A")
    gates = model.head_gates
    assert isinstance(gates, ScaleGates)
    assert sorted(gates.heads) == ["A0", "A1", "E0", "E1"]
    # the gate parameters are the model's, once, and are saved with it
    names = sorted(n for n, _ in model.named_parameters() if "head_gates" in n)
    assert names == ["head_gates.scale.A0", "head_gates.scale.A1", "head_gates.scale.E0",
                     "head_gates.scale.E1"]
    assert sum(p.numel() for p in model.parameters()) == sum(
        p.numel() for p in set(model.parameters()))
    assert "head_gates.scale.A1" in model.state_dict()
    for kind, layer, module in attention_modules(model):
        assert isinstance(module.head_gate, GateHandle) == (kind in "EA")
    # one compute per forward for all modules; training: gradients reach the gate parameters
    model.train()
    sample = batch(task)
    ScaleGates.calls = 0
    out, _ = model(**sample["net_input"])
    out.sum().backward()
    assert ScaleGates.calls == 1
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in gates.scale.values())
    model(**sample["net_input"])
    assert ScaleGates.calls == 2


def test_per_sentence_gates(headprune_checkpoint, data_dir):
    """A [batch, heads] gate scales sentence b's heads by its own value."""
    model, task = gated_model(headprune_checkpoint, data_dir, "test_per_sentence", "A")
    sample = batch(task, max_sentences=3)
    model.head_gates.batch_size = 3
    with torch.no_grad():
        together, _ = model(**sample["net_input"])
    for b in range(3):
        masked, _ = load(headprune_checkpoint, data_dir)
        for kind, _, module in attention_modules(masked):
            if kind == "A":
                module.head_gate = torch.full((module.num_heads,), (b + 1) / 10)
        with torch.no_grad():
            alone, _ = masked(**sample["net_input"])
        assert torch.allclose(together[b], alone[b], atol=1e-5)


@pytest.mark.parametrize("cast", [torch.float16, torch.bfloat16])
def test_gates_stay_float32(headprune_checkpoint, data_dir, cast):
    model, task = gated_model(headprune_checkpoint, data_dir, "test_scale")
    mask = FixedGates(gated_heads(model, "D"))
    model = model.to(cast)  # what fairseq's trainer does under --fp16 / --bf16
    assert model.encoder.layers[0].self_attn.q_proj.weight.dtype == cast
    assert {p.dtype for p in model.head_gates.parameters()} == {torch.float32}
    assert {b.dtype for b in mask.to(cast).buffers()} == {torch.float32}
    if cast == torch.bfloat16:  # CPU matmuls in bf16 run everywhere
        sample = batch(task)
        out, _ = model(**sample["net_input"])
        assert out.dtype == cast and torch.isfinite(out).all()


# ---------------------------------------------------------------- folding

VALUES = {"E0": [0.0, 0.3, 1.0, 1.0], "E1": [1.0, 0.3, 0.3, 0.0],
          "D0": [0.3, 1.0, 0.0, 1.0], "D1": [0.0, 0.0, 0.0, 0.0],
          "A0": [1.0, 0.0, 0.3, 1.0], "A1": [0.3, 0.3, 1.0, 0.3]}


def write_gated(checkpoint, path, values=VALUES, types="E,D,A"):
    """A checkpoint with a ``mask`` gate module holding hand-set values."""
    state = load_checkpoint(checkpoint)
    args = state["cfg"]["model"]
    args.head_gates, args.head_gates_types = "mask", types
    for key, value in values.items():
        state["model"]["head_gates.value_" + key] = torch.tensor(value)
    save_checkpoint(state, path)
    return path


def incremental_log_probs(model, sample, steps=6):
    """Greedy step-by-step decoding with the incremental cache; log-probs of every step."""
    net = sample["net_input"]
    with torch.no_grad():
        enc = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
        state, tokens, out = {}, net["prev_output_tokens"][:, :1], []
        for _ in range(steps):
            logits, _ = model.decoder(tokens, encoder_out=enc, incremental_state=state)
            lp = model.get_normalized_probs((logits, None), log_probs=True)[:, -1]
            out.append(lp)
            tokens = torch.cat([tokens, lp.argmax(-1, keepdim=True)], 1)
    return torch.stack(out)


def test_folded_equals_gated_on_every_path(headprune_checkpoint, data_dir, tmp_path):
    gated_path = write_gated(headprune_checkpoint, str(tmp_path / "gated.pt"))
    gated, task = load(gated_path, data_dir)
    assert isinstance(gated.head_gates, FixedGates)
    report = fold_checkpoint(gated_path, str(tmp_path / "folded.pt"))
    folded, _ = load(str(tmp_path / "folded.pt"), data_dir)
    assert getattr(folded, "head_gates", None) is None
    assert report["removed"] == 8 and report["heads_after"] == 24 - 8
    assert report["scaled"] == 8
    assert not any(k.startswith("head_gates") for k in folded.state_dict())
    layout = HeadLayout.from_model(folded)
    assert layout.kept["E"] == [[1, 2, 3], [0, 1, 2]] and layout.kept["D"][1] == []
    sample = batch(task)
    with torch.no_grad():  # teacher-forced forward (cross attention with static encoder keys)
        a = gated.get_normalized_probs(gated(**sample["net_input"]), log_probs=True)
        b = folded.get_normalized_probs(folded(**sample["net_input"]), log_probs=True)
    assert torch.allclose(a, b, atol=1e-5)
    assert torch.allclose(incremental_log_probs(gated, sample),
                          incremental_log_probs(folded, sample), atol=1e-5)
    hyps_gated, hyps_folded = beam_search(gated, task, sample), beam_search(folded, task, sample)
    for sa, sb in zip(hyps_gated, hyps_folded):
        assert [h[0] for h in sa] == [h[0] for h in sb]
        assert all(abs(ha[1] - hb[1]) <= 1e-5 for ha, hb in zip(sa, sb))


def test_masked_model_equals_removed_through_the_mask_kind(headprune_checkpoint, data_dir):
    """mask_heads is the 0/1 case of the mask kind: the same as removing the heads."""
    from fairseq_headprune.pruning.masking import mask_heads

    spec = parse_head_spec("E:1:2 D:2:1-4 A:1:1,3")
    masked, task = load(headprune_checkpoint, data_dir)
    mask_heads(masked, spec)
    assert isinstance(masked.head_gates, FixedGates)
    assert not masked.head_gates.active("E1")  # untouched modules keep the fused path
    state = load_checkpoint(headprune_checkpoint)
    from fairseq_headprune.pruning.checkpoint import checkpoint_layout
    remove_heads(state["model"], checkpoint_layout(state), spec)
    removed, _ = load(headprune_checkpoint, data_dir)
    removed.load_state_dict(state["model"])
    sample = batch(task)
    with torch.no_grad():
        assert torch.allclose(masked(**sample["net_input"])[0], removed(**sample["net_input"])[0],
                              atol=1e-5)
    mask_heads(masked, {})
    assert masked.head_gates is None
    assert all(m.head_gate is None for _, _, m in attention_modules(masked))


def test_gates_adopt_a_pruned_checkpoint(headprune_checkpoint, data_dir, tmp_path):
    """--restore-file of a pruned, ungated checkpoint into a gated model: gates take its shape."""
    state = load_checkpoint(headprune_checkpoint)
    from fairseq_headprune.pruning.checkpoint import checkpoint_layout
    remove_heads(state["model"], checkpoint_layout(state), parse_head_spec("E:1:1,2 A:2:4"))
    model, _ = gated_model(headprune_checkpoint, data_dir, "test_scale")
    model.load_state_dict(state["model"], strict=True)
    assert model.head_gates.heads["E0"] == 2 and model.head_gates.heads["A1"] == 3
    assert model.head_gates.scale["E0"].shape == (2,)
    assert torch.equal(model.head_gates.scale["A1"].detach(), torch.full((3,), 0.5))


# ---------------------------------------------------------------- through the real commands

def test_train_inspect_fold_generate(headprune_checkpoint, data_dir, tmp_path):
    """fairseq-train --head-gates mask from an ungated checkpoint, then inspect, fold, and stock
    fairseq-generate on the folded checkpoint gives the gated checkpoint's translations."""
    save = tmp_path / "train"
    run(["fairseq-train", data_dir, "--user-dir", USER_DIR, "--arch", "transformer_headprune",
         "--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "16",
         "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
         "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "4",
         "--decoder-attention-heads", "4", "--head-gates", "mask", "--head-gates-types", "E,A",
         "--restore-file", headprune_checkpoint, "--reset-optimizer", "--reset-dataloader",
         "--reset-meters", "--reset-lr-scheduler", "--optimizer", "adam", "--lr", "0.001",
         "--max-tokens", "500", "--cpu", "--max-update", "2", "--save-dir", str(save),
         "--no-epoch-checkpoints", "--no-progress-bar", "--seed", "1"])
    trained = load_checkpoint(str(save / "checkpoint_last.pt"))
    assert sorted(k for k in trained["model"] if k.startswith("head_gates.")) == [
        "head_gates.value_A0", "head_gates.value_A1", "head_gates.value_E0", "head_gates.value_E1"]
    gated = write_gated(str(save / "checkpoint_last.pt"), str(tmp_path / "gated.pt"),
                        {"E0": [0.0, 0.3, 1.0, 1.0], "A1": [0.3, 1.0, 0.0, 0.0]}, "E,A")
    proc = run(["fairseq-headprune", "inspect", "--path", gated])
    assert "head gates: mask on EA" in proc.stdout
    assert "  E:1  4/4  heads 1,2,3,4  gates 0.000 0.300 1.000 1.000" in proc.stdout
    assert "  D:1  4/4  heads 1,2,3,4\n" in proc.stdout  # ungated type: no gate column
    folded = str(tmp_path / "folded.pt")
    proc = run(["fairseq-headprune", "fold", "--path", gated, "-o", folded])
    assert "removed 3 heads with gate 0, folded 2 fractional gates into out_proj; 24 -> 21" \
        in proc.stdout
    gen = ["fairseq-generate", data_dir, "--user-dir", USER_DIR, "--cpu", "--gen-subset",
           "valid", "--beam", "4", "--max-len-b", "20", "--batch-size", "8"]
    out_gated = run(gen + ["--path", gated]).stdout
    out_folded = run(gen + ["--path", folded]).stdout
    hyps = [{line.split("\t")[0]: line.split("\t")[1:] for line in out.splitlines()
             if line[:2] in ("H-", "D-")} for out in (out_gated, out_folded)]
    assert len(hyps[0]) == 48 and hyps[0].keys() == hyps[1].keys()
    for key, (score, text) in hyps[0].items():
        assert hyps[1][key][1] == text and abs(float(hyps[1][key][0]) - float(score)) < 1e-5


def test_gated_checkpoint_refused_with_the_folding_command(headprune_checkpoint, tmp_path):
    gated = write_gated(headprune_checkpoint, str(tmp_path / "gated.pt"))
    out = str(tmp_path / "pruned.pt")
    proc = run(["fairseq-headprune", "prune", "--path", gated, "--heads", "E:1:1", "-o", out],
               check=False)
    assert proc.returncode == 2 and not os.path.exists(out)
    assert proc.stderr.strip().endswith(
        f"{gated} has 'mask' head gates, which this command does not handle; fold them into a "
        f"plain pruned checkpoint first with 'fairseq-headprune fold --path {gated} -o "
        f"FOLDED.pt'.")
    proc = run(["fairseq-headprune", "fold", "--path", headprune_checkpoint, "-o", out],
               check=False)
    assert proc.returncode == 2 and not os.path.exists(out)
    assert proc.stderr.strip().endswith(
        f"{headprune_checkpoint} has no head gates to fold (its model has no --head-gates).")


@pytest.mark.parametrize("flags, message", [
    (["--head-gates", "concrete"], "argument --head-gates: invalid choice: 'concrete' (choose "
                                   "from "),
    (["--head-gates", "mask", "--head-gates-types", "E,Q"],
     "unknown attention type 'Q' in --head-gates-types 'E,Q'"),
])
def test_train_rejects_bad_gate_options(data_dir, tmp_path, flags, message):
    proc = run(["fairseq-train", data_dir, "--user-dir", USER_DIR, "--arch",
                "transformer_headprune", "--cpu", "--max-update", "1", "--save-dir",
                str(tmp_path), *flags], check=False)
    assert proc.returncode != 0 and message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_gate_lr_is_kept_whatever_the_scheduler_sets():
    """--head-gates-lr: the gate steps as Adam at its own rate while the group's rate changes."""
    torch.manual_seed(0)
    gates = ScaleGates({"E0": 4}, Namespace(head_gates_lr=0.1))
    weight = torch.nn.Parameter(torch.randn(4))
    reference = torch.nn.Parameter(gates.scale["E0"].detach().clone())
    ref_weight = torch.nn.Parameter(weight.detach().clone())
    opt = torch.optim.Adam([weight, gates.scale["E0"]], lr=1e-3, weight_decay=0.01)
    ref_opt = torch.optim.Adam([reference], lr=0.1, weight_decay=0.01)
    ref_weight_opt = torch.optim.Adam([ref_weight], lr=1e-3, weight_decay=0.01)
    for step in range(5):
        for group in opt.param_groups + ref_weight_opt.param_groups:
            group["lr"] = 1e-3 / (step + 1)  # what an lr scheduler does to every group
        grad = torch.randn(4)
        for p in (weight, ref_weight):
            p.grad = grad.clone()
        for p in (gates.scale["E0"], reference):
            p.grad = grad.clone() * 2
        opt.step()
        ref_opt.step()
        ref_weight_opt.step()
    assert torch.allclose(gates.scale["E0"], reference, atol=1e-6)
    assert torch.allclose(weight, ref_weight, atol=1e-7)  # the rest follows the scheduler
    assert not torch.allclose(reference, torch.full((4,), 0.5), atol=0.1)  # it did move


def test_fold_keeping_the_largest_gates(headprune_checkpoint, tmp_path):
    """--keep-heads K: the K largest evaluation gates stay (ties: earlier module, lower head)."""
    gated = write_gated(headprune_checkpoint, str(tmp_path / "gated.pt"))
    report = fold_checkpoint(gated, str(tmp_path / "folded.pt"), keep=10)
    assert report["heads_after"] == 10
    layout = HeadLayout.from_state_dict(load_checkpoint(str(tmp_path / "folded.pt"))["model"],
                                        {"E": 4, "D": 4, "A": 4})
    # the 8 gates at 1, then the first two at 0.3 in E0, E1, D0, ... order
    assert layout.kept == {"E": [[1, 2, 3], [0, 1]], "D": [[1, 3], []], "A": [[0, 3], [2]]}
    with pytest.raises(HeadPruneError, match=r"^cannot keep 25 heads: the model has 24 gated "
                                             r"heads\.$"):
        fold_checkpoint(gated, str(tmp_path / "bad.pt"), keep=25)
    assert not os.path.exists(tmp_path / "bad.pt")
