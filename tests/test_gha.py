"""Ni et al. (2023) GHA: k-means, the group constraint and Voting-to-Stay against METHODS_NOTES
oracle 6.4, the feature tap against fairseq's fused path, and the whole command sequence (train
with the constraint, vote, choose, prune, fine-tune, decode) through stock fairseq."""

import json
import math
import re

import pytest
import torch
from conftest import TINY_MODEL, USER_DIR, batch, load, run

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.heads.layout import HeadLayout, attention_modules
from fairseq_headprune.methods.gha import (
    FeatureTap, GroupConstraintCriterion, check_groups, group_loss, initial_rows, keep_top_votes,
    kmeans, nearest_votes)
from fairseq_headprune.pruning.checkpoint import load_checkpoint
from fairseq_headprune.pruning.selection import choose_per_module

X4 = [[1, 0], [0.9, 0.1], [0, 1], [0.1, 1]]
X6 = [[1, 0], [0.9, 0.2], [0.7, 0.1], [0, 1], [0.2, 0.8], [0.1, 1.1]]
Y6 = [[1, 0, 0], [0.9, 0.1, 0], [0, 1, 0], [0, 0.9, 0.1], [0, 0, 1], [0.1, 0, 0.9]]


def t(rows):
    return torch.tensor(rows, dtype=torch.float64).unsqueeze(0)


@pytest.mark.parametrize("x, groups, labels, loss", [
    (X4, 2, [1, 1, 0, 0], -0.427653),  # the oracle: -0.499306 + 0.071653
    (X6, 2, [1, 1, 1, 0, 0, 0], -0.346320),  # -0.497686 + 0.151366
    (Y6, 3, [2, 2, 1, 1, 0, 0], -0.462493),  # three groups: normaliser C(3, 2) = 3
])
def test_group_loss_oracle(x, groups, labels, loss):
    lab, centres = kmeans(t(x), groups, seed=0)
    assert lab[0].tolist() == labels
    assert group_loss(t(x), lab, centres, 0.5, 0.7).item() == pytest.approx(loss, abs=1e-6)


def test_kmeans_oracle_centres_and_terms():
    assert initial_rows(4, 2, 0).tolist() == [2, 3]  # np.random.seed(0); choice(4, 2)
    labels, centres = kmeans(t(X4), 2, seed=0)
    assert centres[0].tolist() == [pytest.approx([0.05, 1.0]), pytest.approx([0.95, 0.05])]
    assert group_loss(t(X4), labels, centres, 0.5, 0.0).item() == pytest.approx(-0.499306, abs=1e-6)
    assert group_loss(t(X4), labels, centres, 0.0, 0.7).item() == pytest.approx(0.071653, abs=1e-6)


def test_votes_oracle_and_top_c_per_module():
    labels, centres = kmeans(t(X6), 2, seed=0)
    assert centres[0].tolist() == [pytest.approx([0.1, 0.966667], abs=1e-6),
                                   pytest.approx([0.866667, 0.1], abs=1e-6)]
    assert nearest_votes(t(X6), labels, centres)[0].tolist() == [0, 1, 0, 1, 0, 0]
    totals = torch.tensor([[0, 1, 0, 1, 0, 0], [0, 1, 0, 0, 0, 1], [1, 0, 0, 1, 0, 0],
                           [0, 1, 0, 0, 0, 1]], dtype=torch.float64).sum(0)
    assert totals.tolist() == [1, 3, 0, 2, 0, 2]
    assert keep_top_votes(totals, 2).tolist() == [0, 1, 0, 1, 0, 0]  # 3-vs-5 tie: the lower
    spec = choose_per_module({"E": totals.unsqueeze(0)}, 2)
    assert spec == {"E": {0: [0, 2, 4, 5]}}


def test_equidistant_members_vote_for_the_lower_head():
    x = t([[0, 0], [2, 0], [10, 10], [10, 12]])  # exactly 1 from each centre (X4 is not, in floats)
    labels, centres = kmeans(x, 2, seed=0)
    assert labels[0].tolist() == [0, 0, 1, 1]
    assert nearest_votes(x, labels, centres)[0].tolist() == [1, 0, 1, 0]


