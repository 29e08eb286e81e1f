#!/usr/bin/env bash
# Every method of this plugin on one converged checkpoint (scripts/demo.sh's model) at the same
# budgets, KEEP percent of all heads kept (all attention types), then fairseq-headprune compare:
#   michel   Michel et al. (2019): the K most important heads (the demo's importance, one global
#            ranking), the others removed;
#   voita    Voita et al. (2019): Hard Concrete gates + L0 on all types, target mode
#            (--l0-target-heads K) for UPDATES updates, then the K most open gates kept
#            (prune --from-gates --keep-heads K: exactly K);
#   dsp      Li et al. (2021) DSP joint: subset gates with exactly K heads, trained with the model
#            UPDATES updates, the top-K kept (prune --from-gates);
#   gha      Ni et al. (2023): the group constraint with C = KEEP% of each module's heads groups
#            for UPDATES updates, Voting-to-Stay, the C most voted heads of every module kept;
#   collab   Cordonnier et al. (2020): collaborative attention on all types with a shared key
#            size of KEEP% of the full one (heads x head_dim); it removes no head.
# Then every one of them is fine-tuned FT_UPDATES updates (plain cross-entropy, the same for all
# methods), and a control fine-tunes the unpruned model UPDATES + FT_UPDATES updates (the most any
# run gets; the demo model is under-trained, so extra updates alone move BLEU). Michel and collab
# need no training to choose, so they get FT_UPDATES only. compare: BLEU and chrF with sacrebleu's
# paired bootstrap against the unpruned model, heads, parameters, file size, decoding speed.
# Needs scripts/demo.sh's model, corpus and importance. Every stage is skipped when its output
# exists; rerun to resume.
set -euo pipefail
cd "$(dirname "$0")/.."
main() {  # read whole before it runs
QUICK="${QUICK:-0}"
if [ "$QUICK" = 1 ]; then
  DEMO="${DEMO:-results/demo-quick}"; SIZE="${SIZE:-tiny}"; KEEP="${KEEP:-50}"
  UPDATES="${UPDATES:-3}"; FT_UPDATES="${FT_UPDATES:-0}"; SENTENCES="${SENTENCES:-20}"
  BENCH_SENTENCES="${BENCH_SENTENCES:-8}"; BENCH_BATCHES="${BENCH_BATCHES:-8}"
  REPEATS="${REPEATS:-1}"; BOOTSTRAP="${BOOTSTRAP:-200}"
fi
DEMO="${DEMO:-results/demo}"              # scripts/demo.sh's output folder
SIZE="${SIZE:-small}"                     # the SIZE the demo was trained with
OUT="${OUT:-$DEMO/compare}"
KEEP="${KEEP:-25 50 75}"                  # percent of all heads kept (collab: of the key size)
METHODS="${METHODS:-michel voita dsp gha collab}"
UPDATES="${UPDATES:-200}"                 # gate / constraint training of voita, dsp, gha
FT_UPDATES="${FT_UPDATES:-200}"           # fine-tuning of every pruned model (0: none)
FT_LR="${FT_LR:-5e-4}"                    # every run of this script: fixed lr FT_LR after a
FT_WARMUP="${FT_WARMUP:-40}"              # linear warm-up of FT_WARMUP updates (see below)
GATE_LR="${GATE_LR:-0.02}"                # voita's --head-gates-lr (as voita_demo.sh)
MULTIPLIER_LR="${MULTIPLIER_LR:-0.01}"    # voita's --l0-multiplier-lr (as voita_demo.sh)
TARGET_WARMUP="${TARGET_WARMUP:-$((UPDATES / 10))}"  # voita's --l0-target-warmup (as voita_demo.sh)
DAMPING="${DAMPING:-10}"                  # voita's --l0-damping (as voita_demo.sh)
SUBSET_LR="${SUBSET_LR:-0.2}"             # dsp's --subset-lr (as dsp_demo.sh)
ALPHA="${ALPHA:-0.5}"; BETA="${BETA:-0.7}"; FEATURE="${FEATURE:-headout}"  # gha (as gha_demo.sh)
SENTENCES="${SENTENCES:-400}"             # test sentences decoded per model
BENCH_SENTENCES="${BENCH_SENTENCES:-200}" # sentences timed per model and round
BENCH_BATCHES="${BENCH_BATCHES:-64}"      # batch sizes of the timing (1,64 adds batch 1: about
                                          # 4 minutes a run on 2 CPU cores)
REPEATS="${REPEATS:-3}"                   # interleaved timing rounds (median and range kept)
BOOTSTRAP="${BOOTSTRAP:-1000}"            # paired bootstrap resamples
PY="${PY:-python}"
. scripts/lib/demo_model.sh
. scripts/lib/methods.sh
demo_inputs
START=$SECONDS
FRESH=1; [ -n "$(ls -A "$OUT/runs")" ] && FRESH=0
mkdir -p "$OUT/final"
read -r TOTAL HEADS FULL < <("$PY" -c 'import sys
from fairseq_headprune.pruning.checkpoint import checkpoint_layout, load_checkpoint, model_args
state = load_checkpoint(sys.argv[1]); a = model_args(state)
assert a.encoder_attention_heads == a.decoder_attention_heads, "GHA budgets need equal heads"
print(checkpoint_layout(state).count(), a.encoder_attention_heads, a.encoder_embed_dim)' \
  "$MODEL" 2>/dev/null)
# The demo's own schedule (inverse_sqrt, warm-up 400 to lr 2e-3) restarted on the converged
# model climbs back to 2e-3, twice the lr the demo ended at, and costs the unpruned model about
# 4 BLEU in 400 updates; every run here trains at a fixed FT_LR instead (measured: the control
# gains about 1 BLEU with 5e-4).
TUNE=(--lr-scheduler fixed --lr "$FT_LR" --warmup-updates "$FT_WARMUP")
PLAIN=(--criterion label_smoothed_cross_entropy "${TUNE[@]}")
RUNS=("unpruned=$MODEL")

final() {  # name label: fine-tune $OUT/pruned/name.pt FT_UPDATES updates into $OUT/final
  local name="$1"
  if [ "$FT_UPDATES" -gt 0 ]; then
    demo_train "$name-ft" "$OUT/pruned/$name.pt" "$FT_UPDATES" "${PLAIN[@]}"
    [ -f "$OUT/final/$name.pt" ] || cp "$OUT/runs/$name-ft/checkpoint_last.pt" "$OUT/final/$name.pt"
  else
    [ -f "$OUT/final/$name.pt" ] || cp "$OUT/pruned/$name.pt" "$OUT/final/$name.pt"
  fi
  RUNS+=("$2=$OUT/final/$name.pt")
}

echo "== control: the unpruned model fine-tuned $((UPDATES + FT_UPDATES)) updates"
demo_train control "$MODEL" "$((UPDATES + FT_UPDATES))" "${PLAIN[@]}"
[ -f "$OUT/final/control.pt" ] || cp "$OUT/runs/control/checkpoint_last.pt" "$OUT/final/control.pt"
RUNS+=("control=$OUT/final/control.pt")

for method in $METHODS; do
  for keep in $KEEP; do
    k=$(percent_of "$keep" "$TOTAL"); name="$method-$keep"
    echo "== $method, keep $keep% ($k of $TOTAL heads)"
    case "$method" in
      michel) michel_keep "$name" "$k" ;;
      voita)
        demo_train "$name" "$MODEL" "$UPDATES" --head-gates hard_concrete \
          --head-gates-lr "$GATE_LR" --criterion l0_label_smoothed_cross_entropy \
          --l0-target-heads "$k" --l0-multiplier-lr "$MULTIPLIER_LR" \
          --l0-target-warmup "$TARGET_WARMUP" --l0-damping "$DAMPING" "${TUNE[@]}"
        from_gates "$name" "$name" --keep-heads "$k" ;;
      dsp)
        demo_train "$name" "$MODEL" "$UPDATES" --head-gates subset --subset-heads "$k" \
          --subset-lr "$SUBSET_LR" --subset-anneal-updates "$UPDATES" "${PLAIN[@]}"
        from_gates "$name" "$name" ;;
      gha)
        groups=$((keep * HEADS / 100))
        if [ $((groups * 100)) -ne $((keep * HEADS)) ] || [ "$groups" -lt 1 ]; then
          echo "gha keeps C heads per module: $keep% of $HEADS heads is not a whole number" >&2
          exit 2
        fi
        trained "$name-gc" "$MODEL" "$UPDATES" --gha-groups "$groups" --gha-alpha "$ALPHA" \
          --gha-beta "$BETA" --gha-feature "$FEATURE" \
          --criterion group_constraint_label_smoothed_cross_entropy "${TUNE[@]}"
        gha_vote_prune "$name" "$OUT/pruned/$name-gc.pt" "$groups"
        [ -f "$OUT/pruned/$name.pt" ] || cp "$OUT/votes/$name.pt" "$OUT/pruned/$name.pt" ;;
      collab)
        [ -f "$OUT/pruned/$name.pt" ] || fairseq-headprune collab --path "$MODEL" \
          --key-dim "$(percent_of "$keep" "$FULL")" --types EDA \
          --report "$OUT/pruned/$name.json" -o "$OUT/pruned/$name.pt" ;;
      *) echo "METHODS: unknown method '$method' (michel voita dsp gha collab)" >&2; exit 2 ;;
    esac
    final "$name" "$method/$keep"
  done
