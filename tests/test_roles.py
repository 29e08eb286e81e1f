"""Voita et al. (2019) head roles: hand-built attention maps with known answers, the attention
recorder on a real model, and ``analyze`` end to end (pruned model, too small a subset)."""

import json
import math
import os

import pytest
import torch
from conftest import batch, cli, load

from fairseq_headprune.methods.analysis import measures
from fairseq_headprune.methods.analysis.attention import record_attention

# two heads, one sentence of four tokens; rows are queries, columns keys
PREVIOUS = [[1.0, 0.0, 0.0, 0.0],  # query 0 has no previous token: attends to itself
            [0.7, 0.3, 0.0, 0.0],
            [0.1, 0.6, 0.3, 0.0],
            [0.0, 0.2, 0.5, 0.3]]
TO_TOKEN_2 = [[0.2, 0.2, 0.4, 0.2],
              [0.1, 0.1, 0.5, 0.3],
              [0.25, 0.25, 0.25, 0.25],  # a tie: argmax takes the lowest position, 0
              [0.0, 0.1, 0.9, 0.0]]
MAPS = torch.tensor([[PREVIOUS], [TO_TOKEN_2]])  # H x B x Tq x Tk = 2 x 1 x 4 x 4


def test_confidence_is_the_mean_maximum_over_counted_queries():
    everyone = torch.ones(1, 4, dtype=torch.bool)
    sums = measures.confidence_sum(MAPS, everyone)
    assert torch.allclose(sums, torch.tensor([1.0 + 0.7 + 0.6 + 0.5, 0.4 + 0.5 + 0.25 + 0.9]))
    not_last = torch.tensor([[True, True, True, False]])  # e.g. the end-of-sentence token
    assert torch.allclose(measures.confidence_sum(MAPS, not_last) / 3,
                          torch.tensor([2.3 / 3, 1.15 / 3]))


def test_positional_hits_count_the_argmax_at_each_offset():
    everyone = torch.ones(1, 4, dtype=torch.bool)
    hits = measures.positional_hits(MAPS, everyone, offsets=(-1, 1))
    # head 0: queries 1, 2, 3 attend most to i - 1; query 0 to itself (offset 0)
    # head 1: argmax 2, 2, 0, 2 -> offsets +2, +1, -2, -1
    assert hits.tolist() == [[3, 0], [1, 1]]
    assert measures.positional_hits(MAPS, everyone, offsets=(0,)).tolist() == [[1], [0]]
    only_first_two = torch.tensor([[True, True, False, False]])
    assert measures.positional_hits(MAPS, only_first_two).tolist() == [[1, 0], [0, 1]]


def test_rare_word_hits_follow_the_least_frequent_token():
    counts = torch.tensor([0, 0, 0, 0, 50, 3, 900, 3])  # by token id
    tokens = torch.tensor([[4, 5, 6, 2]])  # token 2 (an end of sentence) is not allowed
    allowed = torch.tensor([[True, True, True, False]])
    rare = measures.rarest_tokens(tokens, counts, allowed)
    assert rare.tolist() == [[False, True, False, False]]  # count 3 at position 1
    everyone = torch.ones(1, 4, dtype=torch.bool)
    assert measures.rare_hits(MAPS, everyone, rare).tolist() == [1, 0]  # head 0, query 2
    tie = measures.rarest_tokens(torch.tensor([[5, 7, 4]]), counts, torch.ones(1, 3, dtype=bool))
    assert tie.tolist() == [[True, True, False]]  # both count 3


def test_recorded_maps_are_per_head_softmax_and_leave_the_output_unchanged(
        headprune_checkpoint, data_dir):
    model, task = load(headprune_checkpoint, data_dir)
    sample = batch(task, "valid", max_sentences=3)
    with torch.no_grad():
        plain = model(**sample["net_input"])[0]
        with record_attention(model) as maps:
            recorded = model(**sample["net_input"])[0]
        again = model(**sample["net_input"])[0]
    assert torch.allclose(plain, recorded, atol=1e-6) and torch.equal(plain, again)
    src_len = sample["net_input"]["src_tokens"].size(1)
    tgt_len = sample["target"].size(1)
    assert sorted(maps) == [(k, layer) for k in "ADE" for layer in (0, 1)]
    assert maps[("E", 0)].shape == (4, 3, src_len, src_len)
    assert maps[("D", 1)].shape == (4, 3, tgt_len, tgt_len)
    assert maps[("A", 0)].shape == (4, 3, tgt_len, src_len)
    for m in maps.values():
        assert torch.allclose(m.sum(-1), torch.ones(m.shape[:-1]), atol=1e-5)
    assert torch.all(maps[("D", 0)].triu(1) == 0)  # the decoder sees no future token
    pad = sample["net_input"]["src_tokens"] == task.source_dictionary.pad()
    assert torch.all(maps[("E", 1)][:, pad.unsqueeze(1).expand(-1, src_len, -1)] == 0)
    # the module flags are restored: the fused path is back
    assert not model.encoder.layers[0].self_attn.skip_embed_dim_check


