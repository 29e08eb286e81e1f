"""Decoding cost model (hand-computed) and the side-by-side benchmark on a tiny model."""

from argparse import Namespace

import pytest
from conftest import run

from fairseq_headprune.evaluation.bench import (
    format_bench, run_bench, share_of_ideal_gain, speed_table, synthetic_bench, synthetic_models,
    synthetic_task)
from fairseq_headprune.evaluation.cost import decode_macs, kv_cache_bytes
from fairseq_headprune.heads.layout import HeadLayout

ARGS = Namespace(encoder_embed_dim=4, decoder_embed_dim=4, encoder_ffn_embed_dim=8,
                 decoder_ffn_embed_dim=8, encoder_attention_heads=2, decoder_attention_heads=2,
                 decoder_layers=1)


def layout(e, d, a):
    return HeadLayout({"E": 2, "D": 2, "A": 2}, {"E": [e], "D": [d], "A": [a]})


def test_macs_hand_computed():
    # C=4, F=8, head dim 2, one layer each, S=3 source and T=2 target tokens, beam 1, vocab 10
    full = decode_macs(layout([0, 1], [0, 1], [0, 1]), ARGS, vocab=10, src_len=3, tgt_len=2,
                       beam=1)
    enc = 3 * (4 * 4 * 4 + 2 * 4 * 3 + 2 * 4 * 8)           # 3 tokens: qkv+out, scores, FFN
    dec_self = 2 * 4 * 4 * 4 + 2 * 4 * 3                     # T*(4*C*n) + 2*n*(1+2)
    dec_cross = 2 * 4 * 4 * 3 + 2 * (2 * 4 * 4 + 2 * 4 * 3)  # keys/values once + per step
    rest = 2 * (2 * 4 * 8 + 4 * 10)                          # FFN and output projection
    assert full == enc + dec_self + dec_cross + rest
    none = decode_macs(layout([], [], []), ARGS, vocab=10, src_len=3, tgt_len=2, beam=1)
    assert none == 3 * 2 * 4 * 8 + rest


def test_kv_cache_hand_computed():
    # self: 1 head * dim 2 * (k, v) * 5 steps * beam 4; cross: 2 heads * 2 * 2 * 7 source
    assert kv_cache_bytes(layout([0], [1], [0, 1]), ARGS, src_len=7, tgt_len=5, beam=4) == \
        (2 * 2 * 5 * 4 + 2 * 2 * 2 * 7) * 4


def test_collaborative_cost_hand_computed():
    """Encoder self-attention collaborative with R = 3 (C=4, 2 heads of 2, S=3): per token
    q 3 + k 3 + content bias 2 + v/out 2*4 columns of C, mixing 2*3, per pair 2*3 scores + 4."""
    lay = layout([0, 1], [0, 1], [0, 1])
    standard = decode_macs(lay, ARGS, vocab=10, src_len=3, tgt_len=2, beam=1)
    collab = decode_macs(lay, ARGS, vocab=10, src_len=3, tgt_len=2, beam=1, key_dims={"E": 3})
    assert collab - standard == 3 * (4 * (3 + 5 + 8) + 2 * 3 + (6 + 4) * 3) - 3 * (64 + 24)
    # cache: D (1 head) R 3 + 1 content bias + 2 values per position, 5 steps x beam 4;
    # A (2 heads) 3 + 2 + 4 per source position, 7 positions
    assert kv_cache_bytes(layout([0], [1], [0, 1]), ARGS, src_len=7, tgt_len=5, beam=4,
                          key_dims={"D": 3, "A": 3}) == ((3 + 1 + 2) * 20 + (3 + 2 + 4) * 7) * 4


def test_bench_side_by_side(headprune_checkpoint, data_dir, tmp_path):
    pruned = str(tmp_path / "p.pt")
    run(["fairseq-headprune", "prune", "--path", headprune_checkpoint, "--heads",
         "D:1:1,2 D:2:1,2 A:1:1,2 A:2:1,2", "-o", pruned])
    report = run_bench(data_dir, headprune_checkpoint, pruned, subset="valid",
                       batch_sizes=[1, 8], max_sentences=8, repeats=3)
    assert [r["batch_size"] for r in report["rows"]] == [1, 8] and report["repeats"] == 3
    for row in report["rows"]:  # median within its range, for each figure and the ratio
        for fig in (row["full"]["seconds"], row["pruned"]["sentences_per_s"], row["speedup"]):
            assert fig["min"] <= fig["median"] <= fig["max"]
    assert all(r["sentences"] == 8 for r in report["rows"])
    assert report["full"]["heads"] == 24 and report["pruned"]["heads"] == 16
    assert report["kv_cache_ratio"] == pytest.approx(0.5, abs=1e-3)  # half the D and A heads
    per_head = 4 * 16 * 4 + 3 * 4
    assert report["full"]["parameters"] - report["pruned"]["parameters"] == 8 * per_head
    assert report["ideal_speedup"] > 1
    text = format_bench(report)
    assert "ideal speedup from removed MACs" in text and "batch    8:" in text


