"""Subcommands that score heads and choose which to prune: ``importance``, ``choose``."""

import os
import sys

from fairseq_headprune.cli.common import (
    amount, count, count0, refuse_overwrite, types_arg)


def cmd_importance(args, extra):
    """fairseq-validate with the head_importance task swapped in for the checkpoint's task.

    fairseq-validate builds the task saved in the checkpoint and ignores --task, so the task is
    switched through --model-overrides, which is what a user of stock fairseq-validate types.
    """
    run_head_importance(args, extra, {"importance_abs": args.abs,
                                      "importance_normalize": args.normalize})


def cmd_vote(args, extra):
    """Voting-to-Stay (Ni et al. 2023): one no-grad pass of the head_importance task with the
    votes scorer; the file has the importance format, so choose, sweep and ablate read it."""
    from fairseq_headprune.methods.gha import check_groups
    from fairseq_headprune.model.gates import parse_gate_types
    from fairseq_headprune.pruning.checkpoint import (
        checkpoint_layout, load_checkpoint, require_headprune)

    types = parse_gate_types(args.types)
    refuse_overwrite(args, args.path)
    state = load_checkpoint(args.path)
    require_headprune(state, args.path)
    check_groups(checkpoint_layout(state), types, args.groups, 1, "--groups")
    run_head_importance(args, extra, {"importance_scorer": "votes", "importance_normalize": "none",
                                      "vote_groups": args.groups, "vote_feature": args.feature,
                                      "vote_types": ",".join(types), "vote_seed": args.seed})


def run_head_importance(args, extra, options):
    from fairseq_cli import validate

    from fairseq_headprune import register  # noqa: F401  (the head_importance task)
    from fairseq_headprune.errors import HeadPruneError
    from fairseq_headprune.pruning.checkpoint import load_checkpoint, require_headprune

    refuse_overwrite(args, args.path)
    require_headprune(load_checkpoint(args.path), args.path)
    if not os.path.isdir(args.data):
        raise HeadPruneError(f"data directory {args.data} does not exist.")
    # the overridden task config replaces the checkpoint's, 'data' included: carry DATA in it
    overrides = {"task": {"_name": "head_importance", "data": os.path.abspath(args.data),
                          "importance_output": args.output, **options}}
    sys.argv = ["fairseq-validate", args.data, "--task", "head_importance", "--path", args.path,
                "--valid-subset", args.subset, "--model-overrides", repr(overrides),
                "--required-batch-size-multiple", "1", *extra]
    if not any(a.startswith(("--max-tokens", "--batch-size")) for a in extra):
        sys.argv += ["--max-tokens", "4000"]
    validate.cli_main()


def cmd_correlate(args):
    """Spearman's rho per attention type between importance files, each against the first."""
    from fairseq_headprune.errors import HeadPruneError
    from fairseq_headprune.heads.rank import correlate
    from fairseq_headprune.heads.scores import read_importance
    from fairseq_headprune.io import write_json

    labels = args.labels or args.importance
    if len(labels) != len(args.importance):
        raise HeadPruneError(f"--labels names {len(labels)} files, --importance "
                             f"{len(args.importance)}.")
    refuse_overwrite(args, *args.importance)
    tables = [read_importance(p) for p in args.importance]
    rows = [{"label": label, "against": labels[0], "spearman": correlate(tables[0], t)}
            for label, t in zip(labels[1:], tables[1:])]
    for r in rows:
        rho = "  ".join(f"{k} {'-' if v is None else f'{v:+.3f}'}"
                        for k, v in r["spearman"].items())
        print(f"{r['label']} vs {r['against']}: Spearman {rho}")
    if args.output:
        write_json(args.output, {"files": dict(zip(labels, args.importance)), "rows": rows})


def cmd_choose(args):
    from fairseq_headprune.heads.scores import read_importance
    from fairseq_headprune.heads.spec import format_head_spec, spec_to_json
    from fairseq_headprune.io import write_json
    from fairseq_headprune.errors import HeadPruneError
    from fairseq_headprune.pruning.selection import (
        choose_heads, choose_per_module, choose_to_keep, parse_keep)

    refuse_overwrite(args, args.importance)
    scores = read_importance(args.importance)
    rules = [args.amount, args.keep_per_type, args.per_module]
    if sum(r is not None for r in rules) != 1:
        raise HeadPruneError("choose needs exactly one of --amount, --keep-per-type and "
                             "--per-module.")
    if args.per_module is not None:
        spec = choose_per_module(scores, args.per_module, args.types)
    elif args.keep_per_type is not None:
        spec = choose_to_keep(scores, parse_keep(args.keep_per_type))
    else:
        spec = choose_heads(scores, args.amount, args.scope, args.types, args.keep_one_per_layer)
    if args.output:
        write_json(args.output, {"heads": spec_to_json(spec), "spec": format_head_spec(spec),
                                 "amount": args.amount, "keep_per_type": args.keep_per_type,
                                 "per_module": args.per_module,
                                 "scope": args.scope,
                                 "types": args.types, "importance": args.importance})
    print(format_head_spec(spec))


