"""Syntactic heads (Voita et al. 2019, Sec. 5.2) from CoNLL-U parses: the tiny fixture read
exactly, subword-to-word mapping and word-level attention by hand, and ``analyze --conllu``
end to end with its bad-input cases (count and tokenisation mismatches name the sentence)."""

import json
import os

import pytest
import torch
from conftest import cli

from fairseq_headprune.methods.analysis import syntax

TINY = os.path.join(os.path.dirname(__file__), "data", "tiny.conllu")


def test_tiny_conllu_fixture_is_read_exactly():
    (words1, arcs1), (words2, arcs2) = syntax.read_conllu(TINY)
    assert words1 == ["The", "cat", "chased", "a", "small", "mouse", "quickly", "."]
    # 0-based (dependent, head, relation); det, root and punct are not counted; obj is dobj
    assert arcs1 == [(1, 2, "nsubj"), (4, 5, "amod"), (5, 2, "dobj"), (6, 2, "advmod")]
    assert words2 == ["It", "was", "eaten", "."]  # the multiword token line is skipped
    assert arcs2 == [(0, 2, "nsubj")]  # nsubj:pass counts as nsubj


def test_pieces_are_mapped_to_words_by_their_characters():
    S = syntax.SPACE
    assert syntax.piece_words([S + "The", S + "ca", "t", S + "sat", "."],
                              ["The", "cat", "sat", "."]) == [0, 1, 1, 2, 3]
    assert syntax.piece_words(["The", "ca@@", "t", "sat"], ["The", "cat", "sat"]) == [0, 1, 1, 2]
    # one piece over two words belongs to the first
    assert syntax.piece_words([S + "sat.", S + "Yes"], ["sat", ".", "Yes"]) == [0, 2]
    assert syntax.piece_words([S + "The", S + "dog"], ["The", "cat"]) is None
    assert syntax.piece_words(["<unk>"], ["x"]) is None


def test_word_attention_sums_attended_and_averages_attending_pieces():
    # pieces: The | ca t | sat  -> words 0 | 1 | 2; one head
    maps = torch.tensor([[[0.1, 0.2, 0.3, 0.4],
                          [0.5, 0.1, 0.1, 0.3],
                          [0.2, 0.2, 0.2, 0.4],
                          [0.0, 0.6, 0.3, 0.1]]])
    words = syntax.word_attention(maps, [0, 1, 1, 2], 3)
    expected = torch.tensor([[[0.1, 0.5, 0.4],
                              [(0.5 + 0.2) / 2, (0.2 + 0.4) / 2, (0.3 + 0.4) / 2],
                              [0.0, 0.9, 0.1]]])
    assert torch.allclose(words, expected)
    # arcs: word 0 is the nsubj of word 2; word 1 the amod of word 2
    found = syntax.relation_hits(words, [(0, 2, "nsubj"), (1, 2, "amod")])
    # argmax per word: 0 -> 1, 1 -> 2 (0.35 vs 0.3), 2 -> 1
    assert {k: (v[0].tolist(), v[1], v[2]) for k, v in found.items()} == {
        "nsubj:dep->head": ([0.0], 1, [2]), "nsubj:head->dep": ([0.0], 1, [-2]),
        "amod:dep->head": ([1.0], 1, [1]), "amod:head->dep": ([1.0], 1, [-1])}
    assert syntax.positional_baseline([1, 1, -1, 2, -1]) == (-1, 0.4)  # tie: the smaller


def ok(argv, capsys, cwd):
    """Run ``fairseq-headprune argv`` in this process where it must succeed; return stderr."""
    from fairseq_headprune.cli import main

    old = os.getcwd()
    os.chdir(cwd)
    try:
        main(argv)
    finally:
        os.chdir(old)
    return capsys.readouterr().err


def write_conllu(path, sentences, relation="nsubj"):
    """Each word after the first depends on the word before it with ``relation``."""
    with open(path, "w") as f:
        for n, words in enumerate(sentences):
            f.write(f"# sent_id = {n + 1}\n")
            for i, w in enumerate(words):
                head, rel = (0, "root") if i == 0 else (i, relation)
                f.write(f"{i + 1}\t{w}\t{w}\tX\tX\t_\t{head}\t{rel}\t_\t_\n")
            f.write("\n")


@pytest.fixture(scope="module")
def valid_words(data_dir):
    with open(os.path.join(os.path.dirname(data_dir), "valid.src")) as f:
        return [line.split() for line in f]


