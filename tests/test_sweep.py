"""The sweep: rows, resume after an interruption, results as data, plots from the data."""

import json

import pytest
from conftest import run

import fairseq_headprune.evaluation.sweep as sweep
from fairseq_headprune.errors import HeadPruneError


def test_resume_skips_finished_levels(headprune_checkpoint, data_dir, importance_file, tmp_path,
                                      monkeypatch):
    calls, interrupt = [], [True]
    real = sweep.translate

    def counting(model, *args, **kwargs):
        calls.append(sum(m.num_heads for m in model.modules() if hasattr(m, "kept_heads")))
        if len(calls) == 3 and interrupt and interrupt.pop():
            raise KeyboardInterrupt  # the first run is interrupted during its third decode
        return real(model, *args, **kwargs)

    monkeypatch.setattr(sweep, "translate", counting)
    kwargs = dict(levels=[0.0, 0.25, 0.5], curves=["all", "A"], max_sentences=8)
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(data_dir, headprune_checkpoint, importance_file, str(tmp_path), **kwargs)
    saved = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [(r["curve"], r["level"]) for r in saved] == [("all", 0.0), ("all", 0.25)]
    calls.clear()
    rows = sweep.run_sweep(data_dir, headprune_checkpoint, importance_file, str(tmp_path), **kwargs)
    # all@0.5, A@0.25, A@0.5 decoded now; A@0.0 reuses all@0.0 (the same, unpruned model)
    assert calls == [12, 22, 20]
    assert [(r["curve"], r["level"], r["heads_pruned"]) for r in rows] == [
        ("all", 0.0, 0), ("all", 0.25, 6), ("all", 0.5, 12),
        ("A", 0.0, 0), ("A", 0.25, 2), ("A", 0.5, 4)]
    assert all(r["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a") for r in rows)
    csv_lines = (tmp_path / "results.csv").read_text().splitlines()
    assert csv_lines[0].startswith("curve,level,heads_pruned,heads_total,bleu,signature")
    assert len(csv_lines) == 7
    calls.clear()
    sweep.run_sweep(data_dir, headprune_checkpoint, importance_file, str(tmp_path), **kwargs)
    assert calls == []


def test_other_settings_are_refused(headprune_checkpoint, data_dir, importance_file, tmp_path):
    sweep.run_sweep(data_dir, headprune_checkpoint, importance_file, str(tmp_path), levels=[0.0],
                    curves=["all"], max_sentences=4)
    with pytest.raises(HeadPruneError, match="holds a sweep with other settings"):
        sweep.run_sweep(data_dir, headprune_checkpoint, importance_file, str(tmp_path),
                        levels=[0.0], curves=["all"], max_sentences=5)


def test_cli_writes_data_plots_and_checkpoint(headprune_checkpoint, data_dir, importance_file,
                                              tmp_path):
    out = run(["fairseq-headprune", "sweep", data_dir, "--path", headprune_checkpoint,
               "--importance", importance_file, "-o", str(tmp_path), "--levels", "0,0.5",
               "--curves", "all", "--max-sentences", "8", "--save-levels", "0.5",
               "--device", "cpu"]).stdout
    assert "all   50.0% pruned ( 12/24) BLEU" in out
    for name in ("results.json", "results.csv", "bleu_vs_pruned.png", "importance.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert (tmp_path / "bleu_vs_pruned.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    inspect = run(["fairseq-headprune", "inspect", "--path", str(tmp_path / "pruned_50.pt")])
    assert "12 heads kept" in inspect.stdout


def test_iterative_rescoring_keeps_earlier_choices(headprune_checkpoint, data_dir, importance_file,
                                                   tmp_path):
    rows = sweep.run_sweep(data_dir, headprune_checkpoint, importance_file, str(tmp_path),
                           levels=[0.0, 0.25, 0.5], curves=["all"], max_sentences=4,
                           iterative=True)
    specs = [r["heads"] for r in rows]
    assert [r["heads_pruned"] for r in rows] == [0, 6, 12]
    for kind, layers in specs[1].items():  # heads removed at 25% stay removed at 50%
        for layer, heads in layers.items():
            assert set(heads) <= set(specs[2][kind][layer])


def test_missing_importance_file(headprune_checkpoint, data_dir, tmp_path):
    proc = run(["fairseq-headprune", "sweep", data_dir, "--path", headprune_checkpoint,
                "--importance", str(tmp_path / "none.json"), "-o", str(tmp_path / "out")],
               check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"fairseq-headprune sweep: error: importance file {tmp_path / 'none.json'} does not "
        f"exist.")
    assert not (tmp_path / "out").exists()


def test_resume_checks_inputs_and_finishes_promised_checkpoints(
        headprune_checkpoint, data_dir, importance_file, tmp_path):
    import shutil

    ckpt = str(tmp_path / "model.pt")
    shutil.copy(headprune_checkpoint, ckpt)
    out = str(tmp_path / "sweep")
    kwargs = dict(levels=[0.0, 0.5], curves=["all"], max_sentences=4)
    sweep.run_sweep(data_dir, ckpt, importance_file, out, **kwargs)
    # --save-levels added on a rerun: the finished rows get their checkpoint, no new decode
    sweep.run_sweep(data_dir, ckpt, importance_file, out, save_levels=[0.5], **kwargs)
    assert (tmp_path / "sweep" / "pruned_50.pt").stat().st_size > 0
    with open(ckpt, "ab") as f:  # the checkpoint behind the same path changed
        f.write(b"\0")
    with pytest.raises(HeadPruneError) as err:
        sweep.run_sweep(data_dir, ckpt, importance_file, out, **kwargs)
    assert str(err.value) == (f"{out}/results.json holds a sweep with other settings "
                              f"(checkpoint_sha256 changed); use another --output-dir or "
                              f"delete it.")
