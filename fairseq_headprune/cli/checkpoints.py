"""Subcommands that read and write checkpoints: ``convert``, ``prune``, ``fold``, ``collab``,
``inspect``."""

from fairseq_headprune.cli.common import (
    count, file_size, refuse_overwrite, types_arg)


def print_parameters(report):
    """The parameter line that prune and fold print from their reports."""
    print(f"parameters: {report['params_before']:,} -> {report['params_after']:,} "
          f"({report['params_after'] - report['params_before']:+,})")


def cmd_convert(args):
    from fairseq_headprune.pruning.checkpoint import save_checkpoint
    from fairseq_headprune.pruning.convert import convert_checkpoint

    refuse_overwrite(args, args.path)
    state = convert_checkpoint(args.path)
    save_checkpoint(state, args.output)
    print(f"converted {args.path} -> {args.output} (arch {state['cfg']['model'].arch})")


def cmd_prune(args):
    from fairseq_headprune.errors import HeadPruneError
    from fairseq_headprune.heads.spec import format_head_spec, parse_head_spec
    from fairseq_headprune.pruning.remove import prune_checkpoint

    if args.from_gates:
        if args.path or args.heads:
            raise HeadPruneError("give either --from-gates GATED.pt or --path with --heads, "
                                 "not both.")
        args.path = args.from_gates
        return cmd_fold(args)
    if args.keep_heads is not None or args.keep_expected:
        option = "--keep-heads" if args.keep_heads is not None else "--keep-expected"
        raise HeadPruneError(f"{option} goes with --from-gates.")
    if not args.path or args.heads is None:
        raise HeadPruneError("prune needs --path and --heads (or --from-gates GATED.pt).")
    refuse_overwrite(args, args.path)
    spec = parse_head_spec(args.heads)
    if not format_head_spec(spec):
        raise HeadPruneError(f"the head spec {args.heads!r} names no heads: nothing to prune, "
                             f"nothing written.")
    r = prune_checkpoint(args.path, spec, args.output)
    print(f"removed {r['removed']} heads ({format_head_spec(spec)}): "
          f"{r['heads_before']} -> {r['heads_after']} heads")
    print_parameters(r)
    print(f"weights:    {r['bytes_before'] / 2**20:.2f} MiB -> {r['bytes_after'] / 2**20:.2f} MiB")
    print(f"file size:  {file_size(args.path)} -> {file_size(args.output)} "
          f"(optimizer state dropped)")


def cmd_fold(args):
    from fairseq_headprune.errors import HeadPruneError
    from fairseq_headprune.pruning.fold import fold_checkpoint

    refuse_overwrite(args, args.path)
    if args.keep_heads is not None and args.keep_expected:
        raise HeadPruneError("give --keep-heads K or --keep-expected, not both.")
    r = fold_checkpoint(args.path, args.output, args.keep_heads, args.keep_expected)
    print(f"folded the gates of {args.path} -> {args.output}: removed {r['removed']} heads with "
          f"gate 0, folded {r['scaled']} fractional gates into out_proj; "
          f"{r['heads_before']} -> {r['heads_after']} heads")
    if "expected_open" in r:
        print(f"kept the {r['expected_open']} heads the gates expect open (largest P(open))")
    print_parameters(r)


def cmd_collab(args):
    from fairseq_headprune.io import check_writable as check, write_json
    from fairseq_headprune.methods.collab import collab_checkpoint

    refuse_overwrite(args, args.path)
    if args.report:
        check(args.report, "--report")
    r = collab_checkpoint(args.path, args.output, args.key_dim, args.types, args.seed,
                          args.cp_iters, args.cp_init)
    print(f"collaborative attention (key size {r['key_dim']}) on {r['types']}: "
          f"{args.path} -> {args.output}")
    print("module  heads  full key size  relative reconstruction error")
    for m in r["modules"]:
        print(f"{m['module']:<6}  {m['heads']:>5}  {m['full']:>13}  {m['error']:.6f}")
    print_parameters(r)
    if args.report:
        write_json(args.report, r)


