#!/usr/bin/env bash
# Michel et al. (2019), WMT14 en-fr: Table 1 (remove one encoder head), Table 2 (keep only the
# best head of one layer) and Figure 3 (BLEU against the share of heads pruned), on the model
# they used: fairseq's published wmt14.en-fr.joined-dict.transformer (transformer big, Ott et al.
# 2018; 288 heads), converted to transformer_headprune with `fairseq-headprune convert`.
#
# Stages (each skipped when its output exists):
#   1 download the model ($FAIR_URL/models/$MODEL_NAME.tar.bz2: model.pt, dict.{en,fr}.txt,
#     bpecodes) and WMT14 dev.tgz ($STATMT_URL/wmt14/dev.tgz: dev/newstest2009-2013.{en,fr})
#   2 newstest2009-2012 (importance, split valid; the paper's footnote) and newstest2013 (BLEU,
#     split test): normalize-punctuation, remove-non-printing-char, Moses tokenizer -a
#     (prepare-wmt14en2fr.sh), the model's bpecodes; fairseq-preprocess with the model's dicts
#   3 convert; 4 importance (batch 16, per-token |gradient|, per-layer l2 normalisation: the
#     authors' prune_wmt.sh); 5 sweep 0-90 % (all types, and each type alone); 6 ablations
#     (best-per-layer; single encoder heads if TABLE1=1); 7 the paper's table beside ours.
# Differences, stated: the paper's Table 2 keeps the best head of a layer by measured BLEU, the
# ablation here by importance; Table 1's significance test (paired bootstrap) is not run, so our
# column counts every change. BLEU: sacrebleu on Moses-detokenised text (the paper: fairseq's
# tokenised BLEU), beam 5, lenpen 1.
# Cost (estimate): no training; about 60 decodes of newstest2013 (3000 sentences) with the big
# model, plus 96 with TABLE1=1: roughly 1-3 GPU hours on one modern GPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
main() {  # read whole before it runs
. scripts/lib/repro.sh
repro_defaults
OUT="${OUT:-$WORK/michel-wmt14-enfr}"
MODEL_NAME="${MODEL_NAME:-wmt14.en-fr.joined-dict.transformer}"
SCORE_SETS="${SCORE_SETS:-newstest2009,newstest2010,newstest2011,newstest2012}"
BLEU_SET="${BLEU_SET:-newstest2013}"
LEVELS="${LEVELS:-0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9}"
CURVES="${CURVES:-all E D A}"
BATCH="${BATCH:-16}"                      # importance batch size (prune_wmt.sh)
BEAM="${BEAM:-5}"
TABLE1="${TABLE1:-1}"                     # 1: Table 1, one decode per encoder head
mkdir -p "$OUT"

echo "== 1/7 download the published model and WMT14 dev sets"
fetch "$DATA_ROOT/orig/models" "$FAIR_URL/models/$MODEL_NAME.tar.bz2"
fetch "$DATA_ROOT/orig/wmt14-dev" "$STATMT_URL/wmt14/dev.tgz"
MDIR="$DATA_ROOT/orig/models/$MODEL_NAME"
for f in model.pt dict.en.txt dict.fr.txt bpecodes; do
  [ -f "$MDIR/$f" ] || { echo "$MODEL_NAME.tar.bz2 has no $MODEL_NAME/$f" >&2; exit 2; }
done

echo "== 2/7 $SCORE_SETS (importance) and $BLEU_SET (BLEU), tokenised and BPE as the model"
TEXT="$DATA_ROOT/text/newstest.$MODEL_NAME"
[ -f "$TEXT/prepare.json" ] || "$PY" -m fairseq_headprune.data.prepare newstest \
  --orig "$DATA_ROOT/orig/wmt14-dev" -o "$TEXT" --codes "$MDIR/bpecodes" \
  --valid-sets "$SCORE_SETS" --test-set "$BLEU_SET" --workers "$WORKERS"
BIN="$DATA_ROOT/bin/newstest.$MODEL_NAME"
binarize "$TEXT" "$BIN" en fr --srcdict "$MDIR/dict.en.txt" --tgtdict "$MDIR/dict.fr.txt"

echo "== 3/7 convert to transformer_headprune (outputs unchanged)"
MODEL="$OUT/model.pt"
[ -f "$MODEL" ] || fairseq-headprune convert --path "$MDIR/model.pt" -o "$MODEL"

echo "== 4/7 head importance on $SCORE_SETS"
[ -f "$OUT/importance.json" ] || fairseq-headprune importance "$BIN" --path "$MODEL" \
  --subset valid -o "$OUT/importance.json" --batch-size "$BATCH" "${DEVICE_ARGS[@]}"

echo "== 5/7 sweep: BLEU on $BLEU_SET against the share of heads pruned (Figure 3)"
fairseq-headprune sweep "$BIN" --path "$MODEL" --importance "$OUT/importance.json" \
  -o "$OUT/sweep" --levels "$LEVELS" --curves $CURVES --beam "$BEAM" "${LIMIT[@]}" \
  --device "$DEVICE"

echo "== 6/7 ablations: best head per layer (Table 2), single encoder heads (Table 1)"
fairseq-headprune ablate "$BIN" --path "$MODEL" --mode best-per-layer \
  --importance "$OUT/importance.json" -o "$OUT/table2" --beam "$BEAM" "${LIMIT[@]}" \
  --device "$DEVICE"
SINGLE=()
if [ "$TABLE1" = 1 ]; then
  fairseq-headprune ablate "$BIN" --path "$MODEL" --mode single --types E -o "$OUT/table1" \
    --beam "$BEAM" "${LIMIT[@]}" --device "$DEVICE"
  SINGLE=(--single "$OUT/table1/ablation.json")
fi

echo "== 7/7 the paper's table beside ours"
"$PY" -m fairseq_headprune.evaluation.paper_table michel-wmt14-enfr -o "$OUT" \
  --ablation "$OUT/table2/ablation.json" "${SINGLE[@]}" --sweep "$OUT/sweep/results.json"
}
main "$@"
