"""Voita et al. (2019): Hard Concrete gates and the L0 criterion, against METHODS_NOTES oracle 6.1."""

import math
import os
import re
from argparse import Namespace

import pytest
import torch
from conftest import TINY_MODEL, USER_DIR, batch, load, run
from fairseq import tasks

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.heads.layout import HeadLayout
from fairseq_headprune.methods.voita import (
    HardConcreteGates, L0LabelSmoothedCrossEntropy, concrete_eval, concrete_p_open,
    concrete_sample)
from fairseq_headprune.pruning.checkpoint import load_checkpoint, save_checkpoint
from fairseq_headprune.pruning.fold import fold_checkpoint

LN11 = math.log(11)
# log_a -> (p_open, eval gate), oracle 6.1
TABLE = [(0, 0.688112, 0.5), (-1, 0.448015, 0.222730), (1, 0.857087, 0.777270),
         (-2, 0.229932, 0.043044), (2, 0.942204, 0.956956), (-LN11, 0.167063, 0.0),
         (LN11, 0.960426, 1.0), (-3, 0.098972, 0.0), (3, 0.977932, 1.0), (-30, 1e-6, 0.0)]


@pytest.mark.parametrize("log_a, p_open, gate", TABLE)
def test_oracle_table(log_a, p_open, gate):
    x = torch.tensor([log_a], dtype=torch.float64)
    assert concrete_p_open(x).item() == pytest.approx(p_open, abs=1e-6)
    assert concrete_eval(x).item() == pytest.approx(gate, abs=1e-6)


def test_eval_gate_is_exactly_zero_and_one_at_ln11():
    x = torch.tensor([-LN11 - 1e-9, LN11 + 1e-9], dtype=torch.float64)
    assert concrete_eval(x).tolist() == [0.0, 1.0]


def test_module_sums():
    assert concrete_p_open(torch.zeros(8, dtype=torch.float64)).sum().item() == pytest.approx(
        5.504893, abs=1e-6)
    log_a = torch.tensor([-2, -1, 0, 1, 2, 3, -3, 0.5], dtype=torch.float64)
    assert concrete_p_open(log_a).tolist() == pytest.approx(
        [0.229932, 0.448015, 0.688112, 0.857087, 0.942204, 0.977932, 0.098972, 0.784368],
        abs=1e-6)
    assert concrete_p_open(log_a).sum().item() == pytest.approx(5.026622, abs=1e-6)
    assert concrete_eval(log_a).tolist() == pytest.approx(
        [0.043044, 0.222730, 0.5, 0.777270, 0.956956, 1, 0, 0.646951], abs=1e-6)


@pytest.mark.parametrize("log_a, u, gate", [(0, 0.5, 0.5), (0, 0.25, 0.0), (1, 0.9, 1.0),
                                            (-1, 0.1, 0.0)])
def test_training_sample_with_fixed_noise(log_a, u, gate):
    g = concrete_sample(torch.tensor([log_a], dtype=torch.float64),
                        torch.tensor([u], dtype=torch.float64))
    assert g.item() == pytest.approx(gate, abs=1e-6)


@pytest.mark.parametrize("init, heads, bound", [("tf_glorot", 4, 0.866025),
                                                ("tf_glorot", 8, 0.612372),
                                                ("torch_xavier", 4, 1.095445),
                                                ("torch_xavier", 8, 0.816497)])
def test_initialisation_bounds(init, heads, bound):
    torch.manual_seed(0)
    gates = HardConcreteGates({f"E{i}": heads for i in range(200)},
                              Namespace(hard_concrete_init=init))
    values = torch.cat(list(gates.log_a.values()))
    assert values.abs().max() <= bound + 1e-6
    assert values.abs().max() >= 0.98 * bound  # uniform on the whole interval


