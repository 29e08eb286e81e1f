"""End to end through the real commands: fairseq-train -> fairseq-headprune -> fairseq-generate."""

import math
import os
import random
import re

import pytest
from conftest import USER_DIR, batch, beam_search, cli, load, run

from fairseq_headprune.heads.spec import parse_head_spec
from fairseq_headprune.pruning.checkpoint import (
    checkpoint_layout,
    count_parameters,
    load_checkpoint,
)
from fairseq_headprune.pruning.masking import mask_heads

SPEC = "E:1:1,2 E:2:4 D:2:1-4 A:1:3"  # includes a zero-head decoder self-attention layer
C, D = 16, 4  # embed dim, head dim of the tiny model
PER_HEAD = 4 * C * D + 3 * D  # q/k/v rows with biases, out_proj columns


@pytest.fixture(scope="module")
def pruned(headprune_checkpoint, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("pruned") / "pruned.pt")
    proc = run(["fairseq-headprune", "prune", "--path", headprune_checkpoint, "--heads", SPEC,
                "-o", out])
    return out, proc.stdout


def test_prune_reports_exact_sizes(headprune_checkpoint, pruned):
    out, stdout = pruned
    before = count_parameters(load_checkpoint(headprune_checkpoint)["model"])
    after = count_parameters(load_checkpoint(out)["model"])
    assert before - after == 8 * PER_HEAD
    assert f"removed 8 heads ({SPEC.replace('1-4', '1,2,3,4')}): 24 -> 16 heads" in stdout
    assert f"parameters: {before:,} -> {after:,} ({after - before:+,})" in stdout
    assert os.path.getsize(out) < os.path.getsize(headprune_checkpoint)
    assert load_checkpoint(out)["last_optimizer_state"] is None


def generate(data, path, *extra):
    proc = run(["fairseq-generate", data, "--user-dir", USER_DIR, "--path", path, "--cpu",
                "--gen-subset", "valid", "--beam", "4", "--max-len-b", "20",
                "--batch-size", "8", *extra])
    hyps = {}
    for line in proc.stdout.splitlines():
        if line.startswith("H-"):
            key, score, text = line.split("\t")
            hyps[int(key[2:])] = (float(score), text)
    return hyps


def test_generate_on_pruned_equals_masked_model(headprune_checkpoint, pruned, data_dir):
    out, _ = pruned
    hyps = generate(data_dir, out)
    masked, task = load(headprune_checkpoint, data_dir)
    mask_heads(masked, parse_head_spec(SPEC))
    sample = batch(task, "valid", max_sentences=1000)
    expected = beam_search(masked, task, sample)
    assert len(hyps) == len(expected) == 24
    for i, sid in enumerate(sample["id"].tolist()):
        tokens, score, _ = expected[i][0]
        text = task.target_dictionary.string(tokens[:-1])
        assert hyps[sid][1] == text
        assert hyps[sid][0] == pytest.approx(score / math.log(2), abs=1e-4)


def test_interactive_loads_pruned(pruned, data_dir):
    proc = run(["fairseq-interactive", data_dir, "--user-dir", USER_DIR, "--path", pruned[0],
                "--cpu", "--source-lang", "src", "--target-lang", "tgt", "--beam", "2"],
               input="a b c d\n")
    assert re.search(r"^H-0\t-?[\d.]+\t\S", proc.stdout, re.M)


def test_validate_loads_pruned(pruned, data_dir):
    proc = run(["fairseq-validate", data_dir, "--user-dir", USER_DIR, "--path", pruned[0],
                "--task", "translation", "--cpu", "--valid-subset", "valid",
                "--max-tokens", "500"])
    assert re.search(r"valid on 'valid' subset \| loss [\d.]+", proc.stdout + proc.stderr)


def test_train_restore_continues_pruned(pruned, data_dir, tmp_path):
    out, _ = pruned
    proc = run(["fairseq-train", data_dir, "--user-dir", USER_DIR, "--arch",
                "transformer_headprune", "--encoder-layers", "2", "--decoder-layers", "2",
                "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
                "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
                "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
                "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "500", "--cpu",
                "--restore-file", out, "--reset-optimizer", "--reset-lr-scheduler",
                "--reset-dataloader", "--reset-meters", "--max-epoch", "1",
                "--save-dir", str(tmp_path), "--no-epoch-checkpoints", "--log-format", "simple"])
    log = proc.stdout + proc.stderr
    assert "Loaded checkpoint" in log and "num_updates 5" in log
    continued_state, start_state = load_checkpoint(str(tmp_path / "checkpoint_last.pt")), \
        load_checkpoint(out)
    assert checkpoint_layout(continued_state) == checkpoint_layout(start_state)
    continued, start = continued_state["model"], start_state["model"]
    assert count_parameters(continued) == count_parameters(start)
    key = "encoder.layers.0.self_attn.q_proj.weight"  # the optimizer trained the pruned tensors
    assert continued[key].shape == start[key].shape == (2 * D, C)
    assert not continued[key].equal(start[key])


