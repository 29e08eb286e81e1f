"""Bad numbers, letters and names on every subcommand: one line naming the value and what was
expected, exit 2, no traceback, nothing written. Checkpoint, spec and file errors are in
test_cli.py's table; together the two tables must cover every subcommand."""

import os

import pytest
from conftest import USER_DIR, cli, run
from test_cli import BAD as CHECKPOINT_CASES

from fairseq_headprune.cli import build_parser

CASES = [
    ("choose", ["--importance", "x.json", "--amount", "nan"], "--amount",
     "a fraction (< 1) or a count (>= 1) of heads, above 0, got 'nan'"),
    ("choose", ["--importance", "x.json", "--amount", "0"], "--amount",
     "a fraction (< 1) or a count (>= 1) of heads, above 0, got '0'"),
    ("choose", ["--importance", "x.json", "--amount", "-2"], "--amount",
     "a fraction (< 1) or a count (>= 1) of heads, above 0, got '-2'"),
    ("choose", ["--importance", "x.json", "--amount", "0.3", "--types", "XYZ"], "--types",
     "letters among E (encoder self), D (decoder self), A (encoder-decoder), got 'XYZ'"),
    ("sweep", ["d", "--path", "m.pt", "--importance", "x.json", "-o", "out", "--levels",
               "0,1.5"], "--levels", "a fraction in [0, 1), got '1.5'"),
    ("sweep", ["d", "--path", "m.pt", "--importance", "x.json", "-o", "out", "--levels", "nan"],
     "--levels", "a fraction in [0, 1), got 'nan'"),
    ("sweep", ["d", "--path", "m.pt", "--importance", "x.json", "-o", "out", "--beam", "0"],
     "--beam", "a whole number >= 1, got '0'"),
    ("ablate", ["d", "--path", "m.pt", "-o", "out", "--max-sentences", "-1"],
     "--max-sentences", "a whole number >= 1, got '-1'"),
    ("ablate", ["d", "--path", "m.pt", "-o", "out", "--types", "EQ"], "--types",
     "letters among E (encoder self), D (decoder self), A (encoder-decoder), got 'EQ'"),
    ("evaluate", ["d", "--paths", "m.pt", "-o", "out.json", "--beam", "x"], "--beam",
     "a whole number >= 1, got 'x'"),
    ("bench", ["d", "--path", "m.pt", "--pruned", "p.pt", "--batch-sizes", "0"],
     "--batch-sizes", "a whole number >= 1, got '0'"),
    ("bench", ["d", "--path", "m.pt", "--pruned", "p.pt", "--repeats", "0"], "--repeats",
     "a whole number >= 1, got '0'"),
    ("bench", ["d", "--path", "m.pt", "--pruned", "p.pt", "--fixed-length", "-1"],
     "--fixed-length", "a whole number >= 0, got '-1'"),
    ("bench", ["--synthetic", "huge"], "--synthetic",
     "invalid choice: 'huge' (choose from 'base', 'big')"),
    ("bench", ["--synthetic", "base", "--prune-share", "1"], "--prune-share",
     "a share in (0, 1), got '1'"),
    ("compare", ["d", "--runs", "a.pt", "b.pt", "-o", "out", "--seed", "0"], "--seed",
     "a whole number >= 1, got '0'"),
    ("compare", ["d", "--runs", "a.pt", "b.pt", "-o", "out", "--bench-batch-sizes", "8,x"],
     "--bench-batch-sizes", "a whole number >= 1, got 'x'"),
    ("corpus", ["-o", "out", "--vocab-size", "0"], "--vocab-size",
     "a whole number >= 1, got '0'"),
    ("corpus", ["-o", "out", "--valid-share", "0.7"], "--valid-share",
     "a share in (0, 0.5), got '0.7'"),
    ("fold", ["--path", "g.pt", "-o", "out.pt", "--keep-heads", "0"], "--keep-heads",
     "a whole number >= 1, got '0'"),
    ("prune", ["--from-gates", "g.pt", "-o", "out.pt", "--keep-heads", "-1"], "--keep-heads",
     "a whole number >= 1, got '-1'"),
    ("importance", ["d", "--path", "m.pt", "-o", "out.json", "--abs", "head"], "--abs",
     "invalid choice: 'head' (choose from 'token', 'sentence', 'batch')"),
    ("correlate", ["--importance"], "--importance", "expected at least one argument"),
    ("vote", ["d", "--path", "m.pt", "-o", "out.json", "--groups", "0"], "--groups",
     "a whole number >= 1, got '0'"),
    ("vote", ["d", "--path", "m.pt", "-o", "out.json", "--types", "EX"], "--types",
     "letters among E (encoder self), D (decoder self), A (encoder-decoder), got 'EX'"),
    ("choose", ["--importance", "x.json", "--per-module", "0"], "--per-module",
     "a whole number >= 1, got '0'"),
    ("analyze", ["d", "--path", "m.pt", "-o", "out", "--max-sentences", "0"],
     "--max-sentences", "a whole number >= 1, got '0'"),
    ("analyze", ["d", "--path", "m.pt", "-o", "out", "--rare-share", "1.5"], "--rare-share",
     "a share in (0, 1], got '1.5'"),
    ("analyze", ["d", "--path", "m.pt", "-o", "out", "--overlay", "gates.pt"], "--overlay",
     "NAME=FILE, got 'gates.pt'"),
    ("collab", ["--path", "m.pt", "--key-dim", "x", "-o", "o.pt"], "--key-dim",
     "invalid int value: 'x'"),
    ("collab", ["--path", "m.pt", "--key-dim", "8", "--cp-iters", "0", "-o", "o.pt"],
     "--cp-iters", "a whole number >= 1, got '0'"),
]