def test_one_sample_per_head_per_forward_and_eval_is_deterministic():
    gates = HardConcreteGates({"E0": 4, "A1": 8})
    gates.train()
    first = {k: v.clone() for k, v in gates.compute().items()}
    assert first["E0"].shape == (4,) and first["A1"].shape == (8,)
    assert gates.gate("E0") is gates.gate("E0")  # one sample until the model's next forward
    gates.eval()
    with torch.no_grad():
        assert torch.equal(gates.gate("A1"), concrete_eval(gates.log_a["A1"]))


class FakeModel(torch.nn.Module):
    def __init__(self, log_a):
        super().__init__()
        self.head_gates = HardConcreteGates({f"E{i}": len(v) for i, v in enumerate(log_a)})
        with torch.no_grad():
            for i, v in enumerate(log_a):
                self.head_gates.log_a[f"E{i}"].copy_(torch.tensor(v))


def criterion(**kwargs):
    task = Namespace(target_dictionary=Namespace(pad=lambda: 1))
    return L0LabelSmoothedCrossEntropy(task, False, 0.1, **kwargs)


@pytest.mark.parametrize("normalize, expected", [("module_mean", 5.315237),
                                                 ("module_sum", 15.945710)])
def test_aggregation_over_modules(normalize, expected):
    model = FakeModel([[0.0] * 8, [1.0] * 8, [-1.0] * 8])
    term, heads, per_type, total = criterion(l0_lambda=1.0, l0_normalize=normalize).penalty(model)
    assert term.item() == pytest.approx(expected, abs=1e-5)
    assert heads.item() == pytest.approx(15.945710, abs=1e-5) and total == 24
    assert per_type == {"E": pytest.approx(15.945710, abs=1e-5)}


def test_gradient_of_one_log_a_matches_the_hand_formula():
    """d(lambda * sample_size * mean_m S_m) / d log_a[m, h] = lambda * ss / M * p (1 - p)."""
    model = FakeModel([[0.3, -1.0, 2.0, 0.0], [1.0, 0.5, -0.5, 0.0]] + [[0.0] * 4] * 16)
    lam, sample_size, modules = 0.1, 4000, 18  # a 6+6 model with all three types gated
    term, *_ = criterion(l0_lambda=lam).penalty(model)
    (term * sample_size).backward()
    p = concrete_p_open(torch.tensor(-1.0)).item()
    hand = lam * sample_size / modules * p * (1 - p)
    assert model.head_gates.log_a["E0"].grad[1].item() == pytest.approx(hand, rel=1e-5)
    assert hand == pytest.approx(22.2222 * 0.448015 * 0.551985, rel=1e-5)  # oracle 6.1: 0.1 * 4000 / 18


def test_criterion_adds_lambda_times_sample_size(headprune_checkpoint, data_dir):
    model, task = load(headprune_checkpoint, data_dir)
    args = model.args
    args.head_gates, args.head_gates_types = "hard_concrete", "E,D,A"
    gated = tasks.setup_task(args).build_model(args)
    gated.load_state_dict(model.state_dict(), strict=False)
    gated.eval()
    crit = L0LabelSmoothedCrossEntropy(task, False, 0.1, l0_lambda=0.5)
    sample = batch(task)
    loss, sample_size, log = crit(gated, sample)
    p_open = gated.head_gates.p_open()
    mean_sum = sum(p.sum() for p in p_open.values()).item() / 6
    assert log["l0_loss"] == pytest.approx(0.5 * sample_size * mean_sum, rel=1e-5)
    assert loss.item() == pytest.approx(float(log["loss"]) + log["l0_loss"], rel=1e-5)
    assert set(log) >= {"l0_open_E", "l0_open_D", "l0_open_A", "l0_expected_heads", "l0_lambda"}


def test_target_mode_plain_ascent():
    model = FakeModel([[0.0] * 8, [0.0] * 8])  # 11.0098 expected open heads of 16
    crit = criterion(l0_target_heads=4, l0_multiplier_lr=0.5, l0_multiplier_optimizer="sgd")
    model.train()
    crit.penalty(model)
    c = (2 * 5.504893 - 4) / 16
    assert crit.multipliers.tolist() == pytest.approx([0.5 * c, 0.5 * c * c], abs=1e-5)
    term, *_ = crit.penalty(model)  # uses the updated multipliers
    assert term.item() == pytest.approx((0.5 * c) * c + (0.5 * c * c) * c * c, abs=1e-5)
    model.eval()
    crit.penalty(model)
    assert crit.multipliers.tolist() == pytest.approx([c, c * c], abs=1e-5)  # no update in eval
    assert criterion(l0_target_heads=0.25).target(16) == 4.0


