"""Li et al. (2021) DSP: the subset gate kind against METHODS_NOTES oracle 6.2, budgets, the
logits' own learning rate under fairseq's scheduler, and both schedules through fairseq-train."""

import math
import os
import re
from argparse import Namespace

import pytest
import torch
from conftest import TINY_MODEL, USER_DIR, batch, load, run

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.heads.layout import HeadLayout
from fairseq_headprune.methods.dsp import (
    StraightThroughTopK, SubsetGates, hard_top_k, parse_budget, relaxed_top_k, temperature)
from fairseq_headprune.model.gates import attach_gates
from fairseq_headprune.pruning.checkpoint import load_checkpoint, save_checkpoint

W = torch.tensor([3.0, 2.0, 1.0, 0.0], dtype=torch.float64)


@pytest.mark.parametrize("w, k, tau, mask", [
    (W, 2, 1.0, [1.084313, 0.584089, 0.239938, 0.091660]),  # the oracle
    (W, 2, 0.5, [0.991645, 0.849986, 0.139078, 0.019290]),
    (W, 2, 0.1, [0.999955, 1.000000, 0.000045, 0.000000]),
    (W, 1, 1.0, [0.643914, 0.236883, 0.087144, 0.032059]),
    (W, 3, 1.0, [1.458513, 0.928236, 0.436488, 0.176764]),
    (torch.zeros(4, dtype=torch.float64), 2, 1.0, [0.5] * 4),
    (torch.tensor([1.0, 1, 0, 0], dtype=torch.float64), 2, 1.0,
     [0.698452, 0.698452, 0.301548, 0.301548]),
])
def test_relaxed_top_k_oracle(w, k, tau, mask):
    out = relaxed_top_k(w, k, tau)
    assert out.tolist() == pytest.approx(mask, abs=1e-6)
    assert out.sum().item() == pytest.approx(k, abs=1e-9)


def test_fixed_noise_oracle():
    u = torch.tensor([0.1, 0.9, 0.5, 0.99], dtype=torch.float64)
    g = -torch.log(-torch.log(u))
    assert g.tolist() == pytest.approx([-0.834032, 2.250367, 0.366513, 4.600149], abs=1e-6)
    assert relaxed_top_k(W + g, 2, 1.0).tolist() == pytest.approx(
        [0.130519, 0.814190, 0.059706, 0.995585], abs=1e-6)
    shifted = relaxed_top_k(W - math.log(-math.log(0.5)), 2, 1.0)  # u = 0.5 everywhere
    assert torch.allclose(shifted, relaxed_top_k(W, 2, 1.0))


def test_hard_top_k_and_straight_through():
    assert hard_top_k(W, 2).tolist() == [1, 1, 0, 0]
    assert hard_top_k(torch.tensor([0.5, 1.0, 1.0, 0.2]), 2).tolist() == [0, 1, 1, 0]
    assert hard_top_k(torch.tensor([1.0, 1.0, 1.0]), 2).tolist() == [1, 1, 0]  # earlier wins
    w = W.clone().requires_grad_(True)
    out = StraightThroughTopK.apply(w, 2)
    assert out.tolist() == [1, 1, 0, 0]
    v = torch.tensor([0.3, -1.0, 2.0, 0.5], dtype=torch.float64)
    out.backward(v)
    assert w.grad.tolist() == v.tolist()


@pytest.mark.parametrize("updates, step, tau", [
    (15000, 0, 0.1), (15000, 1, 0.0998926), (15000, 3750, 1.778279e-3),
    (15000, 7500, 3.162278e-5), (15000, 14999, 1.001075e-8), (15000, 15000, 1e-8),
    (15000, 90000, 1e-8), (250, 1, 0.0937562), (250, 62, 1.836538e-3),
    (250, 125, 3.162278e-5), (250, 249, 1.066596e-8), (0, 0, 1e-8),
])
def test_temperature_schedule_oracle(updates, step, tau):
    assert temperature(step, 0.1, 1e-8, updates) == pytest.approx(tau, rel=1e-5)


def heads_of(layers=2, n=4, types="EDA"):
    return {f"{t}{i}": n for t in "EDA" if t in types for i in range(layers)}


def subset(budget, heads=None, **kwargs):
    args = Namespace(subset_heads=budget, **kwargs)
    return SubsetGates(heads or heads_of(), args)


