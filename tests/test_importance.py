"""Michel et al. gradient importance: analytic gradient, batching independence, reduction."""

import copy
import json
import math
import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import USER_DIR, load, run

from fairseq_headprune.heads.layout import attention_modules
from fairseq_headprune.heads.scores import normalize_by_layer
from fairseq_headprune.heads.spec import parse_head_spec
from fairseq_headprune.io import data_fingerprint
from fairseq_headprune.methods.importance_task import KEY, reduce_importance
from fairseq_headprune.methods.michel import GradientImportance
from fairseq_headprune.pruning.masking import remove_heads_from_model


@pytest.fixture(scope="module")
def model_task(headprune_checkpoint, data_dir):
    model, task = load(headprune_checkpoint, data_dir)
    model.double()
    task.load_dataset("valid")
    return model, task


def criterion(task):
    from fairseq.criterions.label_smoothed_cross_entropy import (
        LabelSmoothedCrossEntropyCriterion,
    )

    return LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)


def collate(task, ids):
    ds = task.dataset("valid")
    return ds.collater([ds[i] for i in ids])


def logs(model, task, batches, absolute="sentence"):
    out = []
    for ids in batches:
        scores, _, _, log = GradientImportance(absolute).batch_scores(
            model, collate(task, ids), criterion(task))
        out.append({**{KEY + k: v for k, v in scores.items()}, **log})
    return out


def nll64(model, sample):
    """Token-summed NLL in float64 (fairseq's criteria take log_softmax in float32)."""
    logits, _ = model(**sample["net_input"])
    lprobs = torch.log_softmax(logits.double(), -1)
    target = sample["target"]
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    loss = nll[target.ne(1)].sum()
    return loss, sample["ntokens"], {"nsentences": target.size(0), "ntokens": sample["ntokens"]}


def test_equals_finite_difference(model_task):
    """d L / d xi_h by central differences, for a head of each type, one sentence."""
    model, task = model_task
    sample = collate(task, [3])
    scores, _, _, _ = GradientImportance("sentence").batch_scores(model, sample, nll64)
    eps = 1e-3  # fairseq takes the attention softmax in float32
    for kind, layer, module in attention_modules(model):
        if (kind, layer) not in (("E", 0), ("D", 1), ("A", 0)):
            continue
        head = 2
        losses = []
        for sign in (1, -1):
            gate = torch.ones(module.num_heads, dtype=torch.float64)
            gate[head] += sign * eps
            module.head_gate = gate
            with torch.no_grad():
                losses.append(nll64(model, sample)[0].item())
            module.head_gate = None
        numeric = abs(losses[0] - losses[1]) / (2 * eps)
        assert scores[kind][layer, head].item() == pytest.approx(numeric, rel=1e-3, abs=1e-7)


def test_token_mode_equals_the_authors_formula(model_task):
    """Reference by hooks: ctx = out_proj's input, s = <ctx_h,t, dL/dctx_h,t>, |s| summed over
    non-padding tokens (source for E, target for D and A), divided by their number."""
    model, task = model_task
    ids = [0, 3, 5, 7, 9]  # sentences of different lengths: padding on both sides
    sample = collate(task, ids)
    result = reduce_importance(logs(model, task, [ids], "token"), "none")["raw"]
    inputs, hooks = {}, []
    for kind, layer, module in attention_modules(model):
        def grab(mod, args, key=(kind, layer)):
            args[0].retain_grad()
            inputs[key] = args[0]
        hooks.append(module.out_proj.register_forward_pre_hook(grab))
    try:
        criterion(task)(model, sample)[0].backward()
    finally:
        for h in hooks:
            h.remove()
    src, tgt = sample["net_input"]["src_tokens"], sample["target"]
    assert src.ne(1).sum() < src.numel() and tgt.ne(1).sum() < tgt.numel()  # there is padding
    real = {"E": src.ne(1).t(), "D": tgt.ne(1).t(), "A": tgt.ne(1).t()}  # [time, batch]
    for (kind, layer), x in inputs.items():
        t, b, _ = x.shape
        s = (x * x.grad).view(t, b, 4, -1).sum(-1).abs()  # [time, batch, heads]
        expected = (s * real[kind].unsqueeze(-1)).sum((0, 1)) / real[kind].sum()
        assert torch.allclose(torch.tensor(result[kind][layer], dtype=torch.float64),
                              expected.detach(), rtol=1e-6, atol=1e-12)
    model.zero_grad()


@pytest.mark.parametrize("absolute", ["token", "sentence"])
def test_scores_do_not_depend_on_batching(model_task, absolute):
    model, task = model_task
    ids = list(range(12))
    one_batch = reduce_importance(logs(model, task, [ids], absolute), "none")
    singletons = reduce_importance(logs(model, task, [[i] for i in ids], absolute), "none")
    uneven = reduce_importance(logs(model, task, [ids[:5], ids[5:]], absolute), "none")
    for other in (singletons, uneven):
        assert other["sentences"] == one_batch["sentences"] == 12
        for kind in "EDA":
            assert torch.allclose(torch.tensor(other["raw"][kind]),
                                  torch.tensor(one_batch["raw"][kind]), rtol=1e-6)  # float32 softmax inside fairseq