@pytest.mark.parametrize("command, args, option, message", CASES)
def test_bad_values_are_one_sentence(command, args, option, message, tmp_path, capsys):
    code, stderr = cli([command, *args], capsys, tmp_path)
    assert code == 2 and "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == (
        f"fairseq-headprune {command}: error: argument {option}: "
        + ("must be " if "must" not in message and not message.startswith(("invalid",
                                                                            "expected"))
           else "") + message)
    assert os.listdir(tmp_path) == []


SENTENCES = [  # option combinations refused by the command itself, before any work
    (["bench", "d", "--synthetic", "base", "--path", "m.pt"],
     "--synthetic builds its own models and sentences: drop DATA, --path."),
    (["bench", "d", "--path", "m.pt"],
     "bench needs DATA, --path and --pruned (or --synthetic base|big): --pruned missing."),
    (["bench", "--synthetic", "base", "--dtype", "fp16", "--device", "cpu"],
     "--dtype fp16 is for GPU decoding: use --device cuda, or fp32 on cpu."),
]


@pytest.mark.parametrize("argv, message", SENTENCES)
def test_refused_combinations_are_one_sentence(argv, message, tmp_path, capsys):
    code, stderr = cli(argv + ["-o", "out.json"], capsys, tmp_path)
    assert code == 2 and "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == f"fairseq-headprune {argv[0]}: error: {message}"
    assert os.listdir(tmp_path) == []


def test_every_subcommand_has_bad_input_cases():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    covered = {c[0] for c in CASES} | {c[0] for c in CHECKPOINT_CASES}
    assert set(sub.choices) - covered == set()


@pytest.fixture(scope="module")
def foreign_data(tmp_path_factory):
    """A data-bin with other words (other dictionary sizes) and no test split."""
    from conftest import write_parallel

    raw = tmp_path_factory.mktemp("foreign")
    write_parallel(raw, seed=9, sizes=(("valid", 6),))
    for side in ("src", "tgt"):  # a larger vocabulary than the tiny models'
        with open(raw / f"valid.{side}", "a") as f:
            f.write(" ".join(f"w{i}" for i in range(40)) + "\n")
    run(["fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt",
         "--trainpref", str(raw / "valid"), "--validpref", str(raw / "valid"),
         "--destdir", str(raw / "bin"), "--workers", "1"])
    return str(raw / "bin")