done

echo "== compare"
if [ "$QUICK" = 1 ]; then
  NOTE="QUICK smoke run (SIZE $SIZE, $UPDATES training and $FT_UPDATES fine-tuning updates, $SENTENCES sentences): the numbers mean nothing."
else
  NOTE="SIZE $SIZE; voita, dsp and gha trained $UPDATES updates before removal; every pruned or re-parametrised model then fine-tuned $FT_UPDATES updates; control: the unpruned model fine-tuned $((UPDATES + FT_UPDATES)) updates; every run at a fixed lr $FT_LR after $FT_WARMUP warm-up updates."
fi
fairseq-headprune compare "$BIN" --runs "${RUNS[@]}" --max-sentences "$SENTENCES" \
  --bench-batch-sizes "$BENCH_BATCHES" --bench-sentences "$BENCH_SENTENCES" \
  --repeats "$REPEATS" --bootstrap-samples "$BOOTSTRAP" --device "$DEVICE" --note "$NOTE" \
  -o "$OUT"
"$PY" -c 'import os, sys; from fairseq_headprune.io import write_json
write_json(sys.argv[5], {"seconds": int(sys.argv[1]), "fresh": sys.argv[2] == "1",
                         "device": sys.argv[3], "cpus": os.cpu_count(), "quick": sys.argv[4] == "1"})' \
  "$((SECONDS - START))" "$FRESH" "$DEVICE" "$QUICK" "$OUT/time.json"
echo "compare.sh: $((SECONDS - START)) s"
}
main "$@"