def test_per_batch_abs_is_at_most_per_sentence(model_task):
    """|sum_x g(x)| <= sum_x |g(x)|: equal for one sentence, smaller for a batch."""
    model, task = model_task
    ids = list(range(12))
    per_sentence = reduce_importance(logs(model, task, [ids]), "none")["raw"]
    per_batch = reduce_importance(logs(model, task, [ids], "batch"), "none")["raw"]
    strictly_smaller = 0
    for kind in "EDA":
        s, b = torch.tensor(per_sentence[kind]), torch.tensor(per_batch[kind])
        assert (b <= s + 1e-12).all()
        strictly_smaller += int((b < s - 1e-9).sum())
    assert strictly_smaller > 0
    single = reduce_importance(logs(model, task, [[4]], "batch"), "none")["raw"]
    assert single == reduce_importance(logs(model, task, [[4]]), "none")["raw"]


@pytest.mark.parametrize("absolute", ["token", "sentence"])
def test_two_workers_sum_like_one(model_task, absolute):
    """fairseq gathers every worker's logging outputs into one list: halves add up."""
    model, task = model_task
    ids = list(range(12))
    whole = reduce_importance(logs(model, task, [ids[:6], ids[6:]], absolute), "none")
    worker0 = logs(model, task, [ids[0::2]], absolute)
    worker1 = logs(model, task, [ids[1::2]], absolute)
    gathered = reduce_importance(worker0 + worker1, "none")
    for kind in "EDA":
        assert torch.allclose(torch.tensor(gathered["raw"][kind]),
                              torch.tensor(whole["raw"][kind]), rtol=1e-6)  # float32 softmax inside fairseq


def test_layer_normalisation_hand_computed():
    table = {"E": torch.tensor([[3.0, 4.0], [math.nan, 2.0]], dtype=torch.float64)}
    out = normalize_by_layer(table)["E"]
    assert torch.allclose(out[0], torch.tensor([0.6, 0.8], dtype=torch.float64))
    assert math.isnan(out[1, 0]) and out[1, 1].item() == pytest.approx(1.0)


def test_removed_heads_stay_removed(model_task):
    model, task = model_task
    pruned = copy.deepcopy(model)
    remove_heads_from_model(pruned, parse_head_spec("E:1:2 D:2:1-4"))
    result = reduce_importance(logs(pruned, task, [[0, 1, 2]]))
    assert result["removed"] == {"E": {"1": [2]}, "D": {"2": [1, 2, 3, 4]}}
    assert result["importance"]["E"][0][1] is None
    assert result["importance"]["D"][1] == [None] * 4
    assert all(v is not None for v in result["importance"]["A"][1])


def test_fairseq_validate_writes_importance(headprune_checkpoint, data_dir, tmp_path):
    """Stock fairseq-validate with the task switched through --model-overrides, and the
    fairseq-headprune importance wrapper, write the same file."""
    out = tmp_path / "imp.json"
    overrides = {"task": {"_name": "head_importance", "data": data_dir,
                          "importance_output": str(out)}}
    run(["fairseq-validate", data_dir, "--user-dir", USER_DIR, "--task", "head_importance",
         "--path", headprune_checkpoint, "--cpu", "--max-tokens", "300",
         "--required-batch-size-multiple", "1", "--model-overrides", repr(overrides)])
    wrapped = tmp_path / "imp2.json"
    run(["fairseq-headprune", "importance", data_dir, "--path", headprune_checkpoint,
         "-o", str(wrapped), "--cpu", "--max-tokens", "300"])
    a, b = json.loads(out.read_text()), json.loads(wrapped.read_text())
    assert a["sentences"] == 24 and a["normalize"] == "layer_l2" and a["absolute"] == "token"
    assert [len(a["importance"][k]) for k in "EDA"] == [2, 2, 2]
    assert all(len(row) == 4 for k in "EDA" for row in a["importance"][k])
    for k in "EDA":
        assert torch.allclose(torch.tensor(a["importance"][k]), torch.tensor(b["importance"][k]))
        for row in a["importance"][k]:  # each layer has unit L2 norm
            assert sum(v * v for v in row) == pytest.approx(1.0)


@pytest.fixture(scope="module")
def other_data(data_dir, tmp_path_factory):
    """A second data-bin with the first one's dictionaries and 10 valid sentences."""
    from conftest import write_parallel

    raw = tmp_path_factory.mktemp("other")
    write_parallel(raw, seed=5, sizes=(("valid", 10),))
    out = raw / "bin"
    run(["fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt",
         "--validpref", str(raw / "valid"), "--destdir", str(out), "--workers", "1",
         "--srcdict", os.path.join(data_dir, "dict.src.txt"),
         "--tgtdict", os.path.join(data_dir, "dict.tgt.txt")])
    return str(out)