@pytest.mark.parametrize("command, extra", [
    ("sweep", ["--importance", "{imp}", "--levels", "0"]),
    ("ablate", []),
    ("evaluate", []),
    ("bench", ["--pruned", "{ckpt}"]),
    ("analyze", []),
])
@pytest.mark.parametrize("case", ["missing", "dictionary", "split"])
def test_data_that_cannot_serve_the_model(command, extra, case, headprune_checkpoint, data_dir,
                                          foreign_data, importance_file, tmp_path):
    data = {"missing": str(tmp_path / "nowhere"), "dictionary": foreign_data,
            "split": data_dir}[case]
    subset = ["--subset", "nosuch"] if case == "split" else []
    out = tmp_path / "out"
    paths = ["--paths" if command == "evaluate" else "--path", headprune_checkpoint]
    output = ["-o", str(out / "rows.json")] if command in ("evaluate", "bench") else [
        "-o", str(out)]
    args = [a.format(imp=importance_file, ckpt=headprune_checkpoint) for a in extra]
    proc = run(["fairseq-headprune", command, data, *paths, *args, *output, *subset,
                "--device", "cpu"], check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    expected = {
        "missing": f"data directory {data} does not exist.",
        "dictionary": f"{foreign_data}/dict.src.txt has ",
        "split": f"{data_dir} has no 'nosuch' split.",
    }[case]
    assert last.startswith(f"fairseq-headprune {command}: error: {expected}"), last
    if case == "dictionary":
        assert "DATA was not built with this model's dictionaries." in last
    assert not out.exists() or os.listdir(out) == []


def sha256(path):
    import hashlib

    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.mark.parametrize("command, args", [
    ("convert", ["--path", "{ckpt}"]),
    ("prune", ["--path", "{ckpt}", "--heads", "E:1:1"]),
    ("fold", ["--path", "{ckpt}"]),
    ("collab", ["--path", "{ckpt}", "--key-dim", "8"]),
    ("importance", ["{data}", "--path", "{ckpt}"]),
    ("vote", ["{data}", "--path", "{ckpt}"]),
    ("correlate", ["--importance", "{imp}", "{imp}"]),
    ("choose", ["--importance", "{imp}", "--amount", "0.5"]),
    ("sweep", ["{data}", "--path", "{ckpt}", "--importance", "{imp}"]),
    ("ablate", ["{data}", "--path", "{ckpt}"]),
    ("evaluate", ["{data}", "--paths", "{ckpt}"]),
    ("bench", ["{data}", "--path", "{ckpt}", "--pruned", "{ckpt}"]),
    ("compare", ["{data}", "--runs", "a={ckpt}", "b={ckpt}"]),
    ("corpus", []),
    ("analyze", ["{data}", "--path", "{ckpt}"]),
])
def test_an_unwritable_output_is_refused_before_any_work(command, args, headprune_checkpoint,
                                                        data_dir, importance_file, tmp_path,
                                                        capsys):
    """Every subcommand that writes checks its -o first: one sentence, exit 2, inputs unchanged
    (sha256 before and after), nothing written."""
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder\n")
    out = blocker / "out"
    inputs = [headprune_checkpoint, importance_file] + sorted(
        os.path.join(data_dir, f) for f in os.listdir(data_dir))
    before = [sha256(p) for p in inputs]
    listing = sorted(os.listdir(tmp_path))
    values = {"ckpt": headprune_checkpoint, "data": data_dir, "imp": importance_file}
    code, stderr = cli([command, *[a.format(**values) for a in args], "-o", str(out)], capsys,
                       tmp_path)
    assert code == 2 and "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == (
        f"fairseq-headprune {command}: error: cannot write -o {out}: {blocker} is a file, "
        f"not a folder.")
    assert [sha256(p) for p in inputs] == before
    assert sorted(os.listdir(tmp_path)) == listing and blocker.read_text() == "not a folder\n"


@pytest.mark.parametrize("override, extra, message", [
    ({"importance_output": "{blocker}/importance.json"}, [],
     "cannot write importance_output {blocker}/importance.json: {blocker} is a file, not a "
     "folder."),
    ({"importance_scorer": "votes", "vote_groups": 9}, [],
     "vote_groups 9 is more than the 4 heads of E:1."),
    ({"importance_scorer": "votes", "vote_groups": 0}, [],
     "vote_groups must be at least 1, got 0."),
    ({"data": "{tmp}/nowhere"}, [], "data directory {tmp}/nowhere does not exist."),
    ({}, ["--valid-subset", "nosuch"], "split 'nosuch' is not in {data}: "),
])
def test_bad_input_through_stock_fairseq_validate(override, extra, message, headprune_checkpoint,
                                                  data_dir, tmp_path):
    """The README's route (fairseq-validate --task head_importance): one sentence, nonzero exit,
    no traceback, inputs unchanged (sha256), no importance file."""
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    values = {"blocker": str(blocker), "tmp": str(tmp_path), "data": data_dir}
    task = {"_name": "head_importance", "data": data_dir,
            "importance_output": str(tmp_path / "importance.json")}
    task.update({k: v.format(**values) if isinstance(v, str) else v for k, v in override.items()})
    inputs = [headprune_checkpoint] + sorted(
        os.path.join(data_dir, f) for f in os.listdir(data_dir))
    before = [sha256(p) for p in inputs]
    proc = run(["fairseq-validate", data_dir, "--user-dir", USER_DIR, "--task", "head_importance",
                "--path", headprune_checkpoint, "--cpu", "--max-tokens", "4000",
                "--required-batch-size-multiple", "1", "--model-overrides",
                repr({"task": task}), *extra], check=False, cwd=tmp_path)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "fairseq-validate: error: " + message.format(**values)), proc.stderr[-2000:]
    assert [sha256(p) for p in inputs] == before
    assert sorted(os.listdir(tmp_path)) == ["a_file"]


