#!/usr/bin/env bash
# The whole pipeline offline: embedded corpus -> transformer_headprune -> Michel et al. head
# importance -> pruning sweep with BLEU -> physically pruned checkpoints -> decoding benchmark.
# Every stage is skipped when its output exists; training resumes from checkpoint_last.pt.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-results/demo}"
CATALOGS="${CATALOGS:-/usr/share/locale}"
SRC="${SRC:-en}"
TGT="${TGT:-de}"
SIZE="${SIZE:-small}"                 # small: ~15 min on 2 CPU cores; base: a GPU
TRAIN_HOURS="${TRAIN_HOURS:-0.22}"    # wall-clock cap on training
VOCAB="${VOCAB:-4000}"                # joint sentencepiece vocabulary
SWEEP_SENTENCES="${SWEEP_SENTENCES:-400}"
BENCH_SENTENCES="${BENCH_SENTENCES:-200}"
PY="${PY:-python}"
if "$PY" -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  DEVICE_ARGS=(); DEVICE=cuda
else
  DEVICE_ARGS=(--cpu); DEVICE=cpu
fi
case "$SIZE" in
  small) ARCH_ARGS=(--encoder-layers 3 --decoder-layers 3 --encoder-embed-dim 128
                    --decoder-embed-dim 128 --encoder-ffn-embed-dim 512
                    --decoder-ffn-embed-dim 512 --encoder-attention-heads 8
                    --decoder-attention-heads 8 --lr 2e-3 --warmup-updates 400) ;;
  base)  ARCH_ARGS=(--encoder-layers 6 --decoder-layers 6 --encoder-attention-heads 8
                    --decoder-attention-heads 8 --lr 1e-3 --warmup-updates 1000) ;;
  *) echo "SIZE must be small or base, got '$SIZE'" >&2; exit 2 ;;
esac
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
  fairseq-train "$BIN" --user-dir user_dir --arch transformer_headprune "${ARCH_ARGS[@]}" \
    --share-all-embeddings --dropout 0.1 --optimizer adam --adam-betas '(0.9,0.98)' \
    --lr-scheduler inverse_sqrt --clip-norm 1.0 \
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens 4096 \
    --max-epoch 40 --stop-time-hours "$TRAIN_HOURS" --save-dir "$OUT/model" \
    --no-epoch-checkpoints --log-format simple --log-interval 50 --seed 1 "${DEVICE_ARGS[@]}"
  touch "$OUT/model/done"
fi

echo "== 3/7 head importance (Michel et al. 2019) on valid"
if [ ! -f "$OUT/importance.json" ]; then
  fairseq-headprune importance "$BIN" --path "$MODEL" --subset valid -o "$OUT/importance.json" \
    "${DEVICE_ARGS[@]}"
fi

echo "== 4/7 sweep: BLEU vs heads pruned (resumable)"
fairseq-headprune sweep "$BIN" --path "$MODEL" --importance "$OUT/importance.json" \
  -o "$OUT/sweep" --max-sentences "$SWEEP_SENTENCES" --save-levels 0.2,0.5 --device "$DEVICE"

echo "== 5/7 bench: unpruned vs 50% of heads physically removed"
if [ ! -f "$OUT/bench.json" ]; then
  fairseq-headprune bench "$BIN" --path "$MODEL" --pruned "$OUT/sweep/pruned_50.pt" \
    --max-sentences "$BENCH_SENTENCES" --batch-sizes 1,64 --device "$DEVICE" -o "$OUT/bench.json"
fi

echo "== 6/7 ablation: keep only the best head of one layer (Michel et al. Table 2)"
fairseq-headprune ablate "$BIN" --path "$MODEL" --mode best-per-layer \
  --importance "$OUT/importance.json" -o "$OUT/ablation" --max-sentences "$SWEEP_SENTENCES" \
  --device "$DEVICE"

echo "== 7/7 summary"
fairseq-headprune inspect --path "$OUT/sweep/pruned_50.pt" > "$OUT/pruned_50_layout.txt"
head -4 "$OUT/pruned_50_layout.txt"
"$PY" -m fairseq_headprune.evaluation.summary "$OUT"