def test_target_mode_adam_ascent_by_hand():
    """CoFi's AdamW with a negative learning rate: m, v moments, bias-corrected, lr 0.1."""
    crit = criterion(l0_target_heads=4, l0_multiplier_lr=0.1)
    crit.ascend(torch.tensor([0.5, 0.25]))  # step 1: m_hat = g, v_hat = g^2: lambda += lr
    assert crit.multipliers.tolist() == pytest.approx([0.1, 0.1], abs=1e-6)
    crit.ascend(torch.tensor([-0.25, 0.0625]))
    # step 2, lambda_1: m = 0.9*0.05 + 0.1*(-0.25) = 0.02, m_hat = 0.02/0.19;
    # v = 0.999*0.00025 + 0.001*0.0625 = 0.00031225, v_hat = v/0.001999
    m_hat, v_hat = 0.02 / 0.19, 0.00031225 / 0.001999
    assert crit.multipliers[0].item() == pytest.approx(0.1 + 0.1 * m_hat / math.sqrt(v_hat),
                                                       abs=1e-6)
    # lambda_2: m = 0.9*0.025 + 0.1*0.0625 = 0.02875; v = 0.999*0.0000625 + 0.001*0.00390625
    m_hat, v_hat = 0.02875 / 0.19, (0.0000624375 + 0.00000390625) / 0.001999
    assert crit.multipliers[1].item() == pytest.approx(0.1 + 0.1 * m_hat / math.sqrt(v_hat),
                                                       abs=1e-6)
    assert int(crit.multiplier_steps) == 2


def test_target_mode_adam_through_penalty():
    model = FakeModel([[0.0] * 8, [0.0] * 8])  # c = (11.0098 - 4) / 16 > 0
    crit = criterion(l0_target_heads=4, l0_multiplier_lr=0.05)
    model.train()
    term, *_ = crit.penalty(model)
    assert term.item() == 0.0  # multipliers start at 0 (CoFi l0_module.py l.72-73)
    assert crit.multipliers.tolist() == pytest.approx([0.05, 0.05], abs=1e-6)


def test_target_warmup_is_linear_from_every_gated_head():
    crit = criterion(l0_target_heads=4, l0_target_warmup=4)
    assert [crit.target(16, step) for step in (0, 1, 2, 4, 10)] == [16, 13, 10, 4, 4]
    assert crit.target(16) == 4  # evaluation: the target itself
    model = FakeModel([[0.0] * 8, [0.0] * 8])
    model.train()
    crit.penalty(model)
    crit.penalty(model)  # second batch: target 13
    c0, c1 = (2 * 5.504893 - 16) / 16, (2 * 5.504893 - 13) / 16  # both < 0: lambda_1 falls
    m_hat = (0.9 * 0.1 * c0 + 0.1 * c1) / 0.19
    v_hat = (0.999 * 0.001 * c0 ** 2 + 0.001 * c1 ** 2) / 0.001999
    assert crit.multipliers[0].item() == pytest.approx(-0.01 + 0.01 * m_hat / math.sqrt(v_hat),
                                                       abs=1e-6)


def test_damping_adds_a_fixed_quadratic_term():
    model = FakeModel([[0.0] * 8, [0.0] * 8])
    model.train()
    term, *_ = criterion(l0_target_heads=4, l0_damping=3.0).penalty(model)
    c = (2 * 5.504893 - 4) / 16
    assert term.item() == pytest.approx(3.0 * c * c, abs=1e-5)  # the multipliers are still 0


