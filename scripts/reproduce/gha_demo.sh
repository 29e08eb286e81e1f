#!/usr/bin/env bash
# Ni et al. (2023) GHA on the embedded demo model, in the layout of their Table 1 (parameters,
# BLEU, sentences/s), all from the same converged demo checkpoint:
#   vanilla   the demo model trained UPDATES more updates without the constraint (the control:
#             the demo model is under-trained, so extra updates alone move BLEU);
#   GHT       the same UPDATES updates with the group constraint (C groups per module, alpha,
#             beta, feature; the authors' IWSLT14 de-en GHT-PS settings by default);
#   GHT-PS    GHT, then Voting-to-Stay on the valid split (fairseq-headprune vote), the C most
#             voted heads of every module kept (choose --per-module C), the rest removed
#             (prune), then FT_UPDATES updates without the constraint;
#   GHT-PS w/o GC  (their Table 3 ablation) the same voting, removal and fine-tuning on vanilla.
# Decoding speed: fairseq-headprune bench, vanilla against GHT-PS, same sentences, interleaved
# repeats. Needs scripts/demo.sh's model and corpus. Every stage is skipped when its output
# exists; rerun to resume.
set -euo pipefail
cd "$(dirname "$0")/../.."
main() {  # read whole before it runs
QUICK="${QUICK:-0}"
if [ "$QUICK" = 1 ]; then
  DEMO="${DEMO:-results/demo-quick}"; SIZE="${SIZE:-tiny}"; UPDATES="${UPDATES:-4}"
  FT_UPDATES="${FT_UPDATES:-3}"; SENTENCES="${SENTENCES:-20}"; BENCH_SENTENCES="${BENCH_SENTENCES:-8}"
  BENCH_BATCH="${BENCH_BATCH:-8}"; REPEATS="${REPEATS:-1}"; ABLATION="${ABLATION:-0}"
fi
DEMO="${DEMO:-results/demo}"              # scripts/demo.sh's output folder
SIZE="${SIZE:-small}"                     # the SIZE the demo was trained with
OUT="${OUT:-$DEMO/gha}"
GROUPS_C="${GROUPS_C:-2}"                 # C: groups per module, heads kept per module
ALPHA="${ALPHA:-0.5}"                     # homogenisation weight (IWSLT14 de-en GHT-PS)
BETA="${BETA:-0.7}"                       # diversification weight (same run)
FEATURE="${FEATURE:-headout}"             # feature map clustered (the authors' default)
UPDATES="${UPDATES:-200}"                 # constraint training (and the control's) updates
FT_UPDATES="${FT_UPDATES:-200}"           # fine-tuning after the heads are removed
SENTENCES="${SENTENCES:-400}"             # test sentences decoded per model (BLEU)
BENCH_SENTENCES="${BENCH_SENTENCES:-200}" # sentences timed per model and round
BENCH_BATCH="${BENCH_BATCH:-64}"          # batch size of the timing (the paper: 256)
REPEATS="${REPEATS:-3}"                   # interleaved timing rounds (median and range kept)
ABLATION="${ABLATION:-1}"                 # 0: skip GHT-PS w/o GC (QUICK skips it)
PY="${PY:-python}"
. scripts/lib/demo_model.sh
. scripts/lib/methods.sh
demo_inputs
MANIFEST="$OUT/runs.tsv"                  # label, method, setting: the table's rows
: > "$MANIFEST.new"

row() { printf '%s\t%s\t%s\n' "$@" >> "$MANIFEST.new"; }
PLAIN=(--criterion label_smoothed_cross_entropy)
GHA=(--criterion group_constraint_label_smoothed_cross_entropy --gha-groups "$GROUPS_C"
     --gha-alpha "$ALPHA" --gha-beta "$BETA" --gha-feature "$FEATURE")

echo "== 1/5 vanilla: $UPDATES updates without the constraint"
trained vanilla "$MODEL" "$UPDATES" "${PLAIN[@]}"
row vanilla vanilla "$UPDATES updates, no constraint"

echo "== 2/5 GHT: $UPDATES updates with the group constraint (C=$GROUPS_C, $FEATURE)"
trained ght "$MODEL" "$UPDATES" "${GHA[@]}"
row ght ght "$UPDATES updates, constraint alpha $ALPHA beta $BETA"

echo "== 3/5 GHT-PS: vote, keep $GROUPS_C heads per module, remove the rest, fine-tune"
gha_vote_prune ght-ps "$OUT/pruned/ght.pt" "$GROUPS_C"
trained ght-ps "$OUT/votes/ght-ps.pt" "$FT_UPDATES" "${PLAIN[@]}"
row ght-ps ght-ps "GHT, V2S, then $FT_UPDATES updates"

if [ "$ABLATION" = 1 ]; then
  echo "== 4/5 GHT-PS w/o GC: the same voting and fine-tuning on vanilla"
  gha_vote_prune ght-ps-no-gc "$OUT/pruned/vanilla.pt" "$GROUPS_C"
  trained ght-ps-no-gc "$OUT/votes/ght-ps-no-gc.pt" "$FT_UPDATES" "${PLAIN[@]}"
  row ght-ps-no-gc ght-ps-no-gc "vanilla, V2S, then $FT_UPDATES updates"
fi

echo "== 5/5 BLEU, decoding speed, table and plot"
paths=() labels=()
while IFS=$'\t' read -r label _; do labels+=("$label"); paths+=("$OUT/pruned/$label.pt"); done \
  < "$MANIFEST.new"
fairseq-headprune evaluate "$BIN" --paths "$MODEL" "${paths[@]}" \
  --labels unpruned "${labels[@]}" --max-sentences "$SENTENCES" --device "$DEVICE" \
  -o "$OUT/eval.json"
[ -f "$OUT/bench.json" ] || fairseq-headprune bench "$BIN" --path "$OUT/pruned/vanilla.pt" \
  --pruned "$OUT/pruned/ght-ps.pt" --batch-sizes "$BENCH_BATCH" --repeats "$REPEATS" \
  --max-sentences "$BENCH_SENTENCES" --device "$DEVICE" -o "$OUT/bench.json"
mv "$MANIFEST.new" "$MANIFEST"
"$PY" -m fairseq_headprune.evaluation.gha_table "$OUT/eval.json" "$MANIFEST" \
  --bench "$OUT/bench.json" -o "$OUT"
}
main "$@"
