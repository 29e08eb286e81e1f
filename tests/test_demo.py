"""The offline demo, the Voita, DSP, GHA, head-role analysis and collaborative-attention
reproductions and the comparison of all methods (scripts/compare.sh) in their QUICK modes, end to
end (tiny model)."""

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


def test_quick_demo_and_reproductions(tmp_path):
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

    sh("scripts/reproduce/dsp_demo.sh", DEMO=demo)  # QUICK: keep 50% of the 24 heads
    dsp = os.path.join(demo, "dsp")
    with open(os.path.join(dsp, "dsp.json")) as f:
        rows = json.load(f)["rows"]
    methods = {r["method"] for r in rows}
    assert methods == {"unpruned", "control", "dsp-joint", "dsp-ste", "dsp-pipelined",
                       "dsp-pipelined-ft", "voita-top-k", "michel"}
    for r in rows:  # every method at the budget keeps exactly K = 12 heads
        kept = sum(r["heads"].values())
        assert kept == (24 if r["method"] in ("unpruned", "control") else 12), r
        assert r["signature"].startswith("nrefs:1|")
    with open(os.path.join(dsp, "dsp.csv")) as f:
        assert next(csv.reader(f))[:4] == ["label", "method", "kept_percent", "setting"]
    assert os.path.getsize(os.path.join(dsp, "dsp.png")) > 0
    runs = [os.path.join(dsp, "runs", d, "checkpoint_last.pt") for d in os.listdir(
        os.path.join(dsp, "runs"))]
    stamps = [os.stat(p).st_mtime_ns for p in runs]
    again = sh("scripts/reproduce/dsp_demo.sh", DEMO=demo)  # resumes: nothing trained again
    assert [os.stat(p).st_mtime_ns for p in runs] == stamps and len(runs) == 6
    assert "| DSP joint |" in again

    out = sh("scripts/reproduce/gha_demo.sh", DEMO=demo)  # QUICK: C = 2 of 4 heads per module
    with open(os.path.join(demo, "gha", "gha.json")) as f:
        rows = json.load(f)["rows"]
    assert [r["method"] for r in rows] == ["unpruned", "vanilla", "ght", "ght-ps"]
    assert [sum(r["heads"].values()) for r in rows] == [24, 24, 24, 12]
    assert rows[1]["params"] == rows[2]["params"] > rows[3]["params"]
    assert rows[1]["sentences_per_s"] > 0 and rows[3]["sentences_per_s"] > 0
    with open(os.path.join(demo, "gha", "votes", "ght-ps.json")) as f:
        votes = json.load(f)
    assert votes["groups"] == 2 and all(abs(sum(row) - 2) < 1e-9 for k in "EDA"
                                         for row in votes["importance"][k])
    assert "| GHT-PS | GHT, V2S, then 3 updates | 12 |" in out

    modes = sh("scripts/reproduce/importance_modes.sh", DEMO=demo)
    with open(os.path.join(demo, "importance_modes", "correlate.json")) as f:
        rows = json.load(f)["rows"]
    assert [(r["label"], r["against"]) for r in rows] == [("sentence", "token"),
                                                         ("batch", "token")]
    assert all(set(r["spearman"]) == {"E", "D", "A", "all"} for r in rows)
    assert "sentence vs token: Spearman E " in modes
    for mode in ("token", "sentence", "batch"):
        with open(os.path.join(demo, "importance_modes", f"{mode}.json")) as f:
            assert json.load(f)["absolute"] == mode

    out = sh("scripts/reproduce/analysis_demo.sh", DEMO=demo)  # QUICK: 20 sentences, LRP on 2
    with open(os.path.join(demo, "roles", "roles.json")) as f:
        roles = json.load(f)
    assert roles["sentences"] == 20 and roles["lrp"]["sentences"] == 2
    assert set(roles["overlay"]["methods"]) == {"michel", "voita", "dsp"}
    assert set(roles["correlation"]["spearman"]) == {"relevance_vs_importance",
                                                     "confidence_vs_importance"}
    for name in ("roles.csv", "overlay.png", "relevance.png", "confidence.png"):
        assert os.path.getsize(os.path.join(demo, "roles", name)) > 0, name
    assert "| relevance | " in out and "| michel | " in out

    sh("scripts/reproduce/collab_demo.sh", DEMO=demo)  # QUICK: E,D,A at D~k 32 (full) and 8
    with open(os.path.join(demo, "collab", "collab.json")) as f:
        rows = {r["label"]: r for r in json.load(f)["rows"]}
    assert set(rows) == {"unpruned", "EDA-32", "EDA-32-ft", "EDA-8", "EDA-8-ft", "control"}
    assert rows["EDA-32"]["bleu"] == rows["unpruned"]["bleu"]  # exact at the full size
    assert rows["EDA-32"]["cp_error"] == 0 and 0 < rows["EDA-8"]["cp_error"] < 1
    assert rows["EDA-8"]["params"] < rows["unpruned"]["params"] < rows["EDA-32"]["params"]
    bench = rows["EDA-8"]["bench"]
    assert [b["batch_size"] for b in bench["rows"]] == [1, 8] and bench["kv_cache_ratio"] < 1
    assert rows["EDA-32"]["bench"]["kv_cache_ratio"] > 1  # + one content bias per head

    sh("scripts/compare.sh", DEMO=demo)  # QUICK: every method at 50% of the 24 heads
    with open(os.path.join(demo, "compare", "compare.json")) as f:
        result = json.load(f)
    rows = {r["label"]: r for r in result["rows"]}
    methods = ("michel", "voita", "dsp", "gha", "collab")
    assert list(rows) == ["unpruned", "control"] + [f"{m}/50" for m in methods]
    for label, r in rows.items():
        assert r["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|")
        assert r["chrf_signature"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|")
        assert (r["significance"]["bleu"]["p_value"] is None) == (label == "unpruned")
        if label in ("unpruned", "control", "collab/50"):  # collab removes no head
            assert r["heads"] == {"E": 8, "D": 8, "A": 8}
        else:  # exactly the budget: 12 of 24 heads
            assert r["heads_kept"] == 12, r
    assert rows["gha/50"]["heads"] == {"E": 4, "D": 4, "A": 4}  # C = 2 of 4 per module
    assert rows["collab/50"]["key_dims"] == {"E": 16, "D": 16, "A": 16}  # half of d=32
    assert "QUICK smoke run" in result["config"]["note"]
    assert "|bs:200|seed:12345|" in result["config"]["significance"]["signatures"]["bleu"]
    for name in ("compare.csv", "compare.md", "compare.png"):
        assert os.path.getsize(os.path.join(demo, "compare", name)) > 0