def test_state_without_adam_moments_loads():
    crit = criterion(l0_target_heads=4)
    crit.load_state_dict({"multipliers": torch.tensor([0.5, 0.25])})
    assert crit.multipliers.tolist() == [0.5, 0.25] and int(crit.multiplier_steps) == 0


@pytest.mark.parametrize("kwargs, message", [
    ({"l0_lambda": -0.1}, "--l0-lambda must be >= 0, got -0.1."),
    ({"l0_target_heads": -2}, "--l0-target-heads must be >= 0, got -2."),
    ({"l0_target_warmup": -1}, "--l0-target-warmup must be >= 0, got -1."),
    ({"l0_damping": -0.5}, "--l0-damping must be >= 0, got -0.5."),
])
def test_bad_criterion_options(kwargs, message):
    with pytest.raises(HeadPruneError) as err:
        criterion(**kwargs)
    assert str(err.value) == message


def test_target_above_the_gated_heads():
    with pytest.raises(HeadPruneError) as err:
        criterion(l0_target_heads=17).penalty(FakeModel([[0.0] * 8, [0.0] * 8]))
    assert str(err.value) == "--l0-target-heads 17 is above the 16 gated heads of this model."


def test_criterion_needs_hard_concrete_gates(headprune_checkpoint, data_dir):
    model, task = load(headprune_checkpoint, data_dir)
    with pytest.raises(HeadPruneError, match="add --head-gates hard_concrete"):
        L0LabelSmoothedCrossEntropy(task, False, 0.1)(model, batch(task))


# ---------------------------------------------------------------- through the real commands

RESET = ["--reset-optimizer", "--reset-dataloader", "--reset-meters", "--reset-lr-scheduler"]


def gate_train(data_dir, restore, save, *extra, reset=RESET):
    return run(["fairseq-train", data_dir, "--user-dir", USER_DIR, "--arch",
                "transformer_headprune", *TINY_MODEL, "--head-gates", "hard_concrete",
                "--restore-file", restore, *reset, "--optimizer", "adam", "--lr", "0.001",
                "--head-gates-lr", "0.05",
                "--max-tokens", "500", "--cpu", "--criterion", "l0_label_smoothed_cross_entropy",
                "--label-smoothing", "0.1", "--save-dir", str(save), "--no-epoch-checkpoints",
                "--no-progress-bar", "--log-format", "simple", "--log-interval", "1", "--seed",
                "1", *extra], check=False)


def test_encoder_only_gates_train_log_and_prune(headprune_checkpoint, data_dir, tmp_path):
    proc = gate_train(data_dir, headprune_checkpoint, tmp_path / "g", "--head-gates-types", "E",
                      "--l0-lambda", "50", "--max-update", "55")
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    gated = str(tmp_path / "g" / "checkpoint_last.pt")
    before = load_checkpoint(gated)["model"]["head_gates.log_a.E0"]
    resumed = gate_train(data_dir, "checkpoint_last.pt", tmp_path / "g", "--head-gates-types",
                         "E", "--l0-lambda", "50", "--max-update", "56", reset=[])
    assert resumed.returncode == 0, resumed.stderr[-3000:]  # optimizer state restored
    after = load_checkpoint(gated)["model"]["head_gates.log_a.E0"]
    assert 0 < (before - after).abs().max() < 0.2  # one more update, not a restart
    assert re.search(r"open_E [\d.]+", log) and "open_D" not in log
    assert re.search(r"l0_expected_heads [\d.]+", log) and re.search(r"l0_lambda 50", log)
    state = load_checkpoint(gated)
    assert sorted(k for k in state["model"] if k.startswith("head_gates.")) == [
        "head_gates.log_a.E0", "head_gates.log_a.E1"]
    log_a = torch.cat([state["model"]["head_gates.log_a.E0"], state["model"]["head_gates.log_a.E1"]])
    assert log_a.max() < 0.866025  # lambda 50 pushed every gate down from its initialisation
    pruned = str(tmp_path / "pruned.pt")
    out = run(["fairseq-headprune", "prune", "--from-gates", gated, "-o", pruned]).stdout
    closed = int((concrete_eval(log_a) == 0).sum())
    assert closed >= 1  # lambda 50 closed encoder heads (zero-head layers decode too)
    assert f"removed {closed} heads with gate 0" in out
    layout = HeadLayout.from_state_dict(load_checkpoint(pruned)["model"],
                                        {"E": 4, "D": 4, "A": 4})
    assert layout.count("E") == 8 - closed and layout.count("D") == 8
    gen = ["fairseq-generate", data_dir, "--user-dir", USER_DIR, "--cpu", "--gen-subset",
           "valid", "--beam", "4", "--max-len-b", "20", "--batch-size", "8"]
    hyps = [{line.split("\t")[0]: line.split("\t")[2] for line in run(gen + ["--path", p])
             .stdout.splitlines() if line.startswith("H-")} for p in (gated, pruned)]
    assert len(hyps[0]) == 24 and hyps[0] == hyps[1]


