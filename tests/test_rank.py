"""Spearman rank correlation of head scores, and ``fairseq-headprune correlate``."""

import json
import math

import numpy as np
import pytest
import torch
from conftest import run

from fairseq_headprune.heads.rank import correlate, spearman


@pytest.mark.parametrize("a, b, rho", [
    ([1, 2, 3], [10, 20, 30], 1.0),
    ([1, 2, 3], [3, 2, 1], -1.0),
    ([1, 1, 2, 3], [1, 2, 3, 4], 4.5 / math.sqrt(22.5)),  # ties share the average rank
    ([1, 2, 3, 4], [1, 3, 2, 4], 0.8),
])
def test_spearman_hand_computed(a, b, rho):
    assert spearman(np.array(a), np.array(b)) == pytest.approx(rho, abs=1e-12)


def test_undefined_correlations_are_none():
    assert spearman(np.array([1.0, 1.0, 1.0]), np.array([1.0, 2.0, 3.0])) is None
    assert spearman(np.array([1.0]), np.array([2.0])) is None


def test_removed_heads_are_left_out():
    a = {"E": torch.tensor([[1.0, 2.0, math.nan], [3.0, 4.0, 5.0]]),
         "D": torch.tensor([[1.0, 2.0, 3.0]])}
    b = {"E": torch.tensor([[10.0, 20.0, 0.0], [30.0, 50.0, 40.0]]),
         "D": torch.tensor([[3.0, 2.0, 1.0]])}
    rho = correlate(a, b)
    assert rho["E"] == pytest.approx(0.9)  # ranks 0..4 vs 0,1,2,4,3
    assert rho["D"] == pytest.approx(-1.0)
    assert set(rho) == {"E", "D", "all"}


def test_correlate_command(tmp_path):
    files = []
    for name, rows in (("a", [[0.1, 0.2, 0.3]]), ("b", [[0.3, 0.2, 0.1]])):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"importance": {"E": rows, "A": [[1.0, 2.0, 3.0]]}}))
        files.append(str(path))
    out = tmp_path / "rho.json"
    proc = run(["fairseq-headprune", "correlate", "--importance", *files, "--labels", "a", "b",
                "-o", str(out)])
    assert "b vs a: Spearman E -1.000  A +1.000" in proc.stdout
    assert json.loads(out.read_text())["rows"][0]["spearman"]["E"] == pytest.approx(-1.0)
    bad = run(["fairseq-headprune", "correlate", "--importance", *files, "--labels", "a"],
              check=False)
    assert bad.returncode == 2
    assert bad.stderr.strip().endswith("error: --labels names 1 files, --importance 2.")


@pytest.mark.parametrize("content, message", [
    ({"heads": {"E": {"1": [1]}}, "importance": "imp.json"},
     "is not an importance JSON written by the head_importance task (ValueError: 'importance' "
     "must map E, D, A to layers x heads tables)."),
    ({"importance": {"E": [[0.1, 0.2], [0.3]]}}, "must map E, D, A to layers x heads tables"),
    ({"importance": {"X": [[0.1]]}}, "must map E, D, A to layers x heads tables"),
])
def test_a_file_that_is_not_an_importance_table(content, message, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(content))
    proc = run(["fairseq-headprune", "choose", "--importance", str(bad), "--amount", "0.3"],
               check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert message in proc.stderr.strip().splitlines()[-1]


def test_choose_refuses_to_write_over_its_importance(tmp_path):
    imp = tmp_path / "imp.json"
    imp.write_text(json.dumps({"importance": {"E": [[0.1, 0.2]]}}))
    before = imp.read_text()
    proc = run(["fairseq-headprune", "choose", "--importance", str(imp), "--amount", "1", "-o",
                str(imp)], check=False)
    assert proc.returncode == 2 and imp.read_text() == before
    assert proc.stderr.strip().splitlines()[-1] == (
        f"fairseq-headprune choose: error: -o {imp} is the input file {imp}: write to another "
        f"file.")