def test_inspect_prints_layout(pruned):
    stdout = run(["fairseq-headprune", "inspect", "--path", pruned[0]]).stdout
    assert "E (encoder self-attention): 5/8 heads" in stdout
    assert "  E:1  2/4  heads 3,4" in stdout
    assert "  D:2  0/4  heads -" in stdout
    assert "  A:1  3/4  heads 1,2,4" in stdout


def test_convert_then_prune(stock_checkpoint, tmp_path):
    conv = str(tmp_path / "conv.pt")
    run(["fairseq-headprune", "convert", "--path", stock_checkpoint, "-o", conv])
    out = str(tmp_path / "p.pt")
    run(["fairseq-headprune", "prune", "--path", conv, "--heads", "A:2:1", "-o", out])
    assert checkpoint_layout(load_checkpoint(out)).count("A") == 7


BAD = [
    ("prune", "{ckpt}", "E:x:1", "malformed head spec item 'E:x:1': expected TYPE:LAYER:HEADS "
                                 "with TYPE one of E, D, A and 1-based LAYER and HEADS, "
                                 "e.g. E:1:1,3-4."),
    ("prune", "{ckpt}", "E:9:1", "layer 9 is out of range for E (encoder self-attention): "
                                 "the model has 2 layers (1-2)."),
    ("prune", "{ckpt}", "A:1:5", "head 5 is out of range for A:1: the model has 4 heads per "
                                 "layer (1-4)."),
    ("prune", "{ckpt}", "E:1:1-1000000000", "head spec item 'E:1:1-1000000000' names "
                                            "1000000000, more layers or heads than any model "
                                            "has (at most 4096)."),
    ("prune", "{missing}", "E:1:1", "checkpoint {missing} does not exist."),
    ("prune", "{truncated}", "E:1:1", "{truncated} is not a readable fairseq checkpoint"),
    ("prune", "{empty}", "E:1:1", "checkpoint {empty} is empty (0 bytes)."),
    ("prune", "{random}", "E:1:1", "{random} is not a readable fairseq checkpoint"),
    ("prune", "{text}", "E:1:1", "{text} is not a readable fairseq checkpoint"),
    ("prune", "{folder}", "E:1:1", "checkpoint {folder} is a directory, not a checkpoint file."),
    ("prune", "{lstm}", "E:1:1", "{lstm} holds a 'lstm' model, not a transformer_headprune "
                                 "model."),
    ("prune", "{stock}", "E:1:1", "{stock} holds a 'transformer' model, not a "
                                  "transformer_headprune model. Convert it first with "
                                  "'fairseq-headprune convert'."),
    ("convert", "{lstm}", None, "{lstm} holds a 'lstm' model; convert takes a stock fairseq "
                                "transformer checkpoint."),
    ("inspect", "{truncated}", None, "{truncated} is not a readable fairseq checkpoint"),
]


@pytest.mark.parametrize("command,path,heads,message", BAD)
def test_bad_input(command, path, heads, message, headprune_checkpoint, stock_checkpoint,
                   lstm_checkpoint, tmp_path, capsys):
    import hashlib

    truncated = tmp_path / "truncated.pt"
    with open(headprune_checkpoint, "rb") as f:
        truncated.write_bytes(f.read()[:5000])
    (tmp_path / "empty.pt").write_bytes(b"")
    (tmp_path / "random.pt").write_bytes(random.Random(0).randbytes(4096))
    (tmp_path / "text.pt").write_text("this is a README, not a model\n")
    (tmp_path / "folder.pt").mkdir()
    paths = {"ckpt": headprune_checkpoint, "missing": str(tmp_path / "nope.pt"),
             "truncated": str(truncated), "lstm": lstm_checkpoint, "stock": stock_checkpoint,
             **{k: str(tmp_path / f"{k}.pt") for k in ("empty", "random", "text", "folder")}}
    files = [p for p in paths.values() if os.path.isfile(p)]
    before = [hashlib.sha256(open(p, "rb").read()).hexdigest() for p in files]
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    cmd = [command, "--path", path.format(**paths)]
    if heads:
        cmd += ["--heads", heads]
    if command != "inspect":
        cmd += ["-o", str(out_dir / "out.pt")]
    code, stderr = cli(cmd, capsys, tmp_path)
    assert code == 2 and "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert lines[-1].startswith(f"fairseq-headprune {command}: error: {message.format(**paths)}")
    assert list(out_dir.iterdir()) == []
    assert [hashlib.sha256(open(p, "rb").read()).hexdigest() for p in files] == before