@pytest.fixture(scope="module")
def zero_head_model(headprune_checkpoint, tmp_path_factory):
    from conftest import run

    out = tmp_path_factory.mktemp("roles") / "pruned.pt"
    run(["fairseq-headprune", "prune", "--path", headprune_checkpoint, "--heads",
         "E:1:2 D:2:1-4", "-o", str(out)])
    return str(out)


def test_analyze_writes_json_and_csv_with_removed_heads_null(zero_head_model, data_dir,
                                                             tmp_path, capsys):
    code = None
    try:
        from fairseq_headprune.cli import main

        main(["analyze", data_dir, "--path", zero_head_model, "-o", str(tmp_path / "roles"),
              "--device", "cpu", "--min-tokens", "10", "--lrp-sentences", "3"])
    except SystemExit as err:
        code = err.code
    assert code is None, capsys.readouterr().err[-2000:]
    with open(tmp_path / "roles" / "roles.json") as f:
        result = json.load(f)
    assert result["sentences"] == 24 and result["kept"]["D"][1] == []
    conf = result["measures"]["confidence"]
    assert conf["E"][0][1] is None and conf["D"][1] == [None] * 4
    assert all(1 / 10 <= v <= 1 for v in conf["E"][1])  # at most 9 keys + EOS per sentence
    assert set(result["measures"]["positional_share"]) == {"E", "D"}
    assert set(result["measures"]["rare_share"]) == {"E", "A"}
    assert result["roles"]["D"][1] == [None] * 4 and result["roles"]["E"][0][0] is not None
    relevance = result["measures"]["relevance"]
    assert result["lrp"]["sentences"] == 3 and relevance["D"][1] == [None] * 4
    assert relevance["E"][0][1] is None
    for kind in "EDA":  # each layer's kept heads share 1
        for row in relevance[kind]:
            kept = [v for v in row if v is not None]
            assert not kept or abs(sum(kept) - 1) < 1e-9
    with open(tmp_path / "roles" / "roles.csv") as f:
        rows = f.read().splitlines()
    assert rows[0].startswith("type,layer,head,kept,confidence,")
    assert len(rows) == 1 + 3 * 2 * 4
    assert rows[2].startswith("E,1,2,0,,")  # removed: kept 0, no values
    tokens = result["tokens"]["E"]
    assert math.isclose(float(rows[1].split(",")[4]), conf["E"][0][0], rel_tol=1e-5)
    assert tokens == result["tokens"]["D"] == result["tokens"]["A"]  # toy: same lengths


def test_a_subset_too_small_says_so(headprune_checkpoint, data_dir, tmp_path, capsys):
    from fairseq_headprune.cli import main

    main(["analyze", data_dir, "--path", headprune_checkpoint, "-o", str(tmp_path / "r"),
          "--device", "cpu", "--max-sentences", "2", "--min-tokens", "1000",
          "--lrp-sentences", "0"])
    err = capsys.readouterr().err
    with open(tmp_path / "r" / "roles.json") as f:
        result = json.load(f)
    n = result["tokens"]["E"]
    note = (f"E: {n} counted tokens in 2 sentences, fewer than --min-tokens 1000: confidence, "
            f"positional and rare-word shares of E are left empty.")
    assert note in result["notes"] and note in err
    assert result["measures"]["confidence"]["E"] == [[None] * 4] * 2
    assert "relevance" not in result["measures"] and result["lrp"]["predictions"] == 0


