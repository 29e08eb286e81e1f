"""Michel et al.'s ablations: which heads each row removes, and the BLEU differences."""

import json

import pytest
from conftest import run

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.evaluation.ablation import ablation_specs
from fairseq_headprune.heads.layout import HeadLayout
from fairseq_headprune.heads.spec import format_head_spec

LAYOUT = HeadLayout({"E": 3, "D": 3, "A": 3}, {"E": [[0, 1, 2], [1, 2]], "D": [[0]],
                                               "A": [[0, 1, 2]]})


def test_single_removes_each_present_head_once():
    specs = [format_head_spec(s) for s in ablation_specs(LAYOUT, "single", "EA")]
    assert specs == ["E:1:1", "E:1:2", "E:1:3", "E:2:2", "E:2:3", "A:1:1", "A:1:2", "A:1:3"]


def test_best_per_layer_keeps_the_top_head(tmp_path):
    path = tmp_path / "imp.json"
    path.write_text(json.dumps({"importance": {
        "E": [[0.1, 0.9, 0.2], [None, 0.3, 0.4]], "D": [[1.0, None, None]],
        "A": [[0.5, 0.4, 0.6]]}}))
    specs = [format_head_spec(s) for s in ablation_specs(LAYOUT, "best-per-layer", "EDA",
                                                         str(path))]
    assert specs == ["E:1:1,3", "E:2:2", "A:1:1,2"]  # D:1 has one head left: nothing to do


def test_errors():
    with pytest.raises(HeadPruneError, match=r"^the best-per-layer ablation needs --importance"):
        ablation_specs(LAYOUT, "best-per-layer", "E")
    with pytest.raises(HeadPruneError, match=r"^unknown ablation 'all'"):
        ablation_specs(LAYOUT, "all", "E")


def test_cli_single_on_tiny_model(headprune_checkpoint, data_dir, tmp_path):
    out = run(["fairseq-headprune", "ablate", data_dir, "--path", headprune_checkpoint,
               "--types", "A", "-o", str(tmp_path), "--max-sentences", "6",
               "--device", "cpu"]).stdout
    rows = json.loads((tmp_path / "ablation.json").read_text())["rows"]
    assert [r["spec"] for r in rows] == [""] + [f"A:{layer}:{h}" for layer in (1, 2)
                                               for h in (1, 2, 3, 4)]
    assert rows[0]["delta"] == 0.0
    assert all(r["delta"] == pytest.approx(r["bleu"] - rows[0]["bleu"], abs=0.011) for r in rows)
    assert out.splitlines()[0].startswith("unpruned")
