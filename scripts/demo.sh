#!/usr/bin/env bash
# The whole pipeline offline: embedded corpus -> transformer_headprune -> Michel et al. head
# importance -> pruning sweep with BLEU -> physically pruned checkpoints -> decoding benchmark.
# Every stage is skipped when its output exists; training resumes from checkpoint_last.pt.
set -euo pipefail
cd "$(dirname "$0")/.."
main() {  # read whole before it runs, so that editing this file cannot derail a running demo
# QUICK=1: the same stages on a tiny model in a few minutes (CI runs it; the numbers mean nothing)
QUICK="${QUICK:-0}"
if [ "$QUICK" = 1 ]; then
  OUT="${OUT:-results/demo-quick}"; SIZE="${SIZE:-tiny}"; VOCAB="${VOCAB:-1000}"
  SWEEP_SENTENCES="${SWEEP_SENTENCES:-20}"; BENCH_SENTENCES="${BENCH_SENTENCES:-10}"
  SWEEP_LEVELS="${SWEEP_LEVELS:-0,0.5}"; BENCH_BATCHES="${BENCH_BATCHES:-1,8}"
  TRAIN_LIMIT=(--max-update "${MAX_UPDATE:-60}")
fi
OUT="${OUT:-results/demo}"
CATALOGS="${CATALOGS:-/usr/share/locale}"
SRC="${SRC:-en}"
TGT="${TGT:-de}"
SIZE="${SIZE:-small}"                 # small: ~15 min on 2 CPU cores; base: a GPU; tiny: QUICK
TRAIN_HOURS="${TRAIN_HOURS:-0.22}"    # wall-clock cap on training
VOCAB="${VOCAB:-4000}"                # joint sentencepiece vocabulary
SWEEP_SENTENCES="${SWEEP_SENTENCES:-400}"
SWEEP_LEVELS="${SWEEP_LEVELS:-0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9}"
BENCH_SENTENCES="${BENCH_SENTENCES:-200}"
BENCH_BATCHES="${BENCH_BATCHES:-1,64}"
if [ -z "${TRAIN_LIMIT+x}" ]; then TRAIN_LIMIT=(--max-epoch 40 --stop-time-hours "$TRAIN_HOURS"); fi
PY="${PY:-python}"
. scripts/lib/demo_model.sh
detect_device
demo_model_args "$SIZE"
BIN="$OUT/corpus/bin"
MODEL="$OUT/model/checkpoint_best.pt"

echo "== 1/7 corpus ($SRC-$TGT from $CATALOGS)"
if [ ! -f "$OUT/corpus/corpus.json" ]; then
  fairseq-headprune corpus --catalogs $CATALOGS --src-lang "$SRC" --tgt-lang "$TGT" \
    --vocab-size "$VOCAB" -o "$OUT/corpus"
fi
cat "$OUT/corpus/corpus.json"

echo "== 2/7 train transformer_headprune ($SIZE, $DEVICE, at most $TRAIN_HOURS h)"
if [ ! -f "$OUT/model/done" ]; then
  fairseq-train "$BIN" "${MODEL_ARGS[@]}" "${ARCH_ARGS[@]}" \
    --criterion label_smoothed_cross_entropy "${TRAIN_LIMIT[@]}" --save-dir "$OUT/model" \
    --no-epoch-checkpoints "${DEVICE_ARGS[@]}"
  touch "$OUT/model/done"
fi

echo "== 3/7 head importance (Michel et al. 2019) on valid"
if [ ! -f "$OUT/importance.json" ]; then
  fairseq-headprune importance "$BIN" --path "$MODEL" --subset valid -o "$OUT/importance.json" \
    "${DEVICE_ARGS[@]}"
fi

echo "== 4/7 sweep: BLEU vs heads pruned (resumable)"
fairseq-headprune sweep "$BIN" --path "$MODEL" --importance "$OUT/importance.json" \
  -o "$OUT/sweep" --max-sentences "$SWEEP_SENTENCES" --levels "$SWEEP_LEVELS" \
  --save-levels 0.5 --device "$DEVICE"

echo "== 5/7 bench: unpruned vs 50% of heads physically removed"
if [ ! -f "$OUT/bench.json" ]; then
  fairseq-headprune bench "$BIN" --path "$MODEL" --pruned "$OUT/sweep/pruned_50.pt" \
    --max-sentences "$BENCH_SENTENCES" --batch-sizes "$BENCH_BATCHES" --device "$DEVICE" -o "$OUT/bench.json"
fi

echo "== 6/7 ablation: keep only the best head of one layer (Michel et al. Table 2)"
fairseq-headprune ablate "$BIN" --path "$MODEL" --mode best-per-layer \
  --importance "$OUT/importance.json" -o "$OUT/ablation" --max-sentences "$SWEEP_SENTENCES" \
  --device "$DEVICE"

echo "== 7/7 summary"
fairseq-headprune inspect --path "$OUT/sweep/pruned_50.pt" > "$OUT/pruned_50_layout.txt"
head -4 "$OUT/pruned_50_layout.txt"
"$PY" -m fairseq_headprune.evaluation.summary "$OUT"
}
main "$@"