@pytest.mark.parametrize("batching", [["--batch-size", "1"], ["--batch-size", "3"],
                                      ["--batch-size", "8"], ["--max-tokens", "120"]])
def test_the_data_named_is_scored_whole(headprune_checkpoint, other_data, tmp_path, batching):
    """DATA, not the checkpoint's training data-bin, and every sentence of it, at any batching."""
    out = tmp_path / "imp.json"
    run(["fairseq-headprune", "importance", other_data, "--path", headprune_checkpoint,
         "-o", str(out), "--cpu", *batching])
    result = json.loads(out.read_text())
    assert result["sentences"] == 10 and result["subset"] == "valid"
    assert result["data"] == os.path.abspath(other_data)
    assert result["data_sha256"] == data_fingerprint(other_data, "valid")


def test_fairseq_validate_route_scores_data_and_refuses_dropped_sentences(
        headprune_checkpoint, other_data, tmp_path):
    out = tmp_path / "imp.json"
    overrides = {"task": {"_name": "head_importance", "data": other_data,
                          "importance_output": str(out)}}
    cmd = ["fairseq-validate", other_data, "--user-dir", USER_DIR, "--task", "head_importance",
           "--path", headprune_checkpoint, "--cpu", "--batch-size", "3",
           "--model-overrides", repr(overrides)]
    proc = run(cmd, check=False)  # the default multiple of 8 drops the last batch
    assert proc.returncode != 0 and not out.exists() and "Traceback" not in proc.stderr
    assert re.search(r"head importance saw [0-9] of the 10 sentences of 'valid' in "
                     + re.escape(other_data) + ": ", proc.stderr)
    run(cmd + ["--required-batch-size-multiple", "1"])
    assert json.loads(out.read_text())["sentences"] == 10


def test_missing_data_is_one_sentence(headprune_checkpoint, tmp_path):
    out = tmp_path / "imp.json"
    proc = run(["fairseq-headprune", "importance", str(tmp_path / "nowhere"), "--path",
                headprune_checkpoint, "-o", str(out), "--cpu"], check=False)
    assert proc.returncode == 2 and not out.exists()
    assert proc.stderr.strip().endswith(
        f"error: data directory {tmp_path / 'nowhere'} does not exist.")


@pytest.mark.parametrize("batch_size", [5, 3])
def test_two_data_parallel_workers_equal_one(headprune_checkpoint, data_dir, tmp_path,
                                             batch_size):
    """fairseq-validate's loop on 2 gloo workers (5 per batch: one worker gets a filler batch)
    gives the importance of 1 worker to 1e-6, every sentence counted once."""
    script = os.path.join(os.path.dirname(__file__), "distributed_importance.py")

    def launch(world, out):
        procs = [subprocess.Popen(
            [sys.executable, script, str(rank), str(world), str(tmp_path / f"init{world}"),
             data_dir, headprune_checkpoint, str(out), str(batch_size)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(world)]
        for p in procs:
            _, err = p.communicate(timeout=300)
            assert p.returncode == 0, err[-3000:]
        return json.loads(out.read_text())

    one, two = launch(1, tmp_path / "one.json"), launch(2, tmp_path / "two.json")
    assert one["sentences"] == two["sentences"] == 24 and one["tokens"] == two["tokens"]
    for kind in "EDA":
        assert torch.allclose(torch.tensor(two["raw"][kind]), torch.tensor(one["raw"][kind]),
                              rtol=1e-6, atol=0)
        assert torch.allclose(torch.tensor(two["importance"][kind]),
                              torch.tensor(one["importance"][kind]), rtol=1e-6, atol=0)


def test_checkpoint_activations_in_the_saved_options_score_the_same(
        headprune_checkpoint, importance_file, data_dir, tmp_path):
    """A checkpoint trained with --checkpoint-activations keeps the option; the scoring task
    builds its layers unwrapped, so the probe gates get gradients (they used to score 0)."""
    from fairseq_headprune.pruning.checkpoint import load_checkpoint, save_checkpoint

    state = load_checkpoint(headprune_checkpoint)
    state["cfg"]["model"].checkpoint_activations = True
    state["cfg"]["model"].offload_activations = True
    path = str(tmp_path / "ckpt_act.pt")
    save_checkpoint(state, path)
    out = tmp_path / "imp.json"
    run(["fairseq-headprune", "importance", data_dir, "--path", path, "-o", str(out), "--cpu"])
    ours, reference = json.loads(out.read_text()), json.loads(open(importance_file).read())
    for k in "EDA":
        assert torch.allclose(torch.tensor(ours["importance"][k]),
                              torch.tensor(reference["importance"][k]), atol=1e-6)
        assert min(min(row) for row in ours["importance"][k]) > 0