@pytest.mark.parametrize("heads, rows, bound", [
    (4, 18, 0.522233), (8, 18, 0.480384), (16, 18, 0.420084), (4, 6, 0.774597)])
def test_logits_are_xavier_initialised(heads, rows, bound):
    torch.manual_seed(0)
    layers = rows // 3
    gates = subset("1", heads_of(layers, heads))
    assert gates.w.dtype == torch.float32 and gates.w.shape == (rows * heads,)
    assert gates.w.abs().max() <= bound
    assert gates.w.abs().max() > 0.9 * bound  # uniform over the whole interval, not narrower


def test_flat_order_is_the_forks_encoder_cross_decoder():
    gates = subset("6")
    assert gates.order == ["E0", "E1", "A0", "A1", "D0", "D1"]
    with torch.no_grad():
        gates.w.copy_(torch.arange(24, dtype=torch.float64))
    assert gates.values()["A0"].tolist() == [8, 9, 10, 11]
    assert gates.values()["D1"].tolist() == [20, 21, 22, 23]
    gates.eval()
    kept = {k: v.tolist() for k, v in gates.compute().items()}
    assert kept["D1"] == [1, 1, 1, 1] and kept["D0"] == [0, 0, 1, 1] and kept["A1"] == [0] * 4


@pytest.mark.parametrize("budget, sums", [
    ("10", {"all": 10}),
    ("50%", {"all": 12}),
    ("E:3,D:5,A:2", {"E": 3, "D": 5, "A": 2}),
    ("E0:1,E1:2,D0:3,D1:4,A0:1,A1:1", {"E0": 1, "E1": 2, "D0": 3, "D1": 4, "A0": 1, "A1": 1}),
])
def test_every_budget_form_keeps_exactly_its_heads(budget, sums):
    torch.manual_seed(1)
    gates = subset(budget, subset_tau0=1.0, subset_tau_final=0.5, subset_anneal_updates=10)

    def totals(mask):
        if "all" in sums:
            return {"all": sum(float(m.sum()) for m in mask.values())}
        return {g: sum(float(m.sum()) for k, m in mask.items() if k.startswith(g)) for g in sums}

    soft = gates.train().compute()
    assert all(v.dtype == torch.float32 for v in soft.values())
    assert totals(soft) == pytest.approx(sums, abs=1e-4)  # the relaxation keeps K in each group
    assert any(((m > 0.01) & (m < 0.99)).any() for m in soft.values())  # and it is soft
    gates.eval()
    hard = gates.compute()
    assert totals(hard) == sums
    assert all(set(m.tolist()) <= {0.0, 1.0} for m in hard.values())


def test_one_draw_per_forward_and_a_deterministic_eval():
    gates = subset("12", subset_tau0=1.0, subset_tau_final=1.0)
    gates.train()
    first = gates.gate("E0").clone()
    assert torch.equal(gates.gate("E0"), first)  # cached: one sample for the whole forward
    gates.reset()
    assert not torch.equal(gates.gate("E0"), first)  # a new batch, a new draw
    gates.eval()
    assert torch.equal(gates.compute()["E0"], gates.compute()["E0"])


def test_temperature_follows_fairseqs_update_count():
    gates = subset("12")  # joint default: 0.1 -> 1e-8 over 15000 updates
    gates.set_num_updates(3750)
    assert gates.tau == pytest.approx(1.778279e-3, rel=1e-5)
    assert subset("12", head_gates_only=True).anneal_updates == 250  # pipelined default
    assert subset("12", subset_anneal_updates=0).tau == 1e-8  # the fork without --annealing


def test_ste_forward_is_hard_in_training():
    gates = subset("E:2,D:8,A:1", subset_ste=True)
    gates.train()
    mask = gates.compute()
    assert sum(float(mask[k].sum()) for k in ("E0", "E1")) == 2
    assert all(set(m.tolist()) <= {0.0, 1.0} for m in mask.values())
    sum(m.sum() * (i + 1) for i, m in enumerate(mask.values())).backward()
    assert gates.w.grad is not None and (gates.w.grad != 0).all()  # every logit gets gradient