def test_target_mode_trains(headprune_checkpoint, data_dir, tmp_path):
    proc = gate_train(data_dir, headprune_checkpoint, tmp_path / "t", "--l0-target-heads", "12",
                      "--l0-multiplier-lr", "0.5", "--max-update", "5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"l0_lambda1 [\d.]+", proc.stdout + proc.stderr)
    state = load_checkpoint(str(tmp_path / "t" / "checkpoint_last.pt"))
    assert state["criterion"]["multipliers"][0] > 0  # restored with the checkpoint


@pytest.mark.parametrize("flags, message", [
    (["--l0-lambda", "-1"], "fairseq-train: error: --l0-lambda must be >= 0, got -1.0."),
    (["--l0-target-heads", "30"],
     "fairseq-train: error: --l0-target-heads 30.0 is above the 24 gated heads of this model."),
    (["--head-gates-types", "E,X"], "unknown attention type 'X' in --head-gates-types 'E,X'"),
])
def test_bad_input_through_fairseq_train(headprune_checkpoint, data_dir, tmp_path, flags,
                                         message):
    proc = gate_train(data_dir, headprune_checkpoint, tmp_path / "bad", "--max-update", "1",
                      *flags)
    assert proc.returncode != 0 and message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not os.path.exists(tmp_path / "bad" / "checkpoint_last.pt")


def test_keep_expected_is_cofis_deterministic_mask(headprune_checkpoint, tmp_path):
    """fold --keep-expected: round(sum of P(open)) heads stay, the largest P(open) first. Every
    log_a 0 (P(open) 0.688112) except E0's, so the expected count is 20 * 0.688112 plus E0's."""
    state = load_checkpoint(headprune_checkpoint)
    args = state["cfg"]["model"]
    args.head_gates, args.head_gates_types = "hard_concrete", "E,D,A"
    for key in ("E0", "E1", "D0", "D1", "A0", "A1"):
        state["model"]["head_gates.log_a." + key] = torch.zeros(4)
    state["model"]["head_gates.log_a.E0"] = torch.tensor([5.0, -5.0, -5.0, 1.0])
    gated = str(tmp_path / "gated.pt")
    save_checkpoint(state, gated)
    p = torch.sigmoid(torch.tensor([5.0, -5.0, -5.0, 1.0]) + 0.33 * math.log(11.0))
    expected = 20 * 0.688112 + float(p.sum())  # 15.65 -> 16
    assert round(expected) == 16
    report = fold_checkpoint(gated, str(tmp_path / "folded.pt"), keep_expected=True)
    assert report["expected_open"] == 16 and report["heads_after"] == 16
    layout = HeadLayout.from_state_dict(load_checkpoint(str(tmp_path / "folded.pt"))["model"],
                                        {"E": 4, "D": 4, "A": 4})
    # E0 heads 0 and 3 first (largest P(open)), then ties at 0.688 in E1, D0, D1, A0 order
    assert layout.kept == {"E": [[0, 3], [0, 1, 2, 3]], "D": [[0, 1, 2, 3], [0, 1, 2, 3]],
                           "A": [[0, 1], []]}
