"""The head spec: parsing, formatting, round trips and exact error messages."""

import json

import pytest

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.heads.layout import HeadLayout
from fairseq_headprune.heads.spec import (
    check_spec,
    format_head_spec,
    parse_head_spec,
    spec_to_json,
)

PARSED = [
    ("E:1:1", {"E": {0: [0]}}),
    ("E:1:1,3-4 A:6:2", {"E": {0: [0, 2, 3]}, "A": {5: [1]}}),
    ("D:2:4;D:2:1  E:1:2", {"D": {1: [0, 3]}, "E": {0: [1]}}),
    ("", {}),
    ('{"A": {"6": [2]}, "E": {"1": [1, 3]}}', {"A": {5: [1]}, "E": {0: [0, 2]}}),
    ('{"heads": {"D": {"2": [1]}}, "fraction": 0.1}', {"D": {1: [0]}}),
]


@pytest.mark.parametrize("text,expected", PARSED)
def test_parse(text, expected):
    assert parse_head_spec(text) == expected


@pytest.mark.parametrize("text", ["E:1:1", "E:1:1,3,4 D:2:1 A:6:2,16"])
def test_round_trip_text_and_json(text):
    spec = parse_head_spec(text)
    assert format_head_spec(spec) == text
    assert parse_head_spec(json.dumps(spec_to_json(spec))) == spec


def test_reads_a_file(tmp_path):
    path = tmp_path / "heads.json"
    path.write_text(json.dumps({"heads": {"E": {"2": [3]}}}))
    assert parse_head_spec(str(path)) == {"E": {1: [2]}}


MALFORMED = ["X:1:1", "E:1", "E:0:1", "E:1:0", "E:a:1", "E:1:3-1", "E:1:1,", "e:1:1"]


@pytest.mark.parametrize("item", MALFORMED)
def test_malformed_text(item):
    with pytest.raises(HeadPruneError) as err:
        parse_head_spec(f"A:1:1 {item}")
    assert str(err.value) == (
        f"malformed head spec item '{item}': expected TYPE:LAYER:HEADS with TYPE one of E, D, A "
        f"and 1-based LAYER and HEADS, e.g. E:1:1,3-4.")


def test_malformed_json():
    with pytest.raises(HeadPruneError, match=r"^the head spec is not valid JSON"):
        parse_head_spec('{"E": ')
    with pytest.raises(HeadPruneError, match=r"^malformed JSON head spec entry 'Q'"):
        parse_head_spec('{"Q": {"1": [1]}}')
    with pytest.raises(HeadPruneError, match=r"^malformed head spec item 'E:1:\['x'\]'"):
        parse_head_spec('{"E": {"1": ["x"]}}')


LAYOUT = HeadLayout.full({"E": 4, "D": 4, "A": 4}, {"E": 2, "D": 3, "A": 3})


@pytest.mark.parametrize("text,message", [
    ("E:3:1", "layer 3 is out of range for E (encoder self-attention): "
              "the model has 2 layers (1-2)."),
    ("A:2:5", "head 5 is out of range for A:2: the model has 4 heads per layer (1-4)."),
])
def test_out_of_range(text, message):
    with pytest.raises(HeadPruneError) as err:
        check_spec(parse_head_spec(text), LAYOUT)
    assert str(err.value) == message


def test_in_range_passes():
    check_spec(parse_head_spec("E:2:4 D:3:1 A:3:4"), LAYOUT)