def test_logits_keep_float32_when_the_model_is_cast(headprune_checkpoint, data_dir):
    model, task = load(headprune_checkpoint, data_dir)
    gates = attach_gates(model, subset("12"))
    before = gates.w.detach().clone()
    model.to(torch.bfloat16)
    assert model.head_gates.w.dtype == torch.float32
    assert torch.equal(model.head_gates.w.detach(), before)  # not rounded through bfloat16
    assert model.encoder.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    out, _ = model.train()(**batch(task)["net_input"])
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


@pytest.mark.parametrize("budget, message", [
    ("0", "--subset-heads '0' keeps 0 heads of the model, which has 24 gated heads: keep "
          "between 1 and 24."),
    ("25", "--subset-heads '25' keeps 25 heads of the model, which has 24 gated heads: keep "
           "between 1 and 24."),
    ("E:3,D:9,A:2", "--subset-heads 'E:3,D:9,A:2' keeps 9 heads of D, which has 8 gated heads: "
                    "keep between 1 and 8."),
    ("E:3,D:2", "--subset-heads 'E:3,D:2' gives no budget for A: name every gated type."),
    ("E:3,D:2,A:1,Q:2", "--subset-heads 'E:3,D:2,A:1,Q:2' names Q, but attention type 'Q' has "
                        "no gates here (gated types: E,D,A)."),
    ("E0:1,E1:1,E2:1,D0:1,D1:1,A0:1,A1:1", "--subset-heads 'E0:1,E1:1,E2:1,D0:1,D1:1,A0:1,A1:1' "
                                           "names module E2, which this model does not gate (E "
                                           "has layers 0-1)."),
    ("E:3,D0:2", "--subset-heads 'E:3,D0:2' mixes attention types and modules: name only types "
                 "(E:12,D:20,A:16) or only modules (E0:2,...)."),
    ("ten", "--subset-heads 'ten': 'ten' is not a number of heads."),
    ("E:3,E:2", "--subset-heads 'E:3,E:2' is not a budget such as 36, 50%, E:12,D:20,A:16 or "
                "E0:2,E1:2,..."),
])
def test_bad_budgets(budget, message):
    with pytest.raises(HeadPruneError) as err:
        parse_budget(budget, heads_of())
    assert str(err.value) == message


def test_budget_naming_an_ungated_type():
    with pytest.raises(HeadPruneError) as err:
        parse_budget("E:2,D:2", heads_of(types="E"))
    assert str(err.value) == ("--subset-heads 'E:2,D:2' names D, but decoder self-attention has "
                              "no gates here (gated types: E).")


@pytest.mark.parametrize("kwargs, message", [
    ({"subset_heads": None}, "--head-gates subset needs --subset-heads"),
    ({"subset_tau0": 0.1, "subset_tau_final": 0.5},
     "subset gates need 0 < --subset-tau-final <= --subset-tau0, got tau0 0.1 and tau-final 0.5."),
    ({"subset_anneal_updates": -1}, "--subset-anneal-updates must be >= 0, got -1."),
])
def test_bad_options(kwargs, message):
    args = Namespace(**{"subset_heads": "4", **kwargs})
    with pytest.raises(HeadPruneError, match=re.escape(message)):
        SubsetGates(heads_of(), args)


# ---------------------------------------------------------------- folding a subset checkpoint

@pytest.mark.parametrize("budget, kept", [
    ("7", {"all": 7}), ("E:1,D:4,A:3", {"E": 1, "D": 4, "A": 3}),
    ("E0:1,E1:1,D0:2,D1:2,A0:1,A1:4", {"E0": 1, "E1": 1, "D0": 2, "D1": 2, "A0": 1, "A1": 4})])
