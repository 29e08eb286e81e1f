"""``fairseq-headprune compare`` on the tiny checkpoints: rows, scores against sacrebleu called
directly, sacrebleu's paired bootstrap (the baseline's p-value, the floor for an identical run),
heads and parameters against hand counts, resumption, and bad input."""

import csv
import json
import os

import pytest
import torch
from conftest import cli

SAMPLES, SEED = 100, 7


@pytest.fixture(scope="module")
def runs(headprune_checkpoint, tmp_path_factory):
    """The tiny model, the same model under another label, two encoder heads of layer 1 removed,
    and collaborative attention at half the key size (16 -> 8)."""
    import fairseq_headprune.cli as entry

    d = tmp_path_factory.mktemp("runs")
    pruned, collab = str(d / "pruned.pt"), str(d / "collab.pt")
    for argv in (["prune", "--path", headprune_checkpoint, "--heads", "E:1:1,2", "-o", pruned],
                 ["collab", "--path", headprune_checkpoint, "--key-dim", "8", "-o", collab]):
        entry.main(argv)
    return {"base": headprune_checkpoint, "pruned": pruned, "collab": collab}


@pytest.fixture(scope="module")
def compared(runs, data_dir, tmp_path_factory):
    import fairseq_headprune.cli as entry

    out = str(tmp_path_factory.mktemp("compare") / "out")
    argv = ["compare", data_dir, "--runs", f"unpruned={runs['base']}", f"same={runs['base']}",
            f"michel/2={runs['pruned']}", runs["collab"], "-o", out, "--device", "cpu",
            "--bootstrap-samples", str(SAMPLES), "--seed", str(SEED), "--bench-batch-sizes", "4",
            "--bench-sentences", "4", "--max-sentences", "12"]
    entry.main(argv)
    with open(os.path.join(out, "compare.json")) as f:
        return out, json.load(f), argv


def test_rows_heads_and_sizes_by_hand(compared):
    _, result, _ = compared
    rows = {r["label"]: r for r in result["rows"]}
    assert [r["label"] for r in result["rows"]] == ["unpruned", "same", "michel/2", "collab"]
    assert [r["method"] for r in result["rows"]] == ["unpruned", "same", "michel", "collab"]
    base, pruned, collab = rows["unpruned"], rows["michel/2"], rows["collab"]
    assert base["heads"] == {"E": 8, "D": 8, "A": 8} and base["heads_kept_percent"] == 100
    assert pruned["heads"] == {"E": 6, "D": 8, "A": 8} and pruned["heads_kept"] == 22
    assert pruned["heads_kept_percent"] == round(100 * 22 / 24, 2)
    # a head of d=16, 4 heads (head_dim 4): q, k, v rows 3 x (4 x 16 + 4), out_proj 16 x 4
    assert base["params"] - pruned["params"] == 2 * (3 * (4 * 16 + 4) + 16 * 4)
    assert pruned["parameter_bytes"] == 4 * pruned["params"]  # float32
    assert pruned["file_bytes"] == os.path.getsize(pruned["path"])
    # collaborative attention removes no head; its share is the key size over heads x head_dim
    assert collab["heads"] == base["heads"] and collab["key_dims"] == {"E": 8, "D": 8, "A": 8}
    assert collab["full_key_dims"] == {"E": 16, "D": 16, "A": 16}
    assert collab["share_kept_percent"] == 50 and pruned["share_kept_percent"] == 91.67