def cmd_inspect(args):
    from fairseq_headprune.heads.layout import TYPE_NAMES
    from fairseq_headprune.model.collaborative import collaborative_types
    from fairseq_headprune.model.gates import module_key
    from fairseq_headprune.pruning.checkpoint import (
        checkpoint_layout, count_parameters, load_checkpoint, require_headprune)
    from fairseq_headprune.pruning.fold import checkpoint_gates

    state = load_checkpoint(args.path)
    require_headprune(state, args.path, gates_ok=True)
    layout = checkpoint_layout(state)
    gates = checkpoint_gates(state)
    values = gates.eval_values() if gates is not None else {}
    print(f"{args.path}: {count_parameters(state['model']):,} parameters, "
          f"{layout.count()} heads kept")
    for key_dim, types in collaborative_types(state["model"]).items():
        print(f"collaborative attention (Cordonnier et al.) on {','.join(types)}: shared "
              f"query/key size {key_dim}")
    if gates is not None:
        types = "".join(k for k in TYPE_NAMES if any(key[0] == k for key in gates.heads))
        print(f"head gates: {gates.kind} on {types} (evaluation value per kept head; "
              f"'fairseq-headprune fold' removes the heads at 0)")
    for kind, layers in layout.kept.items():
        total = layout.num_heads[kind] * len(layers)
        print(f"{kind} ({TYPE_NAMES[kind]}): {layout.count(kind)}/{total} heads")
        for layer, kept in enumerate(layers):
            heads = ",".join(str(h + 1) for h in kept) or "-"
            line = f"  {kind}:{layer + 1}  {len(kept)}/{layout.num_heads[kind]}  heads {heads}"
            value = values.get(module_key(kind, layer))
            if value is not None:
                line += "  gates " + (" ".join(f"{g:.3f}" for g in value.tolist()) or "-")
            print(line)


def add_parsers(sub):
    p = sub.add_parser("convert", help="stock transformer checkpoint -> transformer_headprune")
    p.add_argument("--path", required=True, help="stock fairseq transformer checkpoint")
    p.add_argument("-o", "--output", required=True, help="converted checkpoint to write")
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("prune", help="physically remove heads from a checkpoint")
    p.add_argument("--path", help="transformer_headprune checkpoint")
    p.add_argument("--heads",
                   help="heads to remove: 1-based spec such as 'E:1:1,2 A:6:3', JSON, or a file")
    p.add_argument("--from-gates", metavar="GATED",
                   help="instead of --path/--heads: a checkpoint with learned gates; its closed "
                        "heads are removed and open gate values folded (the same as 'fold')")
    p.add_argument("--keep-heads", type=count, metavar="K",
                   help="with --from-gates: keep only the K largest evaluation gates")
    p.add_argument("--keep-expected", action="store_true",
                   help="with --from-gates: keep the rounded expected number of open Hard "
                        "Concrete gates (see fold)")
    p.add_argument("-o", "--output", required=True, help="pruned checkpoint to write")
    p.set_defaults(func=cmd_prune)

    p = sub.add_parser("fold", help="gated checkpoint -> plain pruned checkpoint: remove heads "
                                    "whose gate is 0, fold the other gate values into out_proj")
    p.add_argument("--path", required=True, help="transformer_headprune checkpoint with gates")
    p.add_argument("--keep-heads", type=count, metavar="K",
                   help="keep only the K largest evaluation gates of all gated modules (the DSP "
                        "fork's --num-of-heads); default: every head whose gate is not 0")
    p.add_argument("--keep-expected", action="store_true",
                   help="keep as many heads as the Hard Concrete gates expect open (sum of "
                        "P(open), rounded), those with the largest P(open): CoFi's deterministic "
                        "mask, the way to end --l0-target-heads training with the target count")
    p.add_argument("-o", "--output", required=True, help="pruned checkpoint to write")
    p.set_defaults(func=cmd_fold)

    p = sub.add_parser(
        "collab", help="re-parametrise attention as collaborative attention (Cordonnier et al. "
                       "2020): heads share query/key projections of --key-dim dimensions, from "
                       "a CP decomposition of each module's query-key products; no retraining")
    p.add_argument("--path", required=True, help="transformer_headprune checkpoint (pruned or not)")
    p.add_argument("--key-dim", type=int, required=True, metavar="N",
                   help="shared query/key size D~k, from 1 to heads x head_dim (the full size, "
                        "exact without decomposition)")
    p.add_argument("--types", type=types_arg, default="EDA",
                   help="attention types to re-parametrise: E encoder self, D decoder self, A "
                        "encoder-decoder (default: %(default)s; the authors do encoders only)")
    p.add_argument("--seed", type=int, default=0,
                   help="random state of the CP initialisation (default: %(default)s)")
    p.add_argument("--cp-iters", type=count, default=100,
                   help="ALS iterations at most (default: %(default)s, tensorly's and the authors')")
    p.add_argument("--cp-init", choices=("random", "svd"), default="random",
                   help="CP initialisation (default: %(default)s, the authors')")
    p.add_argument("--report", metavar="JSON",
                   help="also write the per-module reconstruction errors here (they are always "
                        "stored in the checkpoint, key 'headprune_collab')")
    p.add_argument("-o", "--output", required=True, help="collaborative checkpoint to write")
    p.set_defaults(func=cmd_collab)

    p = sub.add_parser("inspect", help="print the head layout (and gate values) of a checkpoint")
    p.add_argument("--path", required=True, help="transformer_headprune checkpoint")
    p.set_defaults(func=cmd_inspect)