@pytest.mark.parametrize("command, extra", [("prune", ["--heads", "E:1:1"]), ("fold", []),
                                            ("convert", [])])
def test_output_over_the_input_is_refused(command, extra, headprune_checkpoint, tmp_path):
    source = tmp_path / "model.pt"
    source.write_bytes(open(headprune_checkpoint, "rb").read())
    before = source.read_bytes()
    alias = str(tmp_path / "." / "model.pt")  # the same file under another spelling
    proc = run(["fairseq-headprune", command, "--path", str(source), *extra, "-o", alias],
               check=False)
    assert proc.returncode == 2 and source.read_bytes() == before
    assert proc.stderr.strip().splitlines()[-1] == (
        f"fairseq-headprune {command}: error: -o {alias} is the input checkpoint {source}: "
        f"write to another file.")


@pytest.mark.parametrize("heads", ["", '{"E": {}}'])
def test_an_empty_head_spec_is_refused(heads, headprune_checkpoint, tmp_path):
    out = tmp_path / "out.pt"
    proc = run(["fairseq-headprune", "prune", "--path", headprune_checkpoint, "--heads", heads,
                "-o", str(out)], check=False)
    assert proc.returncode == 2 and not out.exists()
    assert proc.stderr.strip().splitlines()[-1] == (
        f"fairseq-headprune prune: error: the head spec {heads!r} names no heads: nothing to "
        f"prune, nothing written.")


@pytest.mark.parametrize("kept, problem", [
    ([0, 1, 2, 9], "it names head 10 of 4"),
    ([0, 0, 1, 2], "it names a head twice"),
    ([1, 0, 2, 3], "its heads are not in ascending order"),
    ([0, 1], "it lists 2 heads but v_proj holds 16 rows (4 heads of 4)"),
])
def test_a_corrupt_kept_heads_buffer_is_refused(kept, problem, headprune_checkpoint, data_dir,
                                                tmp_path):
    import hashlib

    import torch

    from fairseq_headprune.pruning.checkpoint import save_checkpoint

    state = torch.load(headprune_checkpoint, weights_only=False)
    state["model"]["encoder.layers.1.self_attn.kept_heads"] = torch.tensor(kept)
    bad = tmp_path / "corrupt.pt"
    save_checkpoint(state, str(bad))
    digest = hashlib.sha256(bad.read_bytes()).hexdigest()
    out = tmp_path / "out.pt"
    commands = [["inspect", "--path", str(bad)]]
    if kept[-1] == 9:  # one case through the commands that load the model as well
        commands.append(["prune", "--path", str(bad), "--heads", "E:1:1", "-o", str(out)])
    for cmd in commands:
        proc = run(["fairseq-headprune", *cmd], check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert proc.stderr.strip().splitlines()[-1] == (
            f"fairseq-headprune {cmd[0]}: error: {bad}, E:2: the kept_heads buffer is corrupt: "
            f"{problem}.")
    if kept[-1] == 9:
        proc = run(["fairseq-generate", data_dir, "--user-dir", USER_DIR, "--path", str(bad),
                    "--cpu", "--max-sentences", "2"], check=False)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr
        assert proc.stderr.strip().splitlines()[-1] == (
            f"fairseq-generate: error: checkpoint module encoder.layers.1.self_attn: the "
            f"kept_heads buffer is corrupt: {problem}.")
    assert not out.exists() and hashlib.sha256(bad.read_bytes()).hexdigest() == digest


def test_evaluate_lenpen_is_fairseq_generates(headprune_checkpoint, data_dir, tmp_path):
    """``translate(..., lenpen=X)`` (evaluate and compare's ``--lenpen``) picks the hypotheses of
    ``fairseq-generate --lenpen X``. The tiny model ends almost every hypothesis after one token
    whatever the penalty, so its end-of-sentence output row is scaled by 0.75 first: then
    penalties 0 and 3 pick differently, and a dropped option would fail the test."""
    import torch

    from fairseq_headprune.evaluation.decode import translate

    state = torch.load(headprune_checkpoint, weights_only=False)  # as fairseq saved it
    state["model"]["decoder.output_projection.weight"][2] *= 0.75  # 2: fairseq's EOS index
    path = str(tmp_path / "late_eos.pt")
    torch.save(state, path)
    model, task = load(path, data_dir)
    ours = {}
    for lenpen in (0.0, 3.0):
        result = translate(model, task, "valid", beam=4, max_tokens=None, batch_size=8,
                           max_len_b=20, lenpen=lenpen)
        hyps = generate(data_dir, path, "--lenpen", str(lenpen), "--post-process",
                        "sentencepiece")
        assert result.hypotheses == [hyps[i][1] for i in sorted(hyps)]
        ours[lenpen] = result.hypotheses
    assert ours[0.0] != ours[3.0]
