#!/usr/bin/env bash
# Li et al. (2021) differentiable subset pruning (DSP) on IWSLT14 de-en (DATASET=iwslt14, the
# default) or WMT14 en-de (DATASET=wmt14): the exact global budget K of heads kept, joint (gates
# trained with the model from scratch, the authors' IWSLT runs) and pipelined (logits learned
# with a converged model frozen, the hard top-K removed, then fine-tuned).
#
# Stages (each skipped when its output exists): download and prepare the data
# (scripts/lib/repro.sh: fairseq's prepare-iwslt14.sh / prepare-wmt14en2de.sh, shared with
# gha.sh and collab_wmt17_ende.sh); the baseline; for each KEEP (percent of all heads kept):
# DSP joint (prune --from-gates), DSP pipelined and its fine-tuning; BLEU of every model
# (sacrebleu on detokenised text); the paper's table beside ours.
#
# The numbers compared: DSP's own IWSLT/MNLI curves could not be read (METHODS_NOTES.md 3.9);
# the only published figures are Ni et al. (2023)'s re-run of DSP at 30M parameters (2 of 8 heads
# per module, i.e. 25 % of the heads, transformer base): 33.2 (IWSLT14 de-en) and 20.5 (WMT14
# en-de), beside their vanilla 34.4 / 27.3. Our KEEP=25 joint run stands beside that row.
# Settings: IWSLT: transformer_iwslt_de_en (512, FFN 1024, 4 heads, 6+6: 72 heads, the DSP
# paper's), fairseq's IWSLT recipe (Adam 0.9/0.98, lr 5e-4, inverse_sqrt, warm-up 4000, dropout
# 0.3, weight decay 1e-4, label smoothing 0.1, 4096 tokens, shared decoder embeddings), beam 5.
# WMT: transformer base, shared embeddings, lr 7e-4, dropout 0.1, 4096 tokens x update-freq for
# 32768 tokens per update (GHA's WMT setting), beam 4, lenpen 0.6 (IWSLT: 1). DSP: --subset-lr
# 0.2 (--pruning-lr), tau 0.1 -> 1e-8 over the run; pipelined logits 250 updates (the authors'
# README).
# Training lengths are ours (the papers give epochs or nothing): BASE_UPDATES, FT_UPDATES.
# Cost (estimate): IWSLT: 50k updates ~ 3-4 GPU hours per run; baseline + 2 per KEEP (joint,
# fine-tuning) with KEEP="25 50": about 15-20 GPU hours. WMT: 100k updates at 32k tokens ~ 20 GPU
# hours per run, about 100 in all.
set -euo pipefail
cd "$(dirname "$0")/../.."
main() {  # read whole before it runs
. scripts/lib/repro.sh
repro_defaults
. scripts/lib/methods.sh
DATASET="${DATASET:-iwslt14}"
KEEP="${KEEP:-25 50}"                     # percent of all heads kept (global K)
SUBSET_LR="${SUBSET_LR:-0.2}"
PIPE_UPDATES="${PIPE_UPDATES:-250}"
case "$DATASET" in
  iwslt14)
    NAME=dsp-iwslt14-deen; prepare_iwslt14
    BASE_UPDATES="${BASE_UPDATES:-50000}"; FT_UPDATES="${FT_UPDATES:-10000}"; BEAM="${BEAM:-5}"
    LENPEN="${LENPEN:-1}"
    COMMON=(--arch transformer_headprune_iwslt_de_en --share-decoder-input-output-embed
            --optimizer adam --adam-betas '(0.9,0.98)' --clip-norm 0.0 --lr 5e-4
            --lr-scheduler inverse_sqrt --warmup-updates 4000 --warmup-init-lr 1e-7
            --dropout 0.3 --weight-decay 0.0001 --label-smoothing 0.1 --max-tokens 4096) ;;
  wmt14)
    NAME=dsp-wmt14-ende; prepare_wmt14_en_de
    BASE_UPDATES="${BASE_UPDATES:-100000}"; FT_UPDATES="${FT_UPDATES:-20000}"; BEAM="${BEAM:-4}"
    LENPEN="${LENPEN:-0.6}"
    COMMON=(--arch transformer_headprune_wmt_en_de --share-all-embeddings
            --optimizer adam --adam-betas '(0.9,0.98)' --clip-norm 0.0 --lr 7e-4
            --lr-scheduler inverse_sqrt --warmup-updates 4000 --warmup-init-lr 1e-7
            --dropout 0.1 --label-smoothing 0.1 --max-tokens 4096
            --update-freq "$(update_freq 32768 4096)") ;;
  *) echo "DATASET must be iwslt14 or wmt14, got '$DATASET'" >&2; exit 2 ;;
esac
OUT="${OUT:-$WORK/$NAME}"
MANIFEST="$OUT/runs.tsv"
mkdir -p "$OUT"; : > "$MANIFEST.new"
PLAIN=(--criterion label_smoothed_cross_entropy)
SUBSET=(--head-gates subset --subset-lr "$SUBSET_LR" --criterion label_smoothed_cross_entropy)

echo "== 1/4 baseline ($BASE_UPDATES updates)"
baseline baseline "$BASE_UPDATES" "${COMMON[@]}" "${PLAIN[@]}"
row unpruned baseline "baseline"
TOTAL=$(heads_total "$BASELINE")

for keep in $KEEP; do
  k=$(percent_of "$keep" "$TOTAL"); [ "$k" -ge 1 ] || k=1
  echo "== 2/4 DSP joint from scratch, keep $k of $TOTAL heads ($keep %)"
  train "dsp-joint-$keep" "$BASE_UPDATES" "${COMMON[@]}" "${SUBSET[@]}" --subset-heads "$k" \
    --subset-anneal-updates "${MAX_UPDATE:-$BASE_UPDATES}"
  mkdir -p "$OUT/models"
  [ -f "$OUT/models/dsp-joint-$keep.pt" ] || fairseq-headprune prune --from-gates \
    "$OUT/runs/dsp-joint-$keep/checkpoint_last.pt" -o "$OUT/models/dsp-joint-$keep.pt"
  row "dsp-joint-$keep" "$([ "$keep" = 25 ] && echo dsp-30M || echo -)" "joint, K=$k"

  echo "== 3/4 DSP pipelined, keep $k heads: logits ($PIPE_UPDATES updates), remove, fine-tune"
  restore "dsp-pipelined-$keep" "$BASELINE" "$PIPE_UPDATES" "${COMMON[@]}" "${SUBSET[@]}" \
    --subset-heads "$k" --head-gates-only --subset-anneal-updates "${MAX_UPDATE:-$PIPE_UPDATES}"
  [ -f "$OUT/models/dsp-pipelined-$keep.pt" ] || fairseq-headprune prune --from-gates \
    "$OUT/runs/dsp-pipelined-$keep/checkpoint_last.pt" -o "$OUT/models/dsp-pipelined-$keep.pt"
  restore "dsp-pipelined-ft-$keep" "$OUT/models/dsp-pipelined-$keep.pt" "$FT_UPDATES" \
    "${COMMON[@]}" "${PLAIN[@]}"
  save_model "dsp-pipelined-ft-$keep" "$OUT/runs/dsp-pipelined-ft-$keep/checkpoint_last.pt"
  row "dsp-pipelined-ft-$keep" - "pipelined + $FT_UPDATES updates fine-tuning, K=$k"
done

echo "== 4/4 BLEU of every model; the paper's table beside ours"
evaluate_rows
table "$NAME"
}
main "$@"
