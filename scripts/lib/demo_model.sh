# Sourced by scripts/demo.sh and the demo reproductions: the model options of each demo SIZE, so
# that fine-tuning (fairseq-train --restore-file) rebuilds exactly the demo's architecture.
# Sets ARCH_ARGS (structure and learning rate) and MODEL_ARGS (everything else shared);
# detect_device sets DEVICE (cuda or cpu) and DEVICE_ARGS (--cpu or nothing) from $PY's torch.
detect_device() {
  if "$PY" -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    DEVICE_ARGS=(); DEVICE=cuda
  else
    DEVICE_ARGS=(--cpu); DEVICE=cpu
  fi
}

demo_model_args() {
  case "$1" in
    small) ARCH_ARGS=(--encoder-layers 3 --decoder-layers 3 --encoder-embed-dim 128
                      --decoder-embed-dim 128 --encoder-ffn-embed-dim 512
                      --decoder-ffn-embed-dim 512 --encoder-attention-heads 8
                      --decoder-attention-heads 8 --lr 2e-3 --warmup-updates 400) ;;
    base)  ARCH_ARGS=(--encoder-layers 6 --decoder-layers 6 --encoder-attention-heads 8
                      --decoder-attention-heads 8 --lr 1e-3 --warmup-updates 1000) ;;
    tiny)  ARCH_ARGS=(--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 32
                      --decoder-embed-dim 32 --encoder-ffn-embed-dim 64
                      --decoder-ffn-embed-dim 64 --encoder-attention-heads 4
                      --decoder-attention-heads 4 --lr 2e-3 --warmup-updates 20) ;;
    *) echo "SIZE must be small, base or tiny, got '$1'" >&2; return 2 ;;
  esac
  MODEL_ARGS=(--user-dir user_dir --arch transformer_headprune --share-all-embeddings
              --dropout 0.1 --optimizer adam --adam-betas '(0.9,0.98)' --lr-scheduler inverse_sqrt
              --clip-norm 1.0 --label-smoothing 0.1 --max-tokens 4096 --seed 1
              --log-format simple --log-interval 50)
}

# A reproduction's start: device and model options of $SIZE, and the inputs scripts/demo.sh left
# in $DEMO (BIN, MODEL, IMPORTANCE; exit 2 naming a missing one); makes $OUT/runs and $OUT/pruned.
demo_inputs() {
  detect_device
  demo_model_args "$SIZE"
  BIN="$DEMO/corpus/bin"
  MODEL="$DEMO/model/checkpoint_best.pt"
  IMPORTANCE="$DEMO/importance.json"
  for f in "$MODEL" "$IMPORTANCE" "$BIN/dict.en.txt"; do
    [ -f "$f" ] || { echo "missing $f: run scripts/demo.sh first" >&2; exit 2; }
  done
  mkdir -p "$OUT/runs" "$OUT/pruned"
}

# demo_train NAME RESTORE UPDATES [fairseq-train options...]: fine-tune from RESTORE for UPDATES
# updates into $OUT/runs/NAME (optimizer, dataloader, meters and lr schedule reset), once: a
# finished run leaves $OUT/runs/NAME/done and is skipped when the script is rerun.
demo_train() {
  local name="$1" restore="$2" updates="$3"; shift 3
  local dir="$OUT/runs/$name"
  if [ ! -f "$dir/done" ]; then
    fairseq-train "$BIN" "${MODEL_ARGS[@]}" "${ARCH_ARGS[@]}" --restore-file "$restore" \
      --reset-optimizer --reset-dataloader --reset-meters --reset-lr-scheduler \
      --max-update "$updates" --save-dir "$dir" --no-epoch-checkpoints --disable-validation \
      "${DEVICE_ARGS[@]}" "$@"
    touch "$dir/done"
  fi
}
