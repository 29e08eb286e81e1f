"""The offline demo and the Voita reproduction in their QUICK modes, end to end (tiny model)."""

import csv
import json
import os
import subprocess
import sys

from conftest import BIN, REPO


def sh(script, **env):
    proc = subprocess.run(["bash", os.path.join(REPO, script)], capture_output=True, text=True,
                          env={**os.environ, "PATH": BIN + os.pathsep + os.environ["PATH"],
                               "PY": sys.executable, "QUICK": "1", **env})
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_quick_demo_and_voita_reproduction(tmp_path):
    demo = str(tmp_path / "demo")
    out = sh("scripts/demo.sh", OUT=demo)
    assert "== 7/7 summary" in out
    with open(os.path.join(demo, "sweep", "results.json")) as f:
        sweep = json.load(f)
    assert sorted((r["curve"], r["level"]) for r in sweep["rows"]) == sorted(
        (c, lv) for c in ("all", "E", "D", "A") for lv in (0.0, 0.5))
    assert all(r["signature"].startswith("nrefs:1|") for r in sweep["rows"])
    for name in ("bench.json", "importance.json", "ablation/ablation.json", "summary.md",
                 "sweep/pruned_50.pt", "sweep/bleu_vs_pruned.png"):
        assert os.path.getsize(os.path.join(demo, name)) > 0, name

    sh("scripts/reproduce/voita_demo.sh", DEMO=demo)
    voita = os.path.join(demo, "voita")
    with open(os.path.join(voita, "voita.json")) as f:
        rows = json.load(f)["rows"]
    labels = [r["label"] for r in rows]
    assert labels[0] == "unpruned" and rows[0]["heads"] == {"E": 8, "D": 8, "A": 8}
    assert {"voita-E-lambda1", "voita-EDA-lambda1", "michel-at-voita-E-lambda1"} <= set(labels)
    assert any(r["method"] == "voita-target" for r in rows)
    for r in rows:
        if r["method"] == "michel":  # the same head counts as the run it is compared with
            twin = next(t for t in rows if t["label"] == r["label"][len("michel-at-"):])
            assert r["heads"] == twin["heads"]
        if r["types"] == "E":  # only encoder heads were gated
            assert r["heads"]["D"] == 8 and r["heads"]["A"] == 8
    with open(os.path.join(voita, "voita.csv")) as f:
        assert next(csv.reader(f))[:5] == ["label", "method", "types", "setting", "E"]
    assert os.path.getsize(os.path.join(voita, "voita.png")) > 0
    sh("scripts/reproduce/voita_demo.sh", DEMO=demo)  # resumes: every stage already done
