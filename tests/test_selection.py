"""The pruning criterion on a hand-made score table."""

import math

import pytest
import torch

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.heads.spec import format_head_spec
from fairseq_headprune.pruning.selection import (
    choose_heads, choose_to_keep, mask_scores, merge_specs, parse_keep)

NAN = math.nan
SCORES = {  # 2 layers x 3 heads per type
    "E": torch.tensor([[0.9, 0.1, 0.5], [0.8, 0.7, 0.05]], dtype=torch.float64),
    "D": torch.tensor([[0.3, 0.2, 0.95], [0.6, 0.15, 0.4]], dtype=torch.float64),
    "A": torch.tensor([[0.99, 0.98, 0.97], [0.25, 0.35, 0.45]], dtype=torch.float64),
}


@pytest.mark.parametrize("amount,scope,types,keep_one,expected", [
    (0.0, "global", None, False, ""),
    (3, "global", None, False, "E:1:2 E:2:3 D:2:2"),
    (1 / 6, "global", None, False, "E:1:2 E:2:3 D:2:2"),
    (2, "global", "A", False, "A:2:1,2"),
    (1 / 3, "type", None, False, "E:1:2 E:2:3 D:1:2 D:2:2 A:2:1,2"),
    (1 / 3, "layer", "E", False, "E:1:2 E:2:3"),
    (5 / 6, "global", "E", True, "E:1:2,3 E:2:2,3"),
    (6, "global", "D", False, "D:1:1,2,3 D:2:1,2,3"),
    (1.0, "global", "D", False, "D:2:2"),  # >= 1 is a count
])
def test_choose(amount, scope, types, keep_one, expected):
    spec = choose_heads(SCORES, amount, scope, types, keep_one)
    assert format_head_spec(spec) == expected


def test_removed_heads_count_towards_the_target():
    scores = mask_scores(SCORES, {"E": {1: [2]}, "D": {1: [1]}})
    assert math.isnan(scores["E"][1, 2]) and not math.isnan(SCORES["E"][1, 2])
    # 3 of 18 wanted; 2 already gone; the next least important present head is E:1:2
    assert format_head_spec(choose_heads(scores, 3)) == "E:1:2"
    assert format_head_spec(choose_heads(scores, 2)) == ""


def test_merge():
    assert merge_specs({"E": {0: [1]}}, {"E": {0: [0]}, "A": {1: [2]}}) == \
        {"A": {1: [2]}, "E": {0: [0, 1]}}


def test_errors():
    with pytest.raises(HeadPruneError, match=r"^cannot prune 19 heads: the model has 18\.$"):
        choose_heads(SCORES, 19)
    with pytest.raises(HeadPruneError, match=r"^unknown scope 'model': expected one of "
                                             r"global, type, layer\.$"):
        choose_heads(SCORES, 1, scope="model")


@pytest.mark.parametrize("keep, expected", [
    ("E:6,D:6,A:6", ""),
    ("E:4", "E:1:2 E:2:3"),  # the two least important E heads; D and A untouched
    ("E:1,D:5,A:0", "E:1:2,3 E:2:1,2,3 D:2:2 A:1:1,2,3 A:2:1,2,3"),
])
def test_choose_to_keep_per_type(keep, expected):
    spec = choose_to_keep(SCORES, parse_keep(keep))
    assert format_head_spec(spec) == expected


def test_keep_per_type_errors():
    with pytest.raises(HeadPruneError, match=r"^cannot keep 7 E heads: the model has 6\.$"):
        choose_to_keep(SCORES, {"E": 7})
    with pytest.raises(HeadPruneError) as err:
        parse_keep("E:3,X:2")
    assert str(err.value) == ("malformed --keep-per-type item 'X:2': expected TYPE:COUNT with "
                              "TYPE one of E, D, A, e.g. E:10,D:24,A:20.")
