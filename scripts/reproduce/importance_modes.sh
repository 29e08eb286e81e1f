#!/usr/bin/env bash
# Michel et al. importance of the demo model with the absolute value taken per token (the
# authors' code, default), per sentence (the paper's equation) and per batch, and how much the
# head rankings differ: Spearman's rho per attention type against token (correlate.txt/.json).
# Needs scripts/demo.sh's model and corpus; every file is skipped when it exists.
set -euo pipefail
cd "$(dirname "$0")/../.."
main() {  # read whole before it runs
QUICK="${QUICK:-0}"
[ "$QUICK" = 1 ] && DEMO="${DEMO:-results/demo-quick}"
DEMO="${DEMO:-results/demo}"
OUT="${OUT:-$DEMO/importance_modes}"
SUBSET="${SUBSET:-valid}"
PY="${PY:-python}"
. scripts/lib/demo_model.sh
detect_device
MODEL="$DEMO/model/checkpoint_best.pt"
[ -f "$MODEL" ] || { echo "missing $MODEL: run scripts/demo.sh first" >&2; exit 2; }
mkdir -p "$OUT"
for mode in token sentence batch; do
  [ -f "$OUT/$mode.json" ] || fairseq-headprune importance "$DEMO/corpus/bin" --path "$MODEL" \
    --subset "$SUBSET" --abs "$mode" -o "$OUT/$mode.json" "${DEVICE_ARGS[@]}"
done
fairseq-headprune correlate --importance "$OUT"/{token,sentence,batch}.json \
  --labels token sentence batch -o "$OUT/correlate.json" > "$OUT/correlate.txt.new"
{ echo "\$ bash scripts/reproduce/importance_modes.sh   # $SUBSET subset of the demo corpus"
  cat "$OUT/correlate.txt.new"; } > "$OUT/correlate.txt"
rm "$OUT/correlate.txt.new"
cat "$OUT/correlate.txt"
}
main "$@"