def test_kmeans_is_batched_deterministic_and_differentiable():
    torch.manual_seed(0)
    x = torch.randn(5, 6, 7, dtype=torch.float64, requires_grad=True)
    labels, centres = kmeans(x, 3, seed=4)
    for m in range(5):  # the batch clusters each module on its own
        lm, cm = kmeans(x[m:m + 1], 3, seed=4)
        assert torch.equal(lm[0], labels[m]) and torch.allclose(cm[0], centres[m])
    again, _ = kmeans(x, 3, seed=4)
    assert torch.equal(again, labels)
    assert not torch.equal(kmeans(x, 3, seed=1)[1], centres)  # another seed, other starts
    onehot = torch.nn.functional.one_hot(labels, 3).double()
    means = (onehot.transpose(1, 2) @ x.detach()) / onehot.sum(1).unsqueeze(-1)
    assert torch.allclose(centres.detach(), means)  # the centres are their members' means
    group_loss(x, labels, centres, 0.5, 0.7).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_choose_per_module_ties_pruned_heads_and_too_few():
    scores = {"E": torch.tensor([[0.5, 0.5, 0.5, 0.1], [math.nan, 0.2, 0.9, math.nan]]),
              "A": torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])}
    assert choose_per_module(scores, 2) == {"E": {0: [2, 3]}, "A": {0: [2, 3], 1: [1, 2]}}
    assert choose_per_module(scores, 2, "A") == {"A": {0: [2, 3], 1: [1, 2]}}
    with pytest.raises(HeadPruneError, match=re.escape(
            "cannot keep 3 heads of E:2: it has 2 left of its 4 after pruning.")):
        choose_per_module(scores, 3)


def test_group_counts_are_checked_against_the_layout():
    layout = HeadLayout({"E": 4, "D": 4}, {"E": [[0, 1, 2, 3], [1, 3]], "D": [[0, 1, 2, 3]]})
    check_groups(layout, "ED", 2, 2, "--gha-groups")
    with pytest.raises(HeadPruneError, match=re.escape(
            "--gha-groups 3 is more than the 2 heads left of its 4 after pruning of E:2.")):
        check_groups(layout, "ED", 3, 2, "--gha-groups")
    check_groups(layout, "D", 3, 2, "--gha-groups")  # E is not constrained
    with pytest.raises(HeadPruneError, match=re.escape(
            "--groups 5 is more than the 4 heads of D:1.")):
        check_groups(layout, "D", 5, 1, "--groups")
    with pytest.raises(HeadPruneError, match=re.escape(
            "--gha-groups must be at least 2, got 1: the diversification term averages over "
            "pairs of group centres.")):
        check_groups(layout, "E", 1, 2, "--gha-groups")
    with pytest.raises(HeadPruneError, match=re.escape("--groups must be at least 1, got 0.")):
        check_groups(layout, "E", 0, 1, "--groups")


@pytest.mark.parametrize("feature, width", [
    ("headout", {"E": "src", "D": "tgt", "A": "tgt"}), ("V", {"E": "src", "D": "tgt", "A": "src"}),
    ("Q", {"E": "src", "D": "tgt", "A": "tgt"}), ("K", {"E": "src", "D": "tgt", "A": "src"}),
    ("attn_matrix", None)])
def test_tap_shapes_and_outputs_equal_the_fused_path(headprune_checkpoint, data_dir, feature,
                                                     width):
    model, task = load(headprune_checkpoint, data_dir)
    sample = batch(task)
    net = sample["net_input"]
    bsz, src, tgt = net["src_tokens"].size(0), net["src_tokens"].size(1), sample["target"].size(1)
    with torch.no_grad():
        fused = model(**net)[0]
        with FeatureTap(model, "EDA", feature) as tap:
            tapped = model(**net)[0]
    assert torch.allclose(fused, tapped, atol=1e-5)
    assert all(not m.explicit_path for *_, m in attention_modules(model))  # restored
    assert sorted(tap.features) == ["A0", "A1", "D0", "D1", "E0", "E1"]
    length = {"src": src, "tgt": tgt}
    for key, feat in tap.features.items():
        if width is None:
            keys = {"E": (src, src), "D": (tgt, tgt), "A": (tgt, src)}[key[0]]
            assert feat.shape == (4, bsz * keys[0] * keys[1])
        else:
            assert feat.shape == (4, bsz * length[width[key[0]]] * 4)  # d_h = 16 / 4


