"""Tiny offline fixtures: random parallel data, fairseq-preprocess, 2-layer models trained on CPU."""

import os
import random
import subprocess
import sys
from argparse import Namespace

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):  # one thread per worker: `-n auto` fills every core
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # also for the fairseq processes tests start
import torch  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_DIR = os.path.join(REPO, "user_dir")
BIN = os.path.dirname(sys.executable)

TINY_MODEL = [
    "--encoder-layers", "2", "--decoder-layers", "2",
    "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
    "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
    "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
]
TRAIN = ["--optimizer", "adam", "--lr", "0.005", "--max-tokens", "500", "--cpu",
         "--no-progress-bar", "--log-format", "simple", "--seed", "1",
         "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]


# The longest files start first, so that under `pytest -n auto --dist loadfile` (the README's
# test command) they run beside the many short files instead of after them.
LONG_FILES = ("test_demo.py", "test_reproduce.py", "test_compare.py")


def pytest_collection_modifyitems(items):
    def rank(item):
        name = os.path.basename(str(item.fspath))
        return LONG_FILES.index(name) if name in LONG_FILES else len(LONG_FILES)
    items.sort(key=rank)  # stable: the order within a file and among the rest is kept


def run(cmd, check=True, **kwargs):
    """Run a console script of this environment; return the CompletedProcess."""
    exe = os.path.join(BIN, cmd[0])
    proc = subprocess.run([exe, *cmd[1:]], capture_output=True, text=True, **kwargs)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr[-4000:]}")
    return proc


def cli(argv, capsys, cwd):
    """Run ``fairseq-headprune argv`` in this process (the console script's own ``main``; no
    fairseq start-up per case); return (exit status, stderr)."""
    from fairseq_headprune.cli import main

    old = os.getcwd()
    os.chdir(cwd)
    try:
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
    finally:
        os.chdir(old)
    return exit_info.value.code, capsys.readouterr().err


def write_parallel(directory, seed=0, sizes=(("train", 240), ("valid", 24), ("test", 24))):
    """A toy task (reverse and upper-case the words) that 2 epochs partly learn."""
    rng = random.Random(seed)
    words = "a b c d e f g h i j k l m n o p".split()
    for split, n in sizes:
        with open(os.path.join(directory, f"{split}.src"), "w") as fs, \
                open(os.path.join(directory, f"{split}.tgt"), "w") as ft:
            for _ in range(n):
                s = [rng.choice(words) for _ in range(rng.randint(3, 9))]
                fs.write(" ".join(s) + "\n")
                ft.write(" ".join(reversed(s)).upper() + "\n")


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    raw = tmp_path_factory.mktemp("raw")
    write_parallel(raw)
    out = raw / "bin"
    run(["fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt",
         "--trainpref", str(raw / "train"), "--validpref", str(raw / "valid"),
         "--testpref", str(raw / "test"), "--destdir", str(out), "--workers", "1"])
    return str(out)


def train(data, save_dir, arch, *extra):
    run(["fairseq-train", data, "--arch", arch, *TINY_MODEL, *TRAIN, "--max-epoch", "3",
         "--save-dir", str(save_dir), "--no-epoch-checkpoints", *extra])
    return str(save_dir / "checkpoint_last.pt")


@pytest.fixture(scope="session")
def stock_checkpoint(data_dir, tmp_path_factory):
    """A stock fairseq ``transformer`` checkpoint."""
    return train(data_dir, tmp_path_factory.mktemp("stock"), "transformer")


@pytest.fixture(scope="session")
def headprune_checkpoint(data_dir, tmp_path_factory):
    """A ``transformer_headprune`` checkpoint trained through --user-dir."""
    return train(data_dir, tmp_path_factory.mktemp("hp"), "transformer_headprune",
                 "--user-dir", USER_DIR)


@pytest.fixture(scope="session")
def importance_file(headprune_checkpoint, data_dir, tmp_path_factory):
    """Michel et al. importance of ``headprune_checkpoint`` on the valid split."""
    out = tmp_path_factory.mktemp("imp") / "importance.json"
    run(["fairseq-headprune", "importance", data_dir, "--path", headprune_checkpoint,
         "-o", str(out), "--cpu"])
    return str(out)