def test_scores_are_sacrebleus(compared):
    import sacrebleu

    out, result, _ = compared
    with open(os.path.join(out, "decoded.json")) as f:
        decoded = {r["label"]: r for r in json.load(f)["rows"]}
    for r in result["rows"]:
        hyps, refs = decoded[r["label"]]["hypotheses"], decoded[r["label"]]["references"]
        assert len(hyps) == len(refs) == r["sentences"] == 12
        assert r["bleu"] == round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)
        assert r["chrf"] == round(sacrebleu.corpus_chrf(hyps, [refs]).score, 2)
        assert r["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|")
        assert r["chrf_signature"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|")
        assert r["bleu_delta"] == round(r["bleu"] - result["rows"][0]["bleu"], 2)


def test_paired_bootstrap(compared):
    _, result, _ = compared
    sig = result["config"]["significance"]
    assert (sig["n_samples"], sig["seed"], sig["against"]) == (SAMPLES, SEED, "unpruned")
    assert f"|bs:{SAMPLES}|seed:{SEED}|" in sig["signatures"]["bleu"]
    assert f"|bs:{SAMPLES}|seed:{SEED}|" in sig["signatures"]["chrf"]
    rows = {r["label"]: r["significance"] for r in result["rows"]}
    for metric in ("bleu", "chrf"):
        assert rows["unpruned"][metric]["p_value"] is None  # not tested against itself
        # the same hypotheses: every resample differs by 0, sacrebleu's floor 1 / (n + 1)
        assert rows["same"][metric]["equal"] is True
        assert rows["same"][metric]["p_value"] == round(1 / (SAMPLES + 1), 4)
        for label in ("michel/2", "collab"):
            assert 0 < rows[label][metric]["p_value"] <= 1
            assert rows[label][metric]["ci"] >= 0


def test_outputs_and_speed(compared):
    out, result, _ = compared
    for r in result["rows"]:
        assert [s["batch_size"] for s in r["speed"]["rows"]] == [4]
        assert r["speed"]["rows"][0]["sentences_per_s"] > 0
    assert result["rows"][0]["speed"]["rows"][0]["speedup"] == 1.0
    with open(os.path.join(out, "compare.csv")) as f:
        table = list(csv.reader(f))
    assert table[0][:3] == ["label", "method", "E"] and len(table) == 5
    assert [line[0] for line in table[1:]] == ["unpruned", "same", "michel/2", "collab"]
    with open(os.path.join(out, "compare.md")) as f:
        md = f.read()
    assert "| michel/2 | 6 / 8 / 8 | 91.67% |" in md and "| same |" in md
    assert "| collab | 8 / 8 / 8 | key 50% (a) |" in md and "removes no head" in md
    assert os.path.getsize(os.path.join(out, "compare.png")) > 0


def test_rerun_decodes_nothing_again(compared, capsys):
    import fairseq_headprune.cli as entry

    out, result, argv = compared
    stamp = os.stat(os.path.join(out, "decoded.json")).st_mtime_ns
    entry.main(argv)
    assert os.stat(os.path.join(out, "decoded.json")).st_mtime_ns == stamp
    with open(os.path.join(out, "compare.json")) as f:
        assert json.load(f)["rows"] == result["rows"]


@pytest.fixture(scope="module")
def foreign_dictionary(headprune_checkpoint, tmp_path_factory):
    """The tiny model with a source embedding of 3 fewer words: another dictionary."""
    state = torch.load(headprune_checkpoint, map_location="cpu", weights_only=False)
    weight = state["model"]["encoder.embed_tokens.weight"]
    state["model"]["encoder.embed_tokens.weight"] = weight[:-3].clone()
    path = tmp_path_factory.mktemp("foreign") / "foreign.pt"
    torch.save(state, path)
    return str(path), weight.size(0)


@pytest.mark.parametrize("runs_args, message", [
    (["{ckpt}"], "compare needs at least 2 runs (the first is the baseline of the significance "
                 "test), got 1."),
    (["a={ckpt}", "a={ckpt}"], "--runs gives the label a to more than one checkpoint; name "
                               "them LABEL=PATH."),
    (["{ckpt}", "{ckpt}"], "--runs gives the label checkpoint_last to more than one "
                           "checkpoint; name them LABEL=PATH."),
    (["a={ckpt}", "=b.pt"], "--runs '=b.pt' is not LABEL=PATH or PATH."),
    (["a={ckpt}", "b={tmp}/nowhere.pt"], "checkpoint {tmp}/nowhere.pt does not exist."),
    (["a={ckpt}", "b={foreign}"], "{data}/dict.src.txt has {n} entries but {foreign} embeds "
                                  "{m}: DATA was not built with this model's dictionaries."),
])
def test_bad_runs_are_one_sentence(runs_args, message, headprune_checkpoint, foreign_dictionary,
                                   data_dir, tmp_path, capsys):
    foreign, n = foreign_dictionary
    values = {"ckpt": headprune_checkpoint, "tmp": str(tmp_path), "foreign": foreign,
              "data": data_dir, "n": n, "m": n - 3}
    code, stderr = cli(["compare", data_dir, "--runs", *[a.format(**values) for a in runs_args],
                        "-o", str(tmp_path / "out")], capsys, tmp_path)
    assert code == 2 and "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == (
        "fairseq-headprune compare: error: " + message.format(**values))
    assert not (tmp_path / "out").exists()


def test_output_that_is_a_checkpoint_is_refused(headprune_checkpoint, data_dir, tmp_path,
                                                capsys):
    code, stderr = cli(["compare", data_dir, "--runs", f"a={headprune_checkpoint}",
                        f"b={headprune_checkpoint}", "-o", headprune_checkpoint], capsys, tmp_path)
    assert code == 2 and stderr.strip().splitlines()[-1] == (
        f"fairseq-headprune compare: error: -o {headprune_checkpoint} is the input checkpoint "
        f"{headprune_checkpoint}: write to another folder.")