def test_criterion_adds_the_sum_of_module_constraints(headprune_checkpoint, data_dir):
    from fairseq.criterions.label_smoothed_cross_entropy import (
        LabelSmoothedCrossEntropyCriterion)

    model, task = load(headprune_checkpoint, data_dir)
    sample = batch(task)
    crit = GroupConstraintCriterion(task, False, 0.1, gha_types="E,A")
    plain = LabelSmoothedCrossEntropyCriterion(task, False, 0.1)
    loss, size, log = crit(model, sample)
    base, _, _ = plain(model, sample)
    with torch.no_grad(), FeatureTap(model, "EA", "headout") as tap:
        model(**sample["net_input"])
    expected = 0.0
    for key, x in tap.features.items():
        labels, centres = kmeans(x.unsqueeze(0), 2)
        expected += group_loss(x.unsqueeze(0), labels, centres, 0.5, 0.7).item()
    assert log["group_loss"] == pytest.approx(expected, abs=1e-5)
    assert loss.item() == pytest.approx(base.item() + expected, abs=1e-4)
    loss.backward()
    q = model.encoder.layers[0].self_attn.q_proj.weight
    assert q.grad is not None and q.grad.abs().sum() > 0


GHA = ["--user-dir", USER_DIR, "--arch", "transformer_headprune", *TINY_MODEL,
       "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "500", "--cpu",
       "--label-smoothing", "0.1", "--no-epoch-checkpoints", "--no-progress-bar",
       "--log-format", "simple", "--log-interval", "1", "--seed", "1"]
RESET = ["--reset-optimizer", "--reset-dataloader", "--reset-meters", "--reset-lr-scheduler"]
CONSTRAINT = ["--criterion", "group_constraint_label_smoothed_cross_entropy"]


def test_train_vote_choose_prune_fine_tune_generate(headprune_checkpoint, data_dir, tmp_path):
    save = tmp_path / "gha"
    log = run(["fairseq-train", data_dir, *GHA, *CONSTRAINT, "--restore-file",
               headprune_checkpoint, *RESET, "--max-update", "3", "--save-dir", str(save)])
    per_update = re.findall(r"group=(-?[\d.]+),.* wpb=([\d.]+),", log.stdout + log.stderr)
    assert len(per_update) == 3  # logged per token: 6 modules, each in [-0.5, 0.7] per batch
    assert all(-3.0 <= float(g) * float(wpb) < 0 for g, wpb in per_update), per_update
    trained = str(save / "checkpoint_last.pt")
    votes = tmp_path / "votes.json"
    run(["fairseq-headprune", "vote", data_dir, "--path", trained, "-o", str(votes), "--cpu",
         "--batch-size", "8"])
    v = json.loads(votes.read_text())
    assert v["method"] == "Ni et al. 2023, Voting-to-Stay votes" and v["groups"] == 2
    assert v["sentences"] == 24 and v["normalize"] == "none"
    for kind in "EDA":  # 3 batches, 2 votes per batch: each module's fractions sum to 2
        assert [sum(row) for row in v["importance"][kind]] == pytest.approx([2.0, 2.0])
        assert all(x * 3 == pytest.approx(round(x * 3)) for row in v["importance"][kind]
                   for x in row)
    spec = tmp_path / "spec.json"
    run(["fairseq-headprune", "choose", "--importance", str(votes), "--per-module", "2", "-o",
         str(spec)])
    pruned = str(tmp_path / "pruned.pt")
    run(["fairseq-headprune", "prune", "--path", trained, "--heads", str(spec), "-o", pruned])
    layout = HeadLayout.from_state_dict(load_checkpoint(pruned)["model"],
                                        {"E": 4, "D": 4, "A": 4})
    assert [len(k) for kind in "EDA" for k in layout.kept[kind]] == [2] * 6
    chosen = json.loads(spec.read_text())["heads"]
    assert layout.kept["E"][0] == [h for h in range(4) if h + 1 not in chosen["E"]["1"]]
    tuned = tmp_path / "tuned"
    run(["fairseq-train", data_dir, *GHA, "--criterion", "label_smoothed_cross_entropy",
         "--restore-file", pruned, *RESET, "--max-update", "2", "--save-dir", str(tuned)])
    final = str(tuned / "checkpoint_last.pt")
    assert HeadLayout.from_state_dict(load_checkpoint(final)["model"],
                                      {"E": 4, "D": 4, "A": 4}).count() == 12
    out = run(["fairseq-generate", data_dir, "--user-dir", USER_DIR, "--path", final,
               "--gen-subset", "test", "--beam", "2", "--cpu", "--batch-size", "8"])
    assert "BLEU" in out.stdout and len(re.findall(r"^H-", out.stdout, re.M)) == 24

    # bad input: one sentence, nonzero exit, nothing written
    bad = tmp_path / "bad.json"
    for argv, message in [
        (["vote", data_dir, "--path", trained, "--groups", "5"],
         "--groups 5 is more than the 4 heads of E:1."),
        (["vote", data_dir, "--path", pruned, "--groups", "3"],
         "--groups 3 is more than the 2 heads left of its 4 after pruning of E:1."),
        (["choose", "--importance", str(votes), "--per-module", "5"],
         "cannot keep 5 heads of E:1: it has 4."),
    ]:
        cpu = ["--cpu"] if argv[0] == "vote" else []
        proc = run(["fairseq-headprune", *argv, "-o", str(bad), *cpu], check=False)
        assert proc.returncode != 0 and message in proc.stderr, proc.stderr
        assert not bad.exists()
    foreign = json.loads(votes.read_text())  # the votes of a model with a third encoder layer
    foreign["importance"]["E"].append([0.0, 1.0, 1.0, 0.0])
    (tmp_path / "foreign.json").write_text(json.dumps(foreign))
    run(["fairseq-headprune", "choose", "--importance", str(tmp_path / "foreign.json"),
         "--per-module", "2", "-o", str(tmp_path / "foreign_spec.json")])
    proc = run(["fairseq-headprune", "prune", "--path", trained, "--heads",
                str(tmp_path / "foreign_spec.json"), "-o", str(bad)], check=False)
    assert proc.returncode != 0 and not bad.exists()
    assert ("layer 3 is out of range for E (encoder self-attention): the model has 2 layers "
            "(1-2)." in proc.stderr), proc.stderr
    proc = run(["fairseq-train", data_dir, *GHA, *CONSTRAINT, "--gha-groups", "3",
                "--restore-file", pruned, *RESET, "--max-update", "1", "--save-dir",
                str(tmp_path / "bad")], check=False)
    assert proc.returncode != 0
    assert ("--gha-groups 3 is more than the 2 heads left of its 4 after pruning of E:1."
            in proc.stderr), proc.stderr[-2000:]