@pytest.fixture(scope="session")
def lstm_checkpoint(data_dir, tmp_path_factory):
    """A checkpoint of a model that is not a Transformer."""
    save = tmp_path_factory.mktemp("lstm")
    run(["fairseq-train", data_dir, "--arch", "lstm", "--encoder-embed-dim", "8",
         "--decoder-embed-dim", "8", "--encoder-hidden-size", "8", "--decoder-hidden-size", "8",
         "--decoder-out-embed-dim", "8", *TRAIN, "--max-epoch", "1", "--save-dir", str(save),
         "--no-epoch-checkpoints"])
    return str(save / "checkpoint_last.pt")


def load(path, data):
    """Load a checkpoint with fairseq's own loader; return (model in eval mode, task)."""
    from fairseq import checkpoint_utils

    import fairseq_headprune.register  # noqa: F401

    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [path], arg_overrides={"data": data})
    return models[0].eval(), task


def old_format(stock_checkpoint, path):
    """``stock_checkpoint`` saved as fairseq 0.6 (2018) saved its published models, e.g.
    wmt14.en-fr.joined-dict.transformer: options as an ``args`` Namespace (``lr`` a float,
    ``min_lr``, ``raw_text``) without ``cfg``; one ``in_proj_weight``/``in_proj_bias``
    per attention; the layers' layer norms as ``layer_norms.N``; ``decoder.embed_out``; the old
    ``extra_state``."""
    state = torch.load(stock_checkpoint, weights_only=False)
    args = Namespace(**{k: v for k, v in vars(state["cfg"]["model"]).items()
                        if not k.startswith("_")})
    task = state["cfg"]["task"]
    args.__dict__.update(arch="transformer", task="translation", data=task["data"],
                         source_lang=task["source_lang"], target_lang=task["target_lang"],
                         raw_text=False, lr=0.005,
                         criterion="label_smoothed_cross_entropy", optimizer="adam",
                         lr_scheduler="inverse_sqrt", min_lr=1e-9)
    sd = dict(state["model"])
    for prefix in sorted({k[:-len("q_proj.weight")] for k in sd if k.endswith("q_proj.weight")}):
        for t in ("weight", "bias"):
            sd[f"{prefix}in_proj_{t}"] = torch.cat([sd.pop(f"{prefix}{p}_proj.{t}") for p in "qkv"])
    norms = {"encoder": ["self_attn_layer_norm", "final_layer_norm"],
             "decoder": ["self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"]}
    for k in list(sd):
        part = k.split(".")
        if part[1] == "layers" and part[3] in norms.get(part[0], []):
            n = norms[part[0]].index(part[3])
            sd[".".join(part[:3] + ["layer_norms", str(n)] + part[4:])] = sd.pop(k)
    projection = sd.pop("decoder.output_projection.weight")
    if not args.share_decoder_input_output_embed:  # tied: the embedding alone
        sd["decoder.embed_out"] = projection
    torch.save({"args": args, "model": sd, "last_optimizer_state": {},
                "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion",
                                       "optimizer_name": "Adam", "num_updates": 30,
                                       "lr_scheduler_state": {"best": 3.0}}],
                "extra_state": {"epoch": 3, "batch_offset": 0, "val_loss": 3.0}}, path)
    return path


def batch(task, split="valid", max_sentences=8):
    """The first batch of a split (padded, with prev_output_tokens)."""
    task.load_dataset(split)
    ds = task.dataset(split)
    return ds.collater([ds[i] for i in range(min(max_sentences, len(ds)))])


def beam_search(model, task, sample, beam=4):
    from fairseq.sequence_generator import SequenceGenerator

    gen = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_b=20)
    with torch.no_grad():
        hypos = gen.generate([model], sample)
    return [[(h["tokens"].tolist(), h["score"].item(), h["positional_scores"]) for h in sent]
            for sent in hypos]


def assert_same_hypotheses(a, b, atol=1e-6):
    assert len(a) == len(b)
    for sa, sb in zip(a, b):
        assert [h[0] for h in sa] == [h[0] for h in sb]
        for ha, hb in zip(sa, sb):
            assert abs(ha[1] - hb[1]) <= atol
            assert torch.allclose(ha[2], hb[2], atol=atol)


def loss(model, task, sample):
    from fairseq.criterions.label_smoothed_cross_entropy import (
        LabelSmoothedCrossEntropyCriterion,
    )

    crit = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    value, _, _ = crit(model, sample)
    return value
