# Sourced after scripts/lib/demo_model.sh by the reproductions that run several methods on one
# checkpoint (dsp_demo.sh, gha_demo.sh, scripts/compare.sh, dsp.sh, gha.sh): each method's command
# sequence once.
# Every function skips work whose output exists. Uses $PY, $OUT, $BIN, $MODEL, $IMPORTANCE.

# heads_total CHECKPOINT: the number of heads the checkpoint keeps, all types.
heads_total() {
  "$PY" -c 'import sys; from fairseq_headprune.pruning.checkpoint import checkpoint_layout, load_checkpoint; print(checkpoint_layout(load_checkpoint(sys.argv[1])).count())' "$1" 2>/dev/null
}

# percent_of PERCENT N: round(PERCENT / 100 * N).
percent_of() {
  "$PY" -c 'import sys; print(round(float(sys.argv[1]) / 100 * int(sys.argv[2])))' "$1" "$2"
}

# trained NAME RESTORE UPDATES [fairseq-train options...]: demo_train, then the run's last
# checkpoint as $OUT/pruned/NAME.pt (a plain model: no gates, no constraint to fold).
trained() {
  demo_train "$@"
  [ -f "$OUT/pruned/$1.pt" ] || cp "$OUT/runs/$1/checkpoint_last.pt" "$OUT/pruned/$1.pt"
}

# from_gates NAME RUN [prune options...]: the gated run $OUT/runs/RUN, its heads removed
# (prune --from-gates: the closed gates, or --keep-heads K), as $OUT/pruned/NAME.pt.
from_gates() {
  local name="$1" run="$2"; shift 2
  [ -f "$OUT/pruned/$name.pt" ] || fairseq-headprune prune --from-gates \
    "$OUT/runs/$run/checkpoint_last.pt" -o "$OUT/pruned/$name.pt" "$@"
}

# michel_keep NAME K: Michel et al. (2019), the K most important heads of $IMPORTANCE kept
# (one global ranking over all types), the others removed from $MODEL, as $OUT/pruned/NAME.pt.
# $TOTAL, when set, is $MODEL's number of heads.
michel_keep() {
  local name="$1" k="$2" total
  [ -f "$OUT/pruned/$name.pt" ] && return
  total="${TOTAL:-$(heads_total "$MODEL")}"
  fairseq-headprune choose --importance "$IMPORTANCE" --amount "$((total - k))" \
    -o "$OUT/pruned/$name.json"
  fairseq-headprune prune --path "$MODEL" --heads "$OUT/pruned/$name.json" \
    -o "$OUT/pruned/$name.pt"
}

# gha_vote_prune NAME CHECKPOINT C: Ni et al. (2023) Voting-to-Stay on the valid split with C
# groups ($FEATURE, default headout), the C most voted heads of every module kept, the others
# removed: $OUT/votes/NAME.json (votes), NAME.spec.json (heads removed), NAME.pt (pruned).
gha_vote_prune() {
  local name="$1" from="$2" groups="$3"
  mkdir -p "$OUT/votes"
  [ -f "$OUT/votes/$name.json" ] || fairseq-headprune vote "$BIN" --path "$from" \
    --groups "$groups" --feature "${FEATURE:-headout}" -o "$OUT/votes/$name.json" \
    "${DEVICE_ARGS[@]}"
  [ -f "$OUT/votes/$name.spec.json" ] || fairseq-headprune choose \
    --importance "$OUT/votes/$name.json" --per-module "$groups" -o "$OUT/votes/$name.spec.json"
  [ -f "$OUT/votes/$name.pt" ] || fairseq-headprune prune --path "$from" \
    --heads "$OUT/votes/$name.spec.json" -o "$OUT/votes/$name.pt"
}
