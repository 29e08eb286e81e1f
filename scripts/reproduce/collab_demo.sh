#!/usr/bin/env bash
# Cordonnier et al. (2020) collaborative attention on the embedded demo model, in the layout of
# their translation table (BLEU against the shared key size D~k), from the converged demo
# checkpoint:
#   for each attention type set of TYPE_SETS (E, D, A alone, then all three) and each D~k of
#   the full size (heads x head_dim) divided by DIVISORS (1, 2, 4, 8):
#     collab      fairseq-headprune collab: CP re-parametrisation, no retraining;
#     collab+ft   then FT_UPDATES updates of plain fine-tuning (fairseq-train --restore-file);
#   control       the demo model fine-tuned the same FT_UPDATES updates (it is under-trained, so
#                 extra updates alone add BLEU).
# Every model: BLEU on SENTENCES test sentences, parameters and its decoding time; then
# fairseq-headprune bench of the original against each all-types model at batches BENCH_BATCHES
# (tokens/s, KV cache). Needs scripts/demo.sh's model and corpus. Every stage is skipped when its
# output exists; rerun to resume.
set -euo pipefail
cd "$(dirname "$0")/../.."
main() {  # read whole before it runs
QUICK="${QUICK:-0}"
if [ "$QUICK" = 1 ]; then
  DEMO="${DEMO:-results/demo-quick}"; SIZE="${SIZE:-tiny}"; FT_UPDATES="${FT_UPDATES:-2}"
  TYPE_SETS="${TYPE_SETS:-EDA}"; DIVISORS="${DIVISORS:-1 4}"; SENTENCES="${SENTENCES:-20}"
  BENCH_SENTENCES="${BENCH_SENTENCES:-8}"; BENCH_BATCHES="${BENCH_BATCHES:-1,8}"
  REPEATS="${REPEATS:-1}"
fi
DEMO="${DEMO:-results/demo}"              # scripts/demo.sh's output folder
SIZE="${SIZE:-small}"                     # the SIZE the demo was trained with
OUT="${OUT:-$DEMO/collab}"
TYPE_SETS="${TYPE_SETS:-E D A EDA}"       # attention types re-parametrised, one set per block
DIVISORS="${DIVISORS:-1 2 4 8}"           # D~k = full key size / divisor (the paper's 1024..128)
FT_UPDATES="${FT_UPDATES:-100}"           # fine-tuning updates after the swap (0: none)
SEED="${SEED:-0}"                         # CP initialisation
SENTENCES="${SENTENCES:-400}"             # test sentences decoded per model (BLEU)
BENCH_SENTENCES="${BENCH_SENTENCES:-200}" # sentences timed per model and round
BENCH_BATCHES="${BENCH_BATCHES:-1,64}"    # batch sizes of the timing
REPEATS="${REPEATS:-3}"                   # interleaved timing rounds (median and range kept)
PY="${PY:-python}"
. scripts/lib/demo_model.sh
demo_inputs
FULL="$("$PY" -c 'import sys, torch
a = torch.load(sys.argv[1], map_location="cpu", weights_only=False)["cfg"]["model"]
print(a.encoder_embed_dim)' "$MODEL")"  # heads x head_dim of the demo model
MANIFEST="$OUT/runs.tsv"                  # label, method, types, key size, updates: the rows
: > "$MANIFEST.new"
mkdir -p "$OUT/bench"
row() { printf '%s\t%s\t%s\t%s\t%s\n' "$@" >> "$MANIFEST.new"; }
PLAIN=(--criterion label_smoothed_cross_entropy)

n=0
for types in $TYPE_SETS; do
  for div in $DIVISORS; do
    key=$((FULL / div)); name="$types-$key"; n=$((n + 1))
    echo "== $n: $types at D~k $key (full $FULL / $div)"
    [ -f "$OUT/pruned/$name.pt" ] || fairseq-headprune collab --path "$MODEL" --key-dim "$key" \
      --types "$types" --seed "$SEED" --report "$OUT/pruned/$name.json" -o "$OUT/pruned/$name.pt"
    row "$name" collab "$types" "$key" 0
    if [ "$FT_UPDATES" -gt 0 ]; then
      demo_train "$name-ft" "$OUT/pruned/$name.pt" "$FT_UPDATES" "${PLAIN[@]}"
      [ -f "$OUT/pruned/$name-ft.pt" ] || cp "$OUT/runs/$name-ft/checkpoint_last.pt" "$OUT/pruned/$name-ft.pt"
      row "$name-ft" collab-ft "$types" "$key" "$FT_UPDATES"
    fi
  done
done
if [ "$FT_UPDATES" -gt 0 ]; then
  echo "== control: the demo model fine-tuned $FT_UPDATES updates"
  demo_train control "$MODEL" "$FT_UPDATES" "${PLAIN[@]}"
  [ -f "$OUT/pruned/control.pt" ] || cp "$OUT/runs/control/checkpoint_last.pt" "$OUT/pruned/control.pt"
  row control control EDA "$FULL" "$FT_UPDATES"
fi

echo "== BLEU of every model, decoding speed of the all-types models, table and plot"
paths=() labels=()
while IFS=$'\t' read -r label _; do labels+=("$label"); paths+=("$OUT/pruned/$label.pt"); done \
  < "$MANIFEST.new"
fairseq-headprune evaluate "$BIN" --paths "$MODEL" "${paths[@]}" \
  --labels unpruned "${labels[@]}" --max-sentences "$SENTENCES" --device "$DEVICE" \
  -o "$OUT/eval.json"
for div in $DIVISORS; do
  name="EDA-$((FULL / div))"
  [ -f "$OUT/pruned/$name.pt" ] && [ ! -f "$OUT/bench/$name.json" ] || continue
  fairseq-headprune bench "$BIN" --path "$MODEL" --pruned "$OUT/pruned/$name.pt" \
    --batch-sizes "$BENCH_BATCHES" --repeats "$REPEATS" --max-sentences "$BENCH_SENTENCES" \
    --device "$DEVICE" -o "$OUT/bench/$name.json"
done
mv "$MANIFEST.new" "$MANIFEST"
"$PY" -m fairseq_headprune.evaluation.collab_table "$OUT/eval.json" "$MANIFEST" \
  --bench "$OUT/bench" --reports "$OUT/pruned" -o "$OUT"
}
main "$@"
