#!/usr/bin/env bash
# Voita et al. (2019) head roles of the demo model (Sec. 4-5 of their paper): confidence, LRP
# relevance, positional and rare-word heads (syntactic ones too with CONLLU=parses of the
# subset's source side), the rank correlation of relevance and confidence with Michel et al.'s
# importance, and the overlay of the heads each method keeps (Michel at OVERLAY_KEEP, and the
# Voita and DSP pruned models when their reproductions have run), coloured by role.
# Needs scripts/demo.sh's model, corpus and importance; skipped when roles.json exists.
set -euo pipefail
cd "$(dirname "$0")/../.."
main() {  # read whole before it runs
QUICK="${QUICK:-0}"
if [ "$QUICK" = 1 ]; then
  DEMO="${DEMO:-results/demo-quick}"; SENTENCES="${SENTENCES:-20}"
  LRP_SENTENCES="${LRP_SENTENCES:-2}"; MIN_TOKENS="${MIN_TOKENS:-10}"
fi
DEMO="${DEMO:-results/demo}"              # scripts/demo.sh's output folder
OUT="${OUT:-$DEMO/roles}"
SUBSET="${SUBSET:-valid}"
SENTENCES="${SENTENCES:-500}"             # sentences for the attention measures
LRP_SENTENCES="${LRP_SENTENCES:-100}"     # sentences for LRP (one at a time, the slow part)
MIN_TOKENS="${MIN_TOKENS:-100}"
OVERLAY_KEEP="${OVERLAY_KEEP:-0.5}"       # heads Michel's ranking keeps in the overlay
CONLLU="${CONLLU:-}"                      # optional parses of the subset's source side
PY="${PY:-python}"
. scripts/lib/demo_model.sh
detect_device
MODEL="$DEMO/model/checkpoint_best.pt"
IMPORTANCE="$DEMO/importance.json"
for f in "$MODEL" "$IMPORTANCE"; do
  [ -f "$f" ] || { echo "missing $f: run scripts/demo.sh first" >&2; exit 2; }
done
overlays=(--overlay "michel=$IMPORTANCE")
for pattern in "voita=$DEMO/voita/pruned/voita-EDA-*.pt" "dsp=$DEMO/dsp/pruned/dsp-joint-*.pt"; do
  for f in ${pattern#*=}; do
    if [ -f "$f" ]; then overlays+=(--overlay "${pattern%%=*}=$f"); break; fi
  done
done
syntax=()
[ -z "$CONLLU" ] || syntax=(--conllu "$CONLLU")

echo "== head roles of $MODEL ($SUBSET)"
if [ ! -f "$OUT/roles.json" ]; then
  fairseq-headprune analyze "$DEMO/corpus/bin" --path "$MODEL" --subset "$SUBSET" \
    --max-sentences "$SENTENCES" --lrp-sentences "$LRP_SENTENCES" --min-tokens "$MIN_TOKENS" \
    --importance "$IMPORTANCE" "${overlays[@]}" --overlay-keep "$OVERLAY_KEEP" \
    "${syntax[@]}" --device "$DEVICE" -o "$OUT"
fi
"$PY" -m fairseq_headprune.evaluation.roles_table "$OUT/roles.json"
}
main "$@"
