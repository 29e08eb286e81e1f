# Sourced by scripts/reproduce/*_{wmt,iwslt}*.sh: the settings and stages the paper
# reproductions share. Every path and URL base is an environment variable; every stage is
# skipped when its output exists (a finished stage leaves a `done` file or its output).
#
#   WORK          results root (default results/reproduce); DATA_ROOT (default $WORK/data) holds
#                 downloads (orig/), prepared text (text/) and fairseq data-bins (bin/), shared
#                 by the papers that use the same data
#   FAIR_URL      https://dl.fbaipublicfiles.com/fairseq   (IWSLT14 archive, published models)
#   STATMT_URL    http://statmt.org                        (WMT13/14 archives)
#   STATMT_DATA_URL http://data.statmt.org                 (WMT17 archives)
#   GPUS          GPUs per training run (--distributed-world-size; default 1)
#   FP16          1: --fp16 in training (default 1 on CUDA, 0 on CPU)
#   WORKERS       processes for tokenisation/BPE and fairseq-preprocess (default 4)
#   MAX_UPDATE    overrides every training run's update count (tiny test runs)
#   BPE_MERGES    overrides the recipe's BPE merges (tiny test runs)
#   SENTENCES     decode only the first N test sentences (default: all)
#   BEAM, LENPEN  beam size and fairseq's length penalty of the BLEU stage (each script sets the
#                 paper's; LENPEN default 1)
#   ARCH_OVERRIDES  fairseq-train model options appended to the paper's (tiny test models)
#   BASELINE      a trained checkpoint to start from instead of training the paper's baseline

repro_defaults() {
  PY="${PY:-python}"
  WORK="${WORK:-results/reproduce}"
  DATA_ROOT="${DATA_ROOT:-$WORK/data}"
  FAIR_URL="${FAIR_URL:-https://dl.fbaipublicfiles.com/fairseq}"
  STATMT_URL="${STATMT_URL:-http://statmt.org}"
  STATMT_DATA_URL="${STATMT_DATA_URL:-http://data.statmt.org}"
  GPUS="${GPUS:-1}"
  WORKERS="${WORKERS:-4}"
  MAX_UPDATE="${MAX_UPDATE:-}"
  BPE_MERGES="${BPE_MERGES:-}"
  SENTENCES="${SENTENCES:-}"
  read -r -a OVERRIDES <<< "${ARCH_OVERRIDES:-}"
  . scripts/lib/demo_model.sh
  detect_device
  if [ "$DEVICE" = cuda ]; then FP16="${FP16:-1}"; else FP16="${FP16:-0}"; fi
  TRAIN_DEVICE=("${DEVICE_ARGS[@]}")
  if [ "$DEVICE" = cuda ]; then
    TRAIN_DEVICE+=(--distributed-world-size "$GPUS")
    [ "$FP16" = 1 ] && TRAIN_DEVICE+=(--fp16)
  fi
  LIMIT=(); [ -n "$SENTENCES" ] && LIMIT=(--max-sentences "$SENTENCES")
  MERGES=(); [ -n "$BPE_MERGES" ] && MERGES=(--merges "$BPE_MERGES")
  return 0
}

# update_freq TOKENS MAX_TOKENS: the --update-freq that gives TOKENS per update on $GPUS GPUs
update_freq() {
  "$PY" -c 'import sys; t, m, g = map(int, sys.argv[1:]); print(max(1, round(t / (m * g))))' \
    "$1" "$2" "$GPUS"
}

# fetch DIR URL...: download (to NAME.part, then renamed) and unpack each archive once
fetch() {
  local dir="$1"; shift
  "$PY" -m fairseq_headprune.data.download -o "$dir" --extract "$@" > /dev/null
}

# binarize TEXT BIN SRC TGT [fairseq-preprocess options...]: the splits TEXT has, once
binarize() {
  local text="$1" bin="$2" src="$3" tgt="$4"; shift 4
  [ -f "$bin/done" ] && return 0
  local prefs=()
  for split in train valid test; do
    [ -f "$text/$split.$src" ] && prefs+=("--${split}pref" "$text/$split")
  done
  fairseq-preprocess --source-lang "$src" --target-lang "$tgt" "${prefs[@]}" \
    --destdir "$bin" --workers "$WORKERS" "$@"
  touch "$bin/done"
}

# prepare_iwslt14 [gha]: fairseq's prepare-iwslt14.sh (gha: GHA's copy, compounds split into
# ##AT##-##AT##); separate dictionaries, as fairseq's IWSLT14 recipe; sets BIN
prepare_iwslt14() {
  local name=iwslt14.tokenized.de-en opts=()
  [ "${1:-}" = gha ] && { name="$name.gha"; opts=(--split-compounds); }
  fetch "$DATA_ROOT/orig/iwslt14" "$FAIR_URL/data/iwslt14/de-en.tgz"
  [ -f "$DATA_ROOT/text/$name/prepare.json" ] || "$PY" -m fairseq_headprune.data.prepare \
    iwslt14 --orig "$DATA_ROOT/orig/iwslt14" -o "$DATA_ROOT/text/$name" "${MERGES[@]}" \
    --workers "$WORKERS" "${opts[@]}"
  BIN="$DATA_ROOT/bin/$name"
  binarize "$DATA_ROOT/text/$name" "$BIN" de en
}