def test_overlay_and_rank_correlation_with_michel(headprune_checkpoint, zero_head_model,
                                                  importance_file, data_dir, tmp_path, capsys):
    from fairseq_headprune.cli import main
    from fairseq_headprune.heads.rank import correlate
    from fairseq_headprune.heads.scores import from_lists, read_importance

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"heads": {"E": {"1": [1, 2]}, "A": {"2": [4]}}}))
    out = tmp_path / "roles"
    main(["analyze", data_dir, "--path", headprune_checkpoint, "-o", str(out), "--device",
          "cpu", "--min-tokens", "10", "--lrp-sentences", "2", "--importance", importance_file,
          "--overlay", f"michel={importance_file}", "--overlay", f"spec={spec}",
          "--overlay", f"pruned={zero_head_model}", "--overlay-keep", "5"])
    stdout = capsys.readouterr().out
    with open(out / "roles.json") as f:
        result = json.load(f)
    methods = result["overlay"]["methods"]
    assert list(methods) == ["michel", "spec", "pruned"]
    # the 5 most important heads of all 24
    scores = read_importance(importance_file)
    ranked = sorted(((float(scores[k][layer, h]), k, layer, h) for k in "EDA"
                     for layer in range(2) for h in range(4)), key=lambda x: -x[0])[:5]
    for k in "EDA":
        for layer in range(2):
            assert methods["michel"]["kept"][k][layer] == sorted(
                h for _, kk, ll, h in ranked if (kk, ll) == (k, layer))
    assert sum(methods["michel"]["counts"].values()) == 5
    assert methods["spec"]["kept"]["E"][0] == [2, 3]
    assert methods["spec"]["kept"]["A"][1] == [0, 1, 2]
    assert methods["spec"]["counts"] == {"E": 6, "D": 8, "A": 7}
    assert methods["pruned"]["kept"]["E"][0] == [0, 2, 3]
    assert methods["pruned"]["kept"]["D"][1] == []
    # Spearman of the written tables, per type and over all heads
    measures = {name: from_lists(t) for name, t in result["measures"].items()
                if name in ("relevance", "confidence", "importance")}
    spearman = result["correlation"]["spearman"]
    for name in ("relevance", "confidence"):
        assert spearman[f"{name}_vs_importance"] == correlate(measures[name],
                                                              measures["importance"])
        assert f"{name} vs importance: Spearman E " in stdout
    for png in ("overlay", "confidence", "relevance", "positional_share", "rare_share",
                "importance"):
        assert (out / f"{png}.png").stat().st_size > 0


@pytest.mark.parametrize("option", ["--importance", "--overlay"])
def test_scores_of_another_model_are_refused(option, headprune_checkpoint, data_dir, tmp_path,
                                             capsys):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"importance": {"E": [[1.0, 2.0]], "D": [[1.0, 2.0]]}}))
    value = str(other) if option == "--importance" else f"x={other}"
    code, err = cli(["analyze", data_dir, "--path", headprune_checkpoint, "-o", "roles",
                     "--device", "cpu", option, value], capsys, tmp_path)
    what = f"--importance {other}" if option == "--importance" else f"--overlay x={other}"
    assert code == 2 and err.strip().splitlines()[-1] == (
        f"fairseq-headprune analyze: error: {what} is for a model with layers x heads "
        f"{{'E': [1, 2], 'D': [1, 2]}}, not the analysed model's "
        f"{{'E': [2, 4], 'D': [2, 4], 'A': [2, 4]}}.")
    assert sorted(os.listdir(tmp_path)) == ["other.json"]


def test_a_converted_stock_checkpoint(stock_checkpoint, data_dir, tmp_path, capsys):
    from fairseq_headprune.cli import main

    converted = tmp_path / "converted.pt"
    main(["convert", "--path", stock_checkpoint, "-o", str(converted)])
    main(["analyze", data_dir, "--path", str(converted), "-o", str(tmp_path / "r"), "--device",
          "cpu", "--max-sentences", "4", "--lrp-sentences", "1", "--min-tokens", "1"])
    with open(tmp_path / "r" / "roles.json") as f:
        result = json.load(f)
    assert result["sentences"] == 4 and result["lrp"]["sentences"] == 1
    relevance = result["measures"]["relevance"]
    assert all(abs(sum(row) - 1) < 1e-9 for k in "EDA" for row in relevance[k])
