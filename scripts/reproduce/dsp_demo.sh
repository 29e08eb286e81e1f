#!/usr/bin/env bash
# Li et al. (2021) DSP on the embedded demo model, in the layout of their figures (BLEU against
# the share of heads pruned, one curve per method), all from the same converged demo checkpoint
# and at the same global budgets K (KEEP: percent of heads kept):
#   DSP joint        subset gates (Gumbel soft top-K, tau annealed 0.1 -> 1e-8) trained with the
#                    model for UPDATES updates, then the hard top-K removed (prune --from-gates);
#   DSP joint, STE   the same with --subset-ste;
#   DSP pipelined    the model frozen (--head-gates-only), logits learned for PIPE_UPDATES
#                    updates, hard top-K removed; then "+ fine-tune": the pruned model trained
#                    UPDATES more updates (the paper's last stage; the authors' README stops before);
#   Voita, top-K     one Hard Concrete + L0 run (VOITA_LAMBDA), the K largest evaluation gates
#                    kept (the DSP fork's generate_voita.py --num-of-heads K);
#   Michel           the demo's importance, K most important heads kept, no fine-tuning.
# A control row fine-tunes the model UPDATES updates without gates (the demo model is
# under-trained, so extra updates alone move BLEU). Needs scripts/demo.sh's model, corpus and
# importance. Every stage is skipped when its output exists; rerun to resume.
set -euo pipefail
cd "$(dirname "$0")/../.."
main() {  # read whole before it runs
QUICK="${QUICK:-0}"
if [ "$QUICK" = 1 ]; then
  DEMO="${DEMO:-results/demo-quick}"; SIZE="${SIZE:-tiny}"; KEEP="${KEEP:-50}"
  UPDATES="${UPDATES:-6}"; PIPE_UPDATES="${PIPE_UPDATES:-4}"; SENTENCES="${SENTENCES:-20}"
fi
DEMO="${DEMO:-results/demo}"              # scripts/demo.sh's output folder
SIZE="${SIZE:-small}"                     # the SIZE the demo was trained with
OUT="${OUT:-$DEMO/dsp}"
KEEP="${KEEP:-25 50 75}"                  # percent of all heads kept (the global budget K)
UPDATES="${UPDATES:-200}"                 # joint training / fine-tuning updates per run
PIPE_UPDATES="${PIPE_UPDATES:-100}"       # pipelined logit learning (the authors: 250, 1 epoch)
SUBSET_LR="${SUBSET_LR:-0.2}"             # --subset-lr, the authors' --pruning-lr
VOITA_LAMBDA="${VOITA_LAMBDA:-0.05}"      # L0 lambda of the Voita baseline run
GATE_LR="${GATE_LR:-0.02}"                # --head-gates-lr of the Voita run (as voita_demo.sh)
SENTENCES="${SENTENCES:-400}"             # test sentences decoded per model
PY="${PY:-python}"
. scripts/lib/demo_model.sh
. scripts/lib/methods.sh
demo_inputs
MANIFEST="$OUT/runs.tsv"                  # label, method, percent kept, setting: the table's rows
: > "$MANIFEST.new"
TOTAL=$(heads_total "$MODEL")
heads() { percent_of "$1" "$TOTAL"; }

row() { printf '%s\t%s\t%s\t%s\n' "$@" >> "$MANIFEST.new"; }

echo "== 0/5 control: the same fine-tuning without gates"
trained finetune-no-gates "$MODEL" "$UPDATES" --criterion label_smoothed_cross_entropy
row finetune-no-gates control - "fine-tuned $UPDATES updates, no gates"

SUBSET=(--head-gates subset --subset-lr "$SUBSET_LR" --criterion label_smoothed_cross_entropy)
for keep in $KEEP; do
  k=$(heads "$keep")
  echo "== 1/5 DSP joint and STE, keep $k heads ($keep%)"
  demo_train "dsp-joint-$keep" "$MODEL" "$UPDATES" "${SUBSET[@]}" --subset-heads "$k" \
    --subset-anneal-updates "$UPDATES"
  from_gates "dsp-joint-$keep" "dsp-joint-$keep"
  row "dsp-joint-$keep" dsp-joint "$keep" "joint, $UPDATES updates"
  demo_train "dsp-ste-$keep" "$MODEL" "$UPDATES" "${SUBSET[@]}" --subset-heads "$k" --subset-ste
  from_gates "dsp-ste-$keep" "dsp-ste-$keep"
  row "dsp-ste-$keep" dsp-ste "$keep" "joint STE, $UPDATES updates"

  echo "== 2/5 DSP pipelined, keep $k heads ($keep%)"
  demo_train "dsp-pipelined-$keep" "$MODEL" "$PIPE_UPDATES" "${SUBSET[@]}" --subset-heads "$k" \
    --head-gates-only --subset-anneal-updates "$PIPE_UPDATES"
  from_gates "dsp-pipelined-$keep" "dsp-pipelined-$keep"
  row "dsp-pipelined-$keep" dsp-pipelined "$keep" "logits $PIPE_UPDATES updates, model frozen"
  trained "dsp-pipelined-ft-$keep" "$OUT/pruned/dsp-pipelined-$keep.pt" "$UPDATES" \
    --criterion label_smoothed_cross_entropy
  row "dsp-pipelined-ft-$keep" dsp-pipelined-ft "$keep" "then $UPDATES updates fine-tuning"
done

echo "== 3/5 Voita: one Hard Concrete run, the K largest gates kept"
demo_train voita "$MODEL" "$UPDATES" --head-gates hard_concrete --head-gates-lr "$GATE_LR" \
  --criterion l0_label_smoothed_cross_entropy --l0-lambda "$VOITA_LAMBDA"
for keep in $KEEP; do
  from_gates "voita-top-k-$keep" voita --keep-heads "$(heads "$keep")"
  row "voita-top-k-$keep" voita-top-k "$keep" "lambda $VOITA_LAMBDA, $UPDATES updates"
done

echo "== 4/5 Michel et al.: the K most important heads, no fine-tuning"
for keep in $KEEP; do
  name="michel-$keep"
  michel_keep "$name" "$(heads "$keep")"
  row "$name" michel "$keep" "importance of the demo, one shot"
done

echo "== 5/5 BLEU of every model, table and plot"
paths=() labels=()
while IFS=$'\t' read -r label _; do labels+=("$label"); paths+=("$OUT/pruned/$label.pt"); done \
  < "$MANIFEST.new"
fairseq-headprune evaluate "$BIN" --paths "$MODEL" "${paths[@]}" \
  --labels unpruned "${labels[@]}" --max-sentences "$SENTENCES" --device "$DEVICE" \
  -o "$OUT/eval.json"
mv "$MANIFEST.new" "$MANIFEST"
"$PY" -m fairseq_headprune.evaluation.budget_table "$OUT/eval.json" "$MANIFEST" -o "$OUT"
}
main "$@"
