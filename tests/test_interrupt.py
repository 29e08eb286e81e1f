"""SIGKILL at a random moment leaves no file a rerun mistakes for a finished result, and the
rerun's results equal an uninterrupted run's (importance, sweep, ablate, prune)."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import BIN, run

from fairseq_headprune.pruning.checkpoint import load_checkpoint


def commands(data_dir, checkpoint, importance, out):
    """Each command with the files it finishes; ``out`` is its own output folder."""
    return {
        "importance": (["importance", data_dir, "--path", checkpoint, "-o",
                        f"{out}/importance.json", "--cpu", "--batch-size", "4"],
                       ["importance.json"]),
        "sweep": (["sweep", data_dir, "--path", checkpoint, "--importance", importance, "-o",
                   out, "--levels", "0,0.25,0.5", "--curves", "all", "--max-sentences", "8",
                   "--save-levels", "0.5", "--device", "cpu"],
                  ["results.json", "pruned_50.pt"]),
        "ablate": (["ablate", data_dir, "--path", checkpoint, "--types", "A", "-o", out,
                    "--max-sentences", "6", "--device", "cpu"], ["ablation.json"]),
        "prune": (["prune", "--path", checkpoint, "--heads", "E:1:1,2 A:2:3", "-o",
                   f"{out}/pruned.pt"], ["pruned.pt"]),
    }


def result(out, name):
    """What a finished file says, in a form two runs can be compared by."""
    path = os.path.join(out, name)
    if name.endswith(".pt"):
        return {k: v for k, v in load_checkpoint(path)["model"].items()
                if k.endswith(("kept_heads", "q_proj.weight"))}
    with open(path) as f:
        data = json.load(f)
    rows = data.get("rows")
    if rows is not None:  # BLEU rows: drop timings and absolute paths
        return [{k: v for k, v in r.items() if k not in ("decode_seconds", "path", "stamp")}
                for r in rows]
    return data["importance"]


def same(a, b):
    if isinstance(a, dict) and a and isinstance(next(iter(a.values())), torch.Tensor):
        return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.parametrize("name", ["importance", "sweep", "ablate", "prune"])
def test_sigkill_then_rerun(name, headprune_checkpoint, data_dir, importance_file, tmp_path):
    exe = os.path.join(BIN, "fairseq-headprune")
    ref_dir, dir_ = str(tmp_path / "ref"), str(tmp_path / "killed")
    os.makedirs(ref_dir)
    os.makedirs(dir_)
    args, finished = commands(data_dir, headprune_checkpoint, importance_file, ref_dir)[name]
    start = time.monotonic()
    run(["fairseq-headprune", *args])
    duration = time.monotonic() - start
    reference = {f: result(ref_dir, f) for f in finished}

    args, _ = commands(data_dir, headprune_checkpoint, importance_file, dir_)[name]
    rng = random.Random(f"{name}-kill")
    proc = subprocess.Popen([exe, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    if name in ("sweep", "ablate"):  # resumable: kill once some rows are saved
        rows = os.path.join(dir_, finished[0])
        while not os.path.exists(rows) and proc.poll() is None:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.5))
    else:
        time.sleep(rng.uniform(0.3, 0.9) * duration)
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL  # it was killed while running
    for f in finished:  # whatever was left is either absent or a whole, loadable result
        if os.path.exists(os.path.join(dir_, f)):
            result(dir_, f)

    run(["fairseq-headprune", *args])  # the rerun completes (resuming where it can)
    for f in finished:
        assert same(result(dir_, f), reference[f]), f
    assert [f for f in os.listdir(dir_) if f.startswith(".tmp-")] == []  # killed writer's gone


def test_a_live_writers_temporary_file_is_left_alone(tmp_path):
    from fairseq_headprune.io import write_text

    dead = _dead_pid()
    stale = tmp_path / f".tmp-{dead}-abcdout.txt"
    live = tmp_path / f".tmp-{os.getpid()}-abcdout.txt"
    other = tmp_path / f".tmp-{dead}-abcdother.txt"
    for f in (stale, live, other):
        f.write_text("partial")
    write_text(str(tmp_path / "out.txt"), "done\n")
    assert not stale.exists() and live.exists() and other.exists()
    assert (tmp_path / "out.txt").read_text() == "done\n"


def _dead_pid():
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_ctrl_c_is_one_line_and_exit_130(headprune_checkpoint, data_dir, importance_file,
                                         tmp_path):
    args, _ = commands(data_dir, headprune_checkpoint, importance_file, str(tmp_path))["sweep"]
    # the console script's main, with each decode slowed down: the tiny model's decodes take
    # milliseconds, and a sweep that ends before the signal arrives proves nothing
    # a shell starts background jobs with SIGINT ignored, and Python keeps an inherited SIG_IGN:
    # restore the handler a terminal user has
    slow = ("import signal, sys, time\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "import fairseq_headprune.evaluation.sweep as sweep\n"
            "real = sweep.translate\n"
            "def translate(*a, **k):\n"
            "    time.sleep(1.0)\n"
            "    return real(*a, **k)\n"
            "sweep.translate = translate\n"
            "from fairseq_headprune.cli import main\n"
            "main(sys.argv[1:])\n")
    proc = subprocess.Popen([sys.executable, "-c", slow, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while not (tmp_path / "results.json").exists() and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "the sweep finished before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == ("fairseq-headprune sweep: interrupted; finished "
                                            "results are kept, rerun the same command to "
                                            "resume.")


def test_a_clean_run_prints_no_library_warnings(headprune_checkpoint, data_dir, tmp_path):
    proc = run(["fairseq-headprune", "importance", data_dir, "--path", headprune_checkpoint,
                "-o", str(tmp_path / "imp.json"), "--cpu"])
    noise = [line for line in proc.stderr.splitlines() if "Warning" in line]
    assert noise == []