def test_prune_from_gates_keeps_the_exact_top_k(headprune_checkpoint, data_dir, tmp_path, budget,
                                                kept):
    state = load_checkpoint(headprune_checkpoint)
    args = state["cfg"]["model"]
    args.head_gates, args.head_gates_types, args.subset_heads = "subset", "E,D,A", budget
    torch.manual_seed(3)
    gates = SubsetGates(heads_of(), args)
    state["model"]["head_gates.w"] = gates.w.detach()
    gated = str(tmp_path / "gated.pt")
    save_checkpoint(state, gated)
    pruned = str(tmp_path / "pruned.pt")
    out = run(["fairseq-headprune", "prune", "--from-gates", gated, "-o", pruned]).stdout
    layout = HeadLayout.from_state_dict(load_checkpoint(pruned)["model"], {"E": 4, "D": 4,
                                                                           "A": 4})
    if "all" in kept:
        assert layout.count() == kept["all"]
    else:
        for group, n in kept.items():
            t, layer = group[0], (int(group[1:]) if len(group) > 1 else None)
            have = len(layout.kept[t][layer]) if layer is not None else layout.count(t)
            assert have == n
    order = torch.sort(gates.w.detach(), descending=True, stable=True).indices
    if "all" in kept:  # the K largest logits are the heads kept
        flat = [(key, h) for key in gates.order for h in range(4)]
        assert {flat[i] for i in order[:7].tolist()} == {
            (f"{t}{layer}", h) for t in "EDA" for layer, hs in enumerate(layout.kept[t])
            for h in hs}
    assert "folded 0 fractional gates" in out  # a 0/1 mask: removal only
    gen = ["fairseq-generate", data_dir, "--user-dir", USER_DIR, "--cpu", "--gen-subset",
           "valid", "--beam", "4", "--max-len-b", "20", "--batch-size", "8"]
    hyps = [{line.split("\t")[0]: line.split("\t")[2] for line in run(gen + ["--path", p])
             .stdout.splitlines() if line.startswith("H-")} for p in (gated, pruned)]
    assert len(hyps[0]) == 24 and hyps[0] == hyps[1]  # the gated model decodes with its top-K


# ---------------------------------------------------------------- the logits' learning rate

def test_subset_lr_is_kept_under_inverse_sqrt(data_dir):
    """--subset-lr: after N updates with inverse_sqrt warmup, the logits stepped at 0.2 and the
    model at the scheduler's rate (plain SGD: step = -lr * gradient)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    import fairseq_headprune.register  # noqa: F401

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        data_dir, "--user-dir", USER_DIR, "--arch", "transformer_headprune", *TINY_MODEL,
        "--head-gates", "subset", "--subset-heads", "12", "--optimizer", "sgd", "--lr", "0.5",
        "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "10", "--warmup-init-lr", "0",
        "--cpu", "--max-tokens", "500", "--criterion", "label_smoothed_cross_entropy",
        "--label-smoothing", "0.1", "--seed", "1"])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    task.load_dataset("train")
    ds = task.dataset("train")
    sample = ds.collater([ds[i] for i in range(8)])
    weight = model.encoder.layers[0].self_attn.q_proj.weight
    for update in range(4):
        w0, p0 = model.head_gates.w.detach().clone(), weight.detach().clone()
        trainer.train_step([sample])
        lr = 0.05 * update  # warmup from 0: the rate of the step just taken (0 at first)
        assert trainer.get_lr() == pytest.approx(0.05 * (update + 1))
        assert torch.allclose(model.head_gates.w.detach() - w0, -0.2 * model.head_gates.w.grad,
                              atol=1e-7)
        assert torch.allclose(weight.detach() - p0, -lr * weight.grad, atol=1e-7)
        assert model.head_gates.w.grad.abs().max() > 0
    assert {g["lr"] for g in trainer.optimizer.optimizer.param_groups} == {trainer.get_lr()}


# ---------------------------------------------------------------- both schedules, real commands

SUBSET = ["--user-dir", USER_DIR, "--arch", "transformer_headprune", *TINY_MODEL,
          "--head-gates", "subset", "--optimizer", "adam", "--lr", "0.001", "--max-tokens",
          "500", "--cpu", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing",
          "0.1", "--no-epoch-checkpoints", "--no-progress-bar", "--log-format", "simple",
          "--log-interval", "1", "--seed", "1"]
RESET = ["--reset-optimizer", "--reset-dataloader", "--reset-meters", "--reset-lr-scheduler"]


def taus(log):
    """tau of every update, from fairseq's per-update lines (--log-interval 1)."""
    return [float(m.group(1)) for line in log.splitlines() if "train_inner" in line
            for m in [re.search(r"tau=([\d.e+-]+)", line)] if m]