def test_analyze_with_parses(headprune_checkpoint, data_dir, valid_words, tmp_path, capsys):
    parses = tmp_path / "valid.conllu"
    write_conllu(parses, valid_words)
    ok(["analyze", data_dir, "--path", headprune_checkpoint, "-o", "roles", "--device", "cpu",
        "--lrp-sentences", "0", "--min-tokens", "10", "--conllu", str(parses)], capsys, tmp_path)
    with open(tmp_path / "roles" / "roles.json") as f:
        result = json.load(f)
    pairs = sum(len(w) - 1 for w in valid_words)
    rel = result["syntactic"]["relations"]
    assert sorted(rel) == ["nsubj:dep->head", "nsubj:head->dep"]
    # every pair is one word apart: the positional baseline is exact
    assert rel["nsubj:dep->head"] == {**rel["nsubj:dep->head"], "pairs": pairs,
                                      "baseline_offset": -1, "baseline": 1.0}
    assert rel["nsubj:head->dep"]["baseline_offset"] == 1
    acc = result["measures"]["syntactic_accuracy"]["E"]
    margin = result["measures"]["syntactic_margin"]["E"]
    assert len(acc) == 2 and len(acc[0]) == 4
    for layer in range(2):
        for head in range(4):
            key = result["measures"]["syntactic_relation"]["E"][layer][head]
            assert acc[layer][head] == rel[key]["accuracy"][layer][head]
            assert abs(margin[layer][head] - (acc[layer][head] - 1.0)) < 1e-9
    assert "syntactic" not in sum((r for row in result["roles"]["E"] for r in row), [])


def test_too_few_pairs_say_so(headprune_checkpoint, data_dir, valid_words, tmp_path, capsys):
    parses = tmp_path / "valid.conllu"
    write_conllu(parses, valid_words, relation="advmod")
    err = ok(["analyze", data_dir, "--path", headprune_checkpoint, "-o", "roles", "--device",
              "cpu", "--lrp-sentences", "0", "--max-sentences", "2", "--min-tokens", "1",
              "--conllu", str(parses)], capsys, tmp_path)
    n = sum(len(w) - 1 for w in valid_words[:2])
    note = (f"syntactic: advmod:dep->head has {n} pairs, fewer than --min-pairs 20: left out.")
    assert note in err
    with open(tmp_path / "roles" / "roles.json") as f:
        assert json.load(f)["syntactic"]["relations"] == {}


@pytest.mark.parametrize("case", ["count", "word"])
def test_parses_that_do_not_match_the_source_name_the_sentence(
        case, headprune_checkpoint, data_dir, valid_words, tmp_path, capsys):
    sentences = [list(w) for w in valid_words]
    if case == "count":
        sentences = sentences[:-1]
    else:
        sentences[2][1] = "zz"
    parses = tmp_path / "valid.conllu"
    write_conllu(parses, sentences)
    code, err = cli(["analyze", data_dir, "--path", headprune_checkpoint, "-o", "roles",
                     "--device", "cpu", "--conllu", str(parses)], capsys, tmp_path)
    assert code == 2 and "Traceback" not in err
    n = len(valid_words)
    if case == "count":
        expected = (f"{parses} has {n - 1} sentences but the source side of 'valid' has {n}; "
                    f"sentence {n} differs: CoNLL-U '(none)', source "
                    f"'{' '.join(valid_words[-1])}'.")
    else:
        expected = (f"{parses} does not match the source side of 'valid': sentence 3 differs: "
                    f"CoNLL-U '{' '.join(sentences[2])}', source '{' '.join(valid_words[2])}'.")
    assert err.strip().splitlines()[-1] == "fairseq-headprune analyze: error: " + expected
    assert sorted(os.listdir(tmp_path)) == ["valid.conllu"]


def test_a_file_that_is_not_conllu(tmp_path):
    from fairseq_headprune.errors import HeadPruneError

    bad = tmp_path / "bad.conllu"
    bad.write_text("1\tword\n")  # two columns, not ten
    with pytest.raises(HeadPruneError, match=f"^{bad} is not a readable CoNLL-U file: "):
        syntax.read_conllu(str(bad))
    with pytest.raises(HeadPruneError, match="does not exist"):
        syntax.read_conllu(str(tmp_path / "nowhere.conllu"))


def test_spacy_parsing_is_skipped_cleanly_without_spacy_or_its_model(
        headprune_checkpoint, data_dir, tmp_path, capsys):
    try:
        import spacy  # noqa: F401
        expected = "syntactic: the spaCy model 'no_such_model' is not installed"
    except ImportError:
        expected = "syntactic: spaCy is not installed (pip install .[syntax]): skipped."
    err = ok(["analyze", data_dir, "--path", headprune_checkpoint, "-o", "roles", "--device",
              "cpu", "--lrp-sentences", "0", "--max-sentences", "2", "--min-tokens", "1",
              "--spacy-model", "no_such_model"], capsys, tmp_path)
    assert expected in err
    with open(tmp_path / "roles" / "roles.json") as f:
        result = json.load(f)
    assert "syntactic" not in result and any(n.startswith(expected) for n in result["notes"])
    code, err = cli(["analyze", data_dir, "--path", headprune_checkpoint, "-o", "r2",
                     "--conllu", "x.conllu", "--spacy-model", "m"], capsys, tmp_path)
    assert code == 2 and err.strip().splitlines()[-1] == (
        "fairseq-headprune analyze: error: give --conllu or --spacy-model, not both.")
    assert not (tmp_path / "r2").exists()


def test_detokenize_for_spacy():
    S = syntax.SPACE
    assert syntax.detokenize([S + "The", S + "ca", "t", "."]) == "The cat."
    assert syntax.detokenize(["The", "ca@@", "t", "."]) == "The cat ."