# prepare_wmt14_en_de [gha]: fairseq's prepare-wmt14en2de.sh, News Commentary v12 unless NC=v9
# (fairseq's default wmt17_en_de, or its --icml17 wmt14_en_de; gha: GHA's copy, valid
# newstest2013 and ##AT## compounds); joined dictionary, as fairseq's WMT recipe; sets BIN
prepare_wmt14_en_de() {
  local nc="${NC:-v12}" name nc_url opts=()
  if [ "$nc" = v9 ]; then
    name=wmt14_en_de; nc_url="$STATMT_URL/wmt14/training-parallel-nc-v9.tgz"
  else
    name=wmt17_en_de; nc_url="$STATMT_DATA_URL/wmt17/translation-task/training-parallel-nc-v12.tgz"
  fi
  [ "${1:-}" = gha ] && { name="$name.gha"; opts=(--valid newstest2013 --split-compounds); }
  fetch "$DATA_ROOT/orig/wmt" "$STATMT_URL/wmt13/training-parallel-europarl-v7.tgz" \
    "$STATMT_URL/wmt13/training-parallel-commoncrawl.tgz" "$nc_url" \
    "$STATMT_DATA_URL/wmt17/translation-task/dev.tgz" "$STATMT_URL/wmt14/test-full.tgz"
  [ -f "$DATA_ROOT/text/$name/prepare.json" ] || "$PY" -m fairseq_headprune.data.prepare \
    wmt14-en-de --orig "$DATA_ROOT/orig/wmt" -o "$DATA_ROOT/text/$name" --nc "$nc" \
    "${MERGES[@]}" --workers "$WORKERS" "${opts[@]}"
  BIN="$DATA_ROOT/bin/$name"
  binarize "$DATA_ROOT/text/$name" "$BIN" en de --joined-dictionary
}

# train NAME UPDATES [fairseq-train options...]: a run into $OUT/runs/NAME, once (a finished run
# leaves done; an interrupted one resumes from its checkpoint_last.pt). MAX_UPDATE overrides
# UPDATES. The model is $OUT/runs/NAME/checkpoint_last.pt.
train() {
  local name="$1" updates="${MAX_UPDATE:-$2}"; shift 2
  local dir="$OUT/runs/$name"
  [ -f "$dir/done" ] && return 0
  fairseq-train "$BIN" --user-dir user_dir --max-update "$updates" --save-dir "$dir" \
    --no-epoch-checkpoints --log-format simple --log-interval 100 "${TRAIN_DEVICE[@]}" "$@" \
    "${OVERRIDES[@]}"
  touch "$dir/done"
}

# restore NAME FROM UPDATES [options...]: train NAME starting from the checkpoint FROM
restore() {
  local name="$1" from="$2" updates="$3"; shift 3
  train "$name" "$updates" --restore-file "$from" --reset-optimizer --reset-dataloader \
    --reset-meters --reset-lr-scheduler "$@"
}

# evaluate_rows: BLEU (sacrebleu) of $BASELINE (label unpruned) and of every other checkpoint of
# $MANIFEST.new into $OUT/eval.json
evaluate_rows() {
  local paths=("$BASELINE") labels=(unpruned)
  while IFS=$'\t' read -r label _; do
    [ "$label" = unpruned ] || { labels+=("$label"); paths+=("$OUT/models/$label.pt"); }
  done < "$MANIFEST.new"
  fairseq-headprune evaluate "$BIN" --paths "${paths[@]}" --labels "${labels[@]}" \
    --beam "$BEAM" --lenpen "${LENPEN:-1}" "${LIMIT[@]}" --device "$DEVICE" -o "$OUT/eval.json"
}

# save_model LABEL FILE: our model LABEL is FILE (copied once into $OUT/models)
save_model() {
  mkdir -p "$OUT/models"
  [ -f "$OUT/models/$1.pt" ] || cp "$2" "$OUT/models/$1.pt"
}

# row LABEL PAPER-ROW SETTING: one line of the manifest the table reads
row() { printf '%s\t%s\t%s\n' "$@" >> "$MANIFEST.new"; }

# baseline NAME UPDATES [options...]: $BASELINE is the given BASELINE checkpoint, or the run NAME
baseline() {
  if [ -n "${BASELINE:-}" ]; then
    [ -f "$BASELINE" ] || { echo "BASELINE=$BASELINE does not exist" >&2; exit 2; }
    return 0
  fi
  train "$@"
  BASELINE="$OUT/runs/$1/checkpoint_last.pt"
}

# table NAME: the paper's table beside ours, from $OUT/eval.json and the manifest
table() {
  mv "$MANIFEST.new" "$MANIFEST"
  "$PY" -m fairseq_headprune.evaluation.paper_table "$1" --eval "$OUT/eval.json" \
    --manifest "$MANIFEST" -o "$OUT"
}