def test_joint_schedule_trains_resumes_and_prunes(data_dir, tmp_path):
    save = tmp_path / "joint"
    common = [data_dir, *SUBSET, "--subset-heads", "E:3,D:5,A:4", "--subset-tau0", "1",
              "--subset-tau-final", "0.01", "--subset-anneal-updates", "4", "--save-dir",
              str(save)]
    first = run(["fairseq-train", *common, "--max-update", "3"])
    assert taus(first.stdout + first.stderr) == pytest.approx(
        [temperature(u, 1, 0.01, 4) for u in range(3)], rel=1e-5)
    state = load_checkpoint(str(save / "checkpoint_last.pt"))
    assert state["model"]["head_gates.w"].dtype == torch.float32
    assert state["model"]["head_gates.w"].shape == (24,)
    second = run(["fairseq-train", *common, "--max-update", "5"])  # resumes at update 3
    assert taus(second.stdout + second.stderr) == pytest.approx(
        [temperature(3, 1, 0.01, 4), 0.01], rel=1e-5)  # the schedule goes on at update 3
    pruned = str(tmp_path / "pruned.pt")
    run(["fairseq-headprune", "prune", "--from-gates", str(save / "checkpoint_last.pt"), "-o",
         pruned])
    layout = HeadLayout.from_state_dict(load_checkpoint(pruned)["model"], {"E": 4, "D": 4,
                                                                           "A": 4})
    assert (layout.count("E"), layout.count("D"), layout.count("A")) == (3, 5, 4)


def test_pipelined_schedule_freezes_the_model_then_fine_tunes(headprune_checkpoint, data_dir,
                                                              tmp_path):
    save = tmp_path / "pipe"
    run(["fairseq-train", data_dir, *SUBSET, "--subset-heads", "9", "--head-gates-only",
         "--restore-file", headprune_checkpoint, *RESET, "--max-update", "3", "--save-dir",
         str(save)])
    before, after = (load_checkpoint(p)["model"] for p in (headprune_checkpoint,
                                                          str(save / "checkpoint_last.pt")))
    assert all(torch.equal(before[k], after[k]) for k in before)  # the model did not move
    init = SubsetGates(heads_of(), Namespace(subset_heads="9"))
    assert after["head_gates.w"].shape == init.w.shape
    pruned = str(tmp_path / "pruned.pt")
    run(["fairseq-headprune", "prune", "--from-gates", str(save / "checkpoint_last.pt"), "-o",
         pruned])
    assert HeadLayout.from_state_dict(load_checkpoint(pruned)["model"],
                                      {"E": 4, "D": 4, "A": 4}).count() == 9
    tuned = tmp_path / "tuned"
    plain = [a for a in SUBSET if a not in ("--head-gates", "subset")]
    run(["fairseq-train", data_dir, *plain, "--restore-file", pruned, *RESET, "--max-update",
         "2", "--save-dir", str(tuned)])
    final = load_checkpoint(str(tuned / "checkpoint_last.pt"))
    assert not any(k.startswith("head_gates") for k in final["model"])
    assert HeadLayout.from_state_dict(final["model"], {"E": 4, "D": 4, "A": 4}).count() == 9


@pytest.mark.parametrize("flags, message", [
    (["--subset-heads", "0"], "fairseq-train: error: --subset-heads '0' keeps 0 heads of the "
                              "model, which has 24 gated heads: keep between 1 and 24."),
    (["--subset-heads", "30"], "keeps 30 heads of the model, which has 24 gated heads"),
    (["--subset-heads", "E:2,D:2,A:2,E5:1"], "mixes attention types and modules"),
    (["--subset-heads", "E0:1,E1:1,E7:1,D0:1,D1:1,A0:1,A1:1"],
     "names module E7, which this model does not gate (E has layers 0-1)."),
    (["--subset-heads", "E:2,D:2", "--head-gates-types", "E"], "names D, but decoder "
                                                                "self-attention has no gates"),
    (["--subset-heads", "4", "--subset-tau0", "0.01", "--subset-tau-final", "0.1"],
     "got tau0 0.01 and tau-final 0.1."),
    (["--head-gates-only", "--head-gates", "subset"], "needs --subset-heads"),
])
def test_bad_input_through_fairseq_train(data_dir, tmp_path, flags, message):
    proc = run(["fairseq-train", data_dir, *SUBSET, "--max-update", "1", "--save-dir",
                str(tmp_path / "bad"), *flags], check=False)
    assert proc.returncode != 0 and message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not os.path.exists(tmp_path / "bad" / "checkpoint_last.pt")