def add_parsers(sub):
    p = sub.add_parser("importance", help="Michel et al. head importance (runs fairseq-validate "
                                          "with --task head_importance); other options pass "
                                          "through to fairseq-validate")
    p.add_argument("data", help="fairseq-preprocess output folder")
    p.add_argument("--path", required=True, help="transformer_headprune checkpoint")
    p.add_argument("--subset", default="valid", help="(default: %(default)s)")
    p.add_argument("--abs", choices=["token", "sentence", "batch"], default="token",
                   help="token: |<ctx, dL/dctx>| per token (the authors' code); sentence: "
                        "|dL(x)/dxi| per sentence (the paper's equation); batch: per batch "
                        "(default: %(default)s)")
    p.add_argument("--normalize", choices=["layer_l2", "none"], default="layer_l2",
                   help="(default: %(default)s)")
    p.add_argument("-o", "--output", required=True, help="importance JSON to write")
    p.set_defaults(func=cmd_importance, passthrough=True)

    p = sub.add_parser("vote", help="Ni et al. (2023) Voting-to-Stay: per batch, each group of "
                                    "similar heads votes for its member nearest the centre "
                                    "(runs fairseq-validate with --task head_importance, no "
                                    "gradient); other options pass through to fairseq-validate")
    p.add_argument("data", help="fairseq-preprocess output folder")
    p.add_argument("--path", required=True, help="transformer_headprune checkpoint (trained "
                                                 "with the group constraint)")
    p.add_argument("--subset", default="valid", help="(default: %(default)s)")
    p.add_argument("--groups", type=count, default=2, metavar="C",
                   help="groups per attention module, one vote each per batch (default: "
                        "%(default)s, the authors' IWSLT C)")
    p.add_argument("--feature", choices=["headout", "V", "attn_matrix", "Q", "K"],
                   default="headout", help="feature map clustered (default: %(default)s)")
    p.add_argument("--types", type=types_arg, default="EDA",
                   help="attention types voted on (default: %(default)s)")
    p.add_argument("--seed", type=count0, default=0, help="k-means seed (default: 0)")
    p.add_argument("-o", "--output", required=True, help="votes JSON to write (importance "
                                                         "format)")
    p.set_defaults(func=cmd_vote, passthrough=True)

    p = sub.add_parser("correlate", help="rank correlation (Spearman, per attention type) of "
                                         "importance files against the first")
    p.add_argument("--importance", nargs="+", required=True, help="importance JSON files")
    p.add_argument("--labels", nargs="+", help="a name per file (default: the paths)")
    p.add_argument("-o", "--output", help="JSON to write the correlations to")
    p.set_defaults(func=cmd_correlate)

    p = sub.add_parser("choose", help="heads to prune from an importance JSON")
    p.add_argument("--importance", required=True, help="importance JSON")
    p.add_argument("--amount", type=amount,
                   help="fraction (<1) or count (>=1) of heads to have removed")
    p.add_argument("--keep-per-type", metavar="E:N,D:N,A:N",
                   help="instead of --amount: keep exactly N heads of each type named, the most "
                        "important within the type (e.g. another method's head counts)")
    p.add_argument("--per-module", type=count, metavar="C",
                   help="instead of --amount: keep the C highest-scored heads of every module "
                        "of --types, ties to the lower head (Ni et al.'s Voting-to-Stay rule)")
    p.add_argument("--scope", choices=["global", "type", "layer"], default="global",
                   help="rank all heads together, per type or per layer (default: %(default)s)")
    p.add_argument("--types", type=types_arg, default="EDA",
                   help="attention types in scope (default: %(default)s)")
    p.add_argument("--keep-one-per-layer", action="store_true", help="never empty a layer")
    p.add_argument("-o", "--output", help="head spec JSON to write (prune --heads reads it)")
    p.set_defaults(func=cmd_choose)
