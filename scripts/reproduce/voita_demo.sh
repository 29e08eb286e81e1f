#!/usr/bin/env bash
# Voita et al. (2019) on the embedded demo model (Table/Figure layout of their Sec. 6): Hard
# Concrete gates + L0 fine-tuned from the converged demo checkpoint, gating encoder
# self-attention alone (E) and then all three types (EDA), for a sweep of lambda and, in target
# mode, for the head counts the lambda runs ended with; Michel et al.'s ranking at the same head
# counts on the same checkpoint; BLEU of every pruned model; table (JSON/CSV with the sacrebleu
# signature) and plot. Needs scripts/demo.sh's model, corpus and importance. Every stage is
# skipped when its output exists; rerun to resume.
set -euo pipefail
cd "$(dirname "$0")/../.."
main() {  # read whole before it runs
QUICK="${QUICK:-0}"
if [ "$QUICK" = 1 ]; then
  DEMO="${DEMO:-results/demo-quick}"; SIZE="${SIZE:-tiny}"; LAMBDAS="${LAMBDAS:-1}"
  TYPES="${TYPES:-E EDA}"; UPDATES="${UPDATES:-10}"; SENTENCES="${SENTENCES:-20}"
  TARGET_TYPES="${TARGET_TYPES:-EDA}"; TARGETS="${TARGETS:-12}"
fi
DEMO="${DEMO:-results/demo}"              # scripts/demo.sh's output folder
SIZE="${SIZE:-small}"                     # the SIZE the demo was trained with
OUT="${OUT:-$DEMO/voita}"
LAMBDAS="${LAMBDAS:-0.05 0.5}"            # L0 lambda, the authors' convention (README)
TYPES="${TYPES:-E EDA}"                   # gated attention types, one run set per entry
TARGET_TYPES="${TARGET_TYPES:-EDA}"       # target mode (beyond the paper) for these types
TARGETS="${TARGETS:-}"                    # its head counts (default: the lambda runs' counts)
UPDATES="${UPDATES:-300}"                 # fine-tuning updates per run
GATE_LR="${GATE_LR:-0.02}"                # --head-gates-lr: gates learn faster on a short CPU run
MULTIPLIER_LR="${MULTIPLIER_LR:-0.01}"    # --l0-multiplier-lr of the target runs (CoFi's Adam ascent)
TARGET_WARMUP="${TARGET_WARMUP:-$((UPDATES / 10))}"  # --l0-target-warmup (CoFi: 2 of 20 epochs)
DAMPING="${DAMPING:-10}"                  # --l0-damping (0: CoFi's Lagrangian alone swings 8 heads off)
SENTENCES="${SENTENCES:-400}"             # test sentences decoded per model
PY="${PY:-python}"
. scripts/lib/demo_model.sh
demo_inputs
MANIFEST="$OUT/runs.tsv"                  # label, method, types, setting: the table's rows
: > "$MANIFEST.new"

finetune() {  # name types fold-option extra-criterion-args... (fold-option: - for none)
  local name="$1" types="$2" fold=(); [ "$3" = - ] || fold=("$3"); shift 3
  demo_train "$name" "$MODEL" "$UPDATES" --head-gates hard_concrete --head-gates-types "$types" \
    --head-gates-lr "$GATE_LR" --criterion l0_label_smoothed_cross_entropy "$@"
  [ -f "$OUT/pruned/$name.pt" ] || fairseq-headprune prune --from-gates \
    "$OUT/runs/$name/checkpoint_last.pt" "${fold[@]}" -o "$OUT/pruned/$name.pt"
}

counts() {  # label -> E:n,D:n,A:n of its evaluated checkpoint
  "$PY" -c 'import json,sys; r=[r for r in json.load(open(sys.argv[1]))["rows"] if r["label"]==sys.argv[2]][0]; print(",".join(f"{k}:{v}" for k,v in r["heads"].items()))' "$OUT/eval.json" "$1"
}

evaluate() {
  local paths=() labels=()
  while IFS=$'\t' read -r label _; do labels+=("$label"); paths+=("$OUT/pruned/$label.pt"); done \
    < "$MANIFEST.new"
  fairseq-headprune evaluate "$BIN" --paths "$MODEL" "${paths[@]}" \
    --labels unpruned "${labels[@]}" --max-sentences "$SENTENCES" --device "$DEVICE" \
    -o "$OUT/eval.json"
}

echo "== 0/4 control: the same fine-tuning without gates (the demo model is under-trained, so"
echo "      extra updates alone raise BLEU; compare the gated runs with this row)"
name="finetune-no-gates"
demo_train "$name" "$MODEL" "$UPDATES" --criterion label_smoothed_cross_entropy
[ -f "$OUT/pruned/$name.pt" ] || cp "$OUT/runs/$name/checkpoint_last.pt" "$OUT/pruned/$name.pt"
printf '%s\tcontrol\t-\tfine-tuned, no gates\n' "$name" >> "$MANIFEST.new"

echo "== 1/4 Voita: L0 lambda sweep"
for types in $TYPES; do
  for lambda in $LAMBDAS; do
    name="voita-$types-lambda$lambda"
    finetune "$name" "$types" - --l0-lambda "$lambda"
    printf '%s\tvoita\t%s\tlambda %s\n' "$name" "$types" "$lambda" >> "$MANIFEST.new"
  done
done
evaluate

echo "== 2/4 Voita, target mode at the lambda runs' head counts"
for types in $TARGET_TYPES; do
  targets="$TARGETS"
  if [ -z "$targets" ]; then  # the head counts of this type set's lambda runs
    for lambda in $LAMBDAS; do
      targets="$targets $(counts "voita-$types-lambda$lambda" | "$PY" -c 'import sys; t=sys.argv[1]; print(sum(int(i.split(":")[1]) for i in sys.stdin.read().strip().split(",") if i[0] in t))' "$types")"
    done
  fi
  for target in $targets; do
    gated=$("$PY" -c 'import json,sys; r=json.load(open(sys.argv[1]))["rows"]; print(sum(v for k,v in [x for x in r if x["label"]=="unpruned"][0]["heads_total"].items() if k in sys.argv[2]))' "$OUT/eval.json" "$types")
    if [ "$target" -ge "$gated" ]; then
      echo "target $target = every gated head of $types: nothing to prune, skipped"; continue
    fi
    name="voita-$types-target$target"
    # CoFi's end of target training: the rounded expected number of open gates stays
    finetune "$name" "$types" --keep-expected --l0-target-heads "$target" \
      --l0-multiplier-lr "$MULTIPLIER_LR" --l0-target-warmup "$TARGET_WARMUP" \
      --l0-damping "$DAMPING"
    printf '%s\tvoita-target\t%s\ttarget %s heads\n' "$name" "$types" "$target" >> "$MANIFEST.new"
  done
done
evaluate

echo "== 3/4 Michel et al. at the same head counts"
while IFS=$'\t' read -r label method types _; do
  [ "$method" = michel ] || [ "$method" = control ] && continue
  name="michel-at-$label"
  if [ ! -f "$OUT/pruned/$name.pt" ]; then
    fairseq-headprune choose --importance "$IMPORTANCE" --keep-per-type "$(counts "$label")" \
      -o "$OUT/pruned/$name.json"
    if "$PY" -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["spec"] else 1)' \
        "$OUT/pruned/$name.json"; then
      fairseq-headprune prune --path "$MODEL" --heads "$OUT/pruned/$name.json" \
        -o "$OUT/pruned/$name.pt"
    else  # the gated run kept every head: nothing to remove
      cp "$MODEL" "$OUT/pruned/$name.pt"
    fi
  fi
  printf '%s\tmichel\t%s\tsame heads as %s\n' "$name" "$types" "$label" >> "$MANIFEST.new"
done < <(cat "$MANIFEST.new")
evaluate
mv "$MANIFEST.new" "$MANIFEST"

echo "== 4/4 table and plot"
"$PY" -m fairseq_headprune.evaluation.head_table "$OUT/eval.json" "$MANIFEST" -o "$OUT"
}
main "$@"