COMMANDS_WITH_A_CHECKPOINT = {
    "prune": ["--path", "{bad}", "--heads", "E:1:1", "-o", "{out}/x.pt"],
    "fold": ["--path", "{bad}", "-o", "{out}/x.pt"],
    "collab": ["--path", "{bad}", "--key-dim", "8", "-o", "{out}/x.pt"],
    "inspect": ["--path", "{bad}"],
    "importance": ["{data}", "--path", "{bad}", "-o", "{out}/x.json"],
    "vote": ["{data}", "--path", "{bad}", "-o", "{out}/x.json"],
    "sweep": ["{data}", "--path", "{bad}", "--importance", "{imp}", "-o", "{out}/sweep"],
    "ablate": ["{data}", "--path", "{bad}", "-o", "{out}/ablate"],
    "evaluate": ["{data}", "--paths", "{bad}", "-o", "{out}/x.json"],
    "bench": ["{data}", "--path", "{ckpt}", "--pruned", "{bad}", "-o", "{out}/x.json"],
    "compare": ["{data}", "--runs", "a={ckpt}", "b={bad}", "-o", "{out}/compare"],
    "analyze": ["{data}", "--path", "{bad}", "-o", "{out}/roles"],
}
CHECKPOINT_CLASSES = {
    "missing": "checkpoint {bad} does not exist.",
    "empty": "checkpoint {bad} is empty (0 bytes).",
    "truncated": "{bad} is not a readable fairseq checkpoint",
    "random": "{bad} is not a readable fairseq checkpoint",
    "text": "{bad} is not a readable fairseq checkpoint",
    "folder": "checkpoint {bad} is a directory, not a checkpoint file.",
    "lstm": "{bad} holds a 'lstm' model, not a transformer_headprune model.",
}


@pytest.mark.parametrize("case", sorted(CHECKPOINT_CLASSES))
@pytest.mark.parametrize("command", sorted(COMMANDS_WITH_A_CHECKPOINT))
def test_every_command_refuses_every_bad_checkpoint(command, case, headprune_checkpoint,
                                                   lstm_checkpoint, data_dir, importance_file,
                                                   tmp_path, capsys):
    """Each class of bad checkpoint on each subcommand that reads one: one sentence, exit 2,
    no traceback, nothing written, every input unchanged."""
    import random

    bad = tmp_path / f"{case}.pt"
    if case == "truncated":
        bad.write_bytes(open(headprune_checkpoint, "rb").read()[:5000])
    elif case == "empty":
        bad.write_bytes(b"")
    elif case == "random":
        bad.write_bytes(random.Random(0).randbytes(4096))
    elif case == "text":
        bad.write_text("this is a README, not a model\n")
    elif case == "folder":
        bad.mkdir()
    elif case == "lstm":
        bad = lstm_checkpoint
    out = tmp_path / "out"
    out.mkdir()
    values = {"bad": str(bad), "out": str(out), "data": data_dir, "imp": importance_file,
              "ckpt": headprune_checkpoint}
    inputs = [p for p in (str(bad), headprune_checkpoint, importance_file) if os.path.isfile(p)]
    before = [sha256(p) for p in inputs]
    code, stderr = cli([command, *[a.format(**values) for a in COMMANDS_WITH_A_CHECKPOINT[
        command]]], capsys, tmp_path)
    assert code == 2 and "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1].startswith(
        f"fairseq-headprune {command}: error: " + CHECKPOINT_CLASSES[case].format(**values))
    assert os.listdir(out) == [] and [sha256(p) for p in inputs] == before