def test_share_of_ideal_gain_hand_computed():
    # the example: ideal 1.23x, measured 1.18x -> (1 - 1/1.18) / (1 - 1/1.23) = 0.816
    assert share_of_ideal_gain(1.18, 1.23) == pytest.approx(0.816, abs=1e-3)
    assert share_of_ideal_gain(1.0, 1.23) == 0 and share_of_ideal_gain(1.23, 1.23) == 1
    assert share_of_ideal_gain(1.1, 1.0) is None


def test_synthetic_models_have_the_standard_sizes_and_half_the_heads():
    task = synthetic_task(vocab=40, sentences=3, src_len=5)
    dataset = task.dataset("test")
    assert len(dataset) == 3 and list(dataset.src_sizes) == [6, 6, 6]
    assert len(task.source_dictionary) == 40
    for size, dim, heads in (("base", 512, 8), ("big", 1024, 16)):
        models = synthetic_models(size, task)
        full, pruned = models["full"], models["pruned"]
        assert full.encoder.layers[0].self_attn.q_proj.weight.shape == (dim, dim)
        assert len(full.encoder.layers) == len(full.decoder.layers) == 6
        for module in (pruned.encoder.layers[2].self_attn, pruned.decoder.layers[5].encoder_attn):
            assert module.num_heads == heads // 2
            assert module.q_proj.weight.shape == (dim // 2, dim)
        assert full.encoder.embed_tokens.weight is full.decoder.output_projection.weight


def test_synthetic_bench_decodes_fixed_steps():
    report = synthetic_bench("base", beam=2, batch_sizes=[2], sentences=2, repeats=2,
                             steps=3, src_len=4, vocab=30)
    assert report["full"]["heads"] == 144 and report["pruned"]["heads"] == 72
    assert report["fixed_length"] == 3 and report["synthetic"]["size"] == "base"
    row = report["rows"][0]
    # every hypothesis is exactly 3 tokens and the end of sentence, in both models
    assert row["sentences"] == 2
    for name in ("full", "pruned"):
        tps, sps = row[name]["tokens_per_s"]["median"], row[name]["sentences_per_s"]["median"]
        assert tps == pytest.approx(4 * sps, rel=0.02)
        assert row[name]["bleu"] is None
    assert report["ideal_speedup"] > 1 and report["kv_cache_ratio"] == pytest.approx(0.5, abs=0.01)
    assert "synthetic base" in format_bench(report)


def test_speed_table_states_the_goals():
    def row(bs, lo, med, hi, share):
        fig = {"median": 10.0, "min": 9.0, "max": 11.0}
        return {"batch_size": bs, "full": {"sentences_per_s": fig},
                "pruned": {"sentences_per_s": fig}, "share_of_ideal_gain": share,
                "speedup": {"min": lo, "median": med, "max": hi}}
    report = {"synthetic": {"size": "base", "prune_share": 0.5}, "device_name": "cpu x",
              "dtype": "fp32", "ideal_speedup": 1.2, "beam": 5, "fixed_length": 25,
              "repeats": 3, "rows": [row(1, 0.97, 0.98, 0.99, None), row(64, 1.1, 1.17, 1.2, 0.85)]}
    lines = speed_table([report]).splitlines()
    assert lines[2] == ("| synthetic base, 50% of heads removed | cpu x | fp32 | 1 | 3 | 10.00 | 10.00 "
                        "| 0.980 [0.970-0.990] | 1.200 | None | not met (slower) |")
    assert lines[3].endswith("| 0.85 | met (>= 0.8) |")
    report["rows"] = [row(1, 0.95, 0.99, 1.01, None), row(64, 1.0, 1.1, 1.1, 0.5)]
    lines = speed_table([report]).splitlines()
    assert lines[2].endswith("| met (not slower) |") and lines[3].endswith("| not met (< 0.8) |")