def test_readme_lines(compared):
    from fairseq_headprune.evaluation.compare import markdown, timing_and_plot

    out, _, _ = compared
    with open(os.path.join(out, "compare.md")) as f:
        assert markdown(os.path.join(out, "compare.json")) == f.read()
    lines = timing_and_plot(out)  # compare alone writes no time.json: scripts/compare.sh does
    assert lines.startswith("Running time not measured.")
    assert f"({os.path.join(out, 'compare.png')})" in lines


def test_lenpen_is_recorded_and_shown(compared, tmp_path):
    """A comparison decoded with --lenpen says so under its table; the default (1) keeps the
    configuration of files written before the option, so they resume."""
    from fairseq_headprune.evaluation.compare import markdown

    out, result, _ = compared
    assert "lenpen" not in result["config"]
    assert ", beam 5; sacrebleu" in markdown(os.path.join(out, "compare.json"))
    result["config"]["lenpen"] = 0.6
    path = tmp_path / "compare.json"
    path.write_text(json.dumps(result))
    assert ", beam 5, lenpen 0.6; sacrebleu" in markdown(str(path))


def test_readings_by_hand(tmp_path):
    """The bullets under the README's table, on hand-made rows: runs per budget by BLEU, the
    best one that removes heads (collaborative attention removes none) against the baseline and
    the control, and the speedups at the largest batch, per kind of run; and one method's line
    for the README's paper sections."""
    from fairseq_headprune.errors import HeadPruneError
    from fairseq_headprune.evaluation.compare import method_line, readings

    def row(label, bleu, p, speedups, key_dims=None):
        share = float(label.split("/")[1]) if "/" in label else 100.0
        return {"label": label, "method": label.split("/")[0], "bleu": bleu,
                "share_kept_percent": share,
                "bleu_delta": round(bleu - 30.0, 2), "key_dims": key_dims or {},
                "significance": {"bleu": {"p_value": p}},
                "speed": {"rows": [{"batch_size": b, "speedup": x} for b, x in speedups]}}

    rows = [row("unpruned", 30.0, None, [(1, 1.0), (64, 1.0)]),
            row("control", 31.5, 0.001, [(1, 1.0), (64, 0.98)]),
            row("michel/50", 27.25, 0.001, [(1, 1.1), (64, 1.3)]),
            row("voita/50", 28.0, 0.02, [(1, 1.0), (64, 1.2)]),
            row("collab/50", 29.5, 0.2, [(1, 0.8), (64, 0.9)], {"E": 64}),
            row("michel/25", 20.0, 0.001, [(1, 1.2), (64, 1.5)]),
            row("collab/100", 30.0, 0.001, [(1, 0.8), (64, 1.05)], {"E": 128})]
    rows[-1]["significance"]["bleu"]["equal"] = True
    path = tmp_path / "compare.json"
    path.write_text(json.dumps({"rows": rows}))
    assert readings(str(path)).splitlines() == [
        "- `*/25`: michel 20.00; best that removes heads: michel, -10.00 BLEU against unpruned "
        "(p 0.001*), -11.50 against control.",
        "- `*/50`: collab 29.50, voita 28.00, michel 27.25; best that removes heads: voita, "
        "-2.00 BLEU against unpruned (p 0.020*), -3.50 against control.",
        "- `*/100`: collab 30.00.",
        "- decoding speed at batch 64, runs that remove heads: 1.20x to 1.50x of unpruned "
        "(medians of the rounds).",
        "- decoding speed at batch 64, collaborative runs: 0.90x to 1.05x of unpruned (medians "
        "of the rounds)."]
    assert method_line(str(path), "michel") == (
        "In the comparison of all methods on the CPU demo model, michel: 25 % of the heads kept "
        "20.00 (-10.00, p 0.001*), 50 % of the heads kept 27.25 (-2.75, p 0.001*); unpruned "
        "30.00, control (fine-tuned as long as any run) 31.50.\n")
    assert method_line(str(path), "collab").startswith(
        "In the comparison of all methods on the CPU demo model, collab: 50 % of the key size "
        "kept 29.50 (-0.50, p 0.200), 100 % of the key size kept 30.00 (+0.00, p equal);")
    with pytest.raises(HeadPruneError, match="has no run of method 'dsp'"):
        method_line(str(path), "dsp")
