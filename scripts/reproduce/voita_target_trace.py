"""Target-mode traces of Voita gates (``--l0-target-heads``) from fairseq-train logs.

Usage: python scripts/reproduce/voita_target_trace.py -o DIR LABEL=TRAIN_LOG[=PRUNED.pt] ...

Reads the ``train_inner`` lines of each log (run with ``--log-interval 1`` for one per update)
and writes DIR/target_trace.csv (label, update, l0_expected_heads, l0_target, l0_lambda1,
l0_lambda2) and DIR/target_runs.json: the --note and, per label, the final expected open heads
and its miss, the largest |miss| over the last 50 and 200 updates, E[L0] every 50 updates and,
given the pruned checkpoint, the heads it kept.
"""

import argparse
import csv
import json
import os
import re
import sys

FIELDS = ("l0_expected_heads", "l0_target", "l0_lambda1", "l0_lambda2")


def trace(path):
    rows = []
    with open(path) as f:
        for line in f:
            if "| train_inner |" not in line:
                continue
            values = dict(re.findall(r"(\w+)=([-\d.e]+)", line))
            if "num_updates" in values and "l0_expected_heads" in values:
                rows.append([int(values["num_updates"])] +
                            [float(values[k]) if k in values else None for k in FIELDS])
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="LABEL=LOG[=PRUNED]")
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--note", default="", help="how the runs were made (stored in the JSON)")
    args = parser.parse_args(argv)
    os.makedirs(args.output, exist_ok=True)
    table, summary = [], {}
    for run in args.runs:
        label, log, *pruned = run.split("=")
        if not os.path.isfile(log):
            sys.exit(f"{log} is not a file: give LABEL=TRAIN_LOG[=PRUNED.pt].")
        rows = trace(log)
        if not rows:
            sys.exit(f"{log} has no train_inner lines with l0_expected_heads.")
        table += [[label] + r for r in rows]
        last, target = rows[-1], rows[-1][2]
        entry = {"updates": last[0], "final_expected_heads": last[1], "target": target,
                 "final_miss": round(last[1] - target, 3),
                 "max_abs_miss_last_50": round(max(abs(r[1] - r[2]) for r in rows[-50:]), 3),
                 "max_abs_miss_last_200": round(max(abs(r[1] - r[2]) for r in rows[-200:]), 3),
                 "expected_heads_every_50": {r[0]: r[1] for r in rows if r[0] % 50 == 0}}
        if pruned:
            from fairseq_headprune.pruning.checkpoint import checkpoint_layout, load_checkpoint
            layout = checkpoint_layout(load_checkpoint(pruned[0]))
            entry["heads_kept"] = {t: layout.count(t) for t in layout.kept}
            entry["heads_kept_total"] = layout.count()
        summary[label] = entry
    with open(os.path.join(args.output, "target_trace.csv"), "w", newline="") as f:
        csv.writer(f).writerows([["label", "update", *FIELDS]] + table)
    with open(os.path.join(args.output, "target_runs.json"), "w") as f:
        json.dump({"note": args.note, "runs": summary}, f, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