@pytest.mark.parametrize("keep, weights_only", [(8, 44_138_496), (4, 34_701_312),
                                                (2, 29_982_720)])
def test_parameter_arithmetic_of_table_1(keep, weights_only):
    """METHODS_NOTES 4.6: transformer base without embeddings has 44,138,496 parameters; keeping
    C of 8 heads in all 18 modules removes 18 * (8 - C) * 4 * 512 * 64 weights (Table 1's 30M;
    the notes' figures). Removal also takes each removed head's q, k and v biases, 3 * 64 more
    per head, which the notes' arithmetic leaves out."""
    from argparse import Namespace

    from fairseq.data import Dictionary

    from fairseq_headprune.model.transformer import HeadPruneTransformerModel, base_architecture
    from fairseq_headprune.pruning.masking import remove_heads_from_model

    args = Namespace(arch="transformer_headprune")
    base_architecture(args)
    d = Dictionary()
    model = HeadPruneTransformerModel.build_model(
        args, Namespace(source_dictionary=d, target_dictionary=d))
    spec = {kind: {layer: list(range(keep, 8)) for layer in range(6)} for kind in "EDA"}
    if keep < 8:
        remove_heads_from_model(model, spec)
    removed = 18 * (8 - keep)
    assert sum(p.numel() for name, p in model.named_parameters()
               if "embed_tokens" not in name and "output_projection" not in name) == (
        weights_only - removed * 3 * 64)


@pytest.mark.parametrize("flags, message", [
    (["--gha-groups", "1"], "--gha-groups must be at least 2, got 1: the diversification term "
                            "averages over pairs of group centres."),
    (["--gha-groups", "5"], "--gha-groups 5 is more than the 4 heads of E:1."),
    (["--gha-types", "EX"], "unknown attention type 'X' in --gha-types 'EX'"),
])
def test_bad_input_through_fairseq_train(data_dir, tmp_path, flags, message):
    proc = run(["fairseq-train", data_dir, *GHA, *CONSTRAINT, *flags, "--max-update", "1",
                "--save-dir", str(tmp_path / "out")], check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert message in proc.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "out" / "checkpoint_last.pt").exists()
