"""``fairseq-headprune``: the command-line entry point and its subcommands."""

import argparse
import logging
import os
import sys

from fairseq_headprune.errors import HeadPruneError

logger = logging.getLogger("fairseq_headprune")


def _size(path: str) -> str:
    return f"{os.path.getsize(path) / 2**20:.2f} MiB"


def cmd_convert(args):
    from fairseq_headprune.checkpoint import save_checkpoint
    from fairseq_headprune.convert import convert_checkpoint

    state = convert_checkpoint(args.path)
    save_checkpoint(state, args.output)
    print(f"converted {args.path} -> {args.output} (arch {state['cfg']['model'].arch})")


def cmd_prune(args):
    from fairseq_headprune.remove import prune_checkpoint
    from fairseq_headprune.spec import format_head_spec, parse_head_spec

    spec = parse_head_spec(args.heads)
    r = prune_checkpoint(args.path, spec, args.output)
    print(f"removed {r['removed']} heads ({format_head_spec(spec)}): "
          f"{r['heads_before']} -> {r['heads_after']} heads")
    print(f"parameters: {r['params_before']:,} -> {r['params_after']:,} "
          f"({r['params_after'] - r['params_before']:+,})")
    print(f"weights:    {r['bytes_before'] / 2**20:.2f} MiB -> {r['bytes_after'] / 2**20:.2f} MiB")
    print(f"file size:  {_size(args.path)} -> {_size(args.output)} (optimizer state dropped)")


def cmd_inspect(args):
    from fairseq_headprune.checkpoint import (
        checkpoint_layout, count_parameters, load_checkpoint, require_headprune)
    from fairseq_headprune.layout import TYPE_NAMES

    state = load_checkpoint(args.path)
    require_headprune(state, args.path)
    layout = checkpoint_layout(state)
    print(f"{args.path}: {count_parameters(state['model']):,} parameters, "
          f"{layout.count()} heads kept")
    for kind, layers in layout.kept.items():
        total = layout.num_heads[kind] * len(layers)
        print(f"{kind} ({TYPE_NAMES[kind]}): {layout.count(kind)}/{total} heads")
        for layer, kept in enumerate(layers):
            heads = ",".join(str(h + 1) for h in kept) or "-"
            print(f"  {kind}:{layer + 1}  {len(kept)}/{layout.num_heads[kind]}  heads {heads}")


def _floats(text):
    return [float(x) for x in text.split(",") if x]


def _ints(text):
    return [int(x) for x in text.split(",") if x]


def cmd_corpus(args):
    from fairseq_headprune.corpus import build_corpus

    sizes = build_corpus(args.catalogs, args.output_dir, args.src_lang, args.tgt_lang,
                         args.valid_share, args.test_share, args.vocab_size, args.workers)
    print(f"{args.src_lang}-{args.tgt_lang} corpus in {args.output_dir}: "
          + ", ".join(f"{k} {v:,}" for k, v in sizes.items())
          + f" pairs ({sum(sizes.values()):,} in all)")


def cmd_importance(args, extra):
    """fairseq-validate with the head_importance task swapped in for the checkpoint's task.

    fairseq-validate builds the task saved in the checkpoint and ignores --task, so the task is
    switched through --model-overrides, which is what a user of stock fairseq-validate types.
    """
    from fairseq_cli import validate

    from fairseq_headprune.checkpoint import load_checkpoint, require_headprune

    require_headprune(load_checkpoint(args.path), args.path)  # registers the plugin, too
    overrides = {"task": {"_name": "head_importance", "importance_output": args.output,
                          "importance_abs": args.abs, "importance_normalize": args.normalize}}
    sys.argv = ["fairseq-validate", args.data, "--task", "head_importance", "--path", args.path,
                "--valid-subset", args.subset, "--model-overrides", repr(overrides), *extra]
    if not any(a.startswith(("--max-tokens", "--batch-size")) for a in extra):
        sys.argv += ["--max-tokens", "4000"]
    validate.cli_main()


def cmd_choose(args):
    from fairseq_headprune.importance import read_importance
    from fairseq_headprune.io import write_json
    from fairseq_headprune.selection import choose_heads
    from fairseq_headprune.spec import format_head_spec, spec_to_json

    scores = read_importance(args.importance)
    spec = choose_heads(scores, args.amount, args.scope, args.types, args.keep_one_per_layer)
    if args.output:
        write_json(args.output, {"heads": spec_to_json(spec), "spec": format_head_spec(spec),
                                 "amount": args.amount, "scope": args.scope,
                                 "types": args.types, "importance": args.importance})
    print(format_head_spec(spec))


def cmd_sweep(args):
    from fairseq_headprune.plots import plot_heatmap, plot_sweep
    from fairseq_headprune.sweep import run_sweep

    rows = run_sweep(args.data, args.path, args.importance, args.output_dir, args.levels,
                     args.curves, args.subset, args.beam, args.max_tokens, args.max_sentences,
                     args.keep_one_per_layer, args.iterative, args.rescore_subset,
                     args.save_levels, args.device)
    results = os.path.join(args.output_dir, "results.json")
    plot_sweep(results, os.path.join(args.output_dir, "bleu_vs_pruned.png"))
    plot_heatmap(args.importance, os.path.join(args.output_dir, "importance.png"))
    for r in rows:
        print(f"{r['curve']:4s} {r['level'] * 100:5.1f}% pruned ({r['heads_pruned']:3d}/"
              f"{r['heads_total']}) BLEU {r['bleu']:6.2f}")
    print(f"signature: {rows[0]['signature'] if rows else '-'}")


def cmd_bench(args):
    from fairseq_headprune.bench import format_bench, run_bench
    from fairseq_headprune.io import write_json

    report = run_bench(args.data, args.path, args.pruned, args.subset, args.beam,
                       args.batch_sizes, args.max_sentences, args.repeats, args.device,
                       None if args.free_length else args.fixed_length)
    if args.output:
        write_json(args.output, report)
    print(format_bench(report))


def cmd_ablate(args):
    from fairseq_headprune.ablation import run_ablation

    result = run_ablation(args.data, args.path, args.output_dir, args.mode, args.types,
                          args.importance, args.subset, args.beam, args.max_tokens,
                          args.max_sentences, args.device)
    for row in result["rows"]:
        print(f"{row['spec'] or 'unpruned':40s} BLEU {row['bleu']:6.2f} ({row['delta']:+.2f})")
    print(f"signature: {result['rows'][0]['signature']}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fairseq-headprune",
        description="Score, prune and physically remove attention heads of fairseq Transformers. "
                    "Head specs are 1-based: E:1:1,2 (encoder self), D:... (decoder self), "
                    "A:... (encoder-decoder).")
    sub = parser.add_subparsers(dest="command", required=True)
    device = "cuda" if _cuda() else "cpu"

    p = sub.add_parser("convert", help="stock transformer checkpoint -> transformer_headprune")
    p.add_argument("--path", required=True, help="stock fairseq transformer checkpoint")
    p.add_argument("-o", "--output", required=True, help="converted checkpoint to write")
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("prune", help="physically remove heads from a checkpoint")
    p.add_argument("--path", required=True, help="transformer_headprune checkpoint")
    p.add_argument("--heads", required=True,
                   help="heads to remove: 1-based spec such as 'E:1:1,2 A:6:3', JSON, or a file")
    p.add_argument("-o", "--output", required=True, help="pruned checkpoint to write")
    p.set_defaults(func=cmd_prune)

    p = sub.add_parser("inspect", help="print the head layout of a checkpoint")
    p.add_argument("--path", required=True, help="transformer_headprune checkpoint")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("corpus", help="build the embedded parallel corpus from gettext catalogs")
    p.add_argument("--catalogs", nargs="+", default=["/usr/share/locale"],
                   help="locale roots, folders or .mo/.po files (default: %(default)s)")
    p.add_argument("--src-lang", default="en", help="(default: %(default)s)")
    p.add_argument("--tgt-lang", default="de", help="(default: %(default)s)")
    p.add_argument("--valid-share", type=float, default=0.03, help="(default: %(default)s)")
    p.add_argument("--test-share", type=float, default=0.03, help="(default: %(default)s)")
    p.add_argument("--vocab-size", type=int, default=8000,
                   help="joint sentencepiece vocabulary (default: %(default)s)")
    p.add_argument("--workers", type=int, default=2, help="(default: %(default)s)")
    p.add_argument("-o", "--output-dir", required=True, help="where raw/, spm/, bin/ go")
    p.set_defaults(func=cmd_corpus)

    p = sub.add_parser("importance", help="Michel et al. head importance (runs fairseq-validate "
                                          "with --task head_importance); other options pass "
                                          "through to fairseq-validate")
    p.add_argument("data", help="fairseq-preprocess output folder")
    p.add_argument("--path", required=True, help="transformer_headprune checkpoint")
    p.add_argument("--subset", default="valid", help="(default: %(default)s)")
    p.add_argument("--abs", choices=["sentence", "batch"], default="sentence",
                   help="|gradient| per sentence (paper) or per batch (authors' code) "
                        "(default: %(default)s)")
    p.add_argument("--normalize", choices=["layer_l2", "none"], default="layer_l2",
                   help="(default: %(default)s)")
    p.add_argument("-o", "--output", required=True, help="importance JSON to write")
    p.set_defaults(func=cmd_importance, passthrough=True)

    p = sub.add_parser("choose", help="heads to prune from an importance JSON")
    p.add_argument("--importance", required=True, help="importance JSON")
    p.add_argument("--amount", type=float, required=True,
                   help="fraction (<1) or count (>=1) of heads to have removed")
    p.add_argument("--scope", choices=["global", "type", "layer"], default="global",
                   help="rank all heads together, per type or per layer (default: %(default)s)")
    p.add_argument("--types", default="EDA", help="attention types in scope (default: %(default)s)")
    p.add_argument("--keep-one-per-layer", action="store_true", help="never empty a layer")
    p.add_argument("-o", "--output", help="head spec JSON to write (prune --heads reads it)")
    p.set_defaults(func=cmd_choose)

    p = sub.add_parser("sweep", help="BLEU vs. share of heads pruned, with plots")
    p.add_argument("data", help="fairseq-preprocess output folder")
    p.add_argument("--path", required=True, help="transformer_headprune checkpoint")
    p.add_argument("--importance", required=True, help="importance JSON")
    p.add_argument("-o", "--output-dir", required=True, help="results folder (resumable)")
    p.add_argument("--levels", type=_floats, default=[i / 10 for i in range(10)],
                   help="fractions pruned (default: 0,0.1,...,0.9)")
    p.add_argument("--curves", nargs="+", default=["all", "E", "D", "A"],
                   help="all types together and/or one type alone (default: %(default)s)")
    p.add_argument("--subset", default="test", help="(default: %(default)s)")
    p.add_argument("--beam", type=int, default=5, help="(default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=4000, help="(default: %(default)s)")
    p.add_argument("--max-sentences", type=int, help="decode only the first N sentences")
    p.add_argument("--keep-one-per-layer", action="store_true", help="never empty a layer")
    p.add_argument("--iterative", action="store_true",
                   help="re-score the pruned model before each level (curve 'all')")
    p.add_argument("--rescore-subset", default="valid", help="(default: %(default)s)")
    p.add_argument("--save-levels", type=_floats, default=[],
                   help="levels whose pruned checkpoint to write, e.g. 0.5")
    p.add_argument("--device", default=device, help="(default: %(default)s)")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("ablate", help="Michel et al.'s ablations: remove one head at a time "
                                      "(Table 1) or keep only the best head of a layer (Table 2)")
    p.add_argument("data", help="fairseq-preprocess output folder")
    p.add_argument("--path", required=True, help="transformer_headprune checkpoint")
    p.add_argument("--mode", choices=["single", "best-per-layer"], default="single",
                   help="(default: %(default)s)")
    p.add_argument("--types", default="EDA", help="attention types (default: %(default)s)")
    p.add_argument("--importance", help="importance JSON (best-per-layer ranks heads by it)")
    p.add_argument("-o", "--output-dir", required=True, help="results folder (resumable)")
    p.add_argument("--subset", default="test", help="(default: %(default)s)")
    p.add_argument("--beam", type=int, default=5, help="(default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=4000, help="(default: %(default)s)")
    p.add_argument("--max-sentences", type=int, help="decode only the first N sentences")
    p.add_argument("--device", default=device, help="(default: %(default)s)")
    p.set_defaults(func=cmd_ablate)

    p = sub.add_parser("bench", help="decoding speed: unpruned vs physically pruned")
    p.add_argument("data", help="fairseq-preprocess output folder")
    p.add_argument("--path", required=True, help="unpruned checkpoint")
    p.add_argument("--pruned", required=True, help="pruned checkpoint")
    p.add_argument("--subset", default="test", help="(default: %(default)s)")
    p.add_argument("--beam", type=int, default=5, help="(default: %(default)s)")
    p.add_argument("--batch-sizes", type=_ints, default=[1, 64], help="(default: 1,64)")
    p.add_argument("--max-sentences", type=int, default=200, help="(default: %(default)s)")
    p.add_argument("--repeats", type=int, default=1,
                   help="alternating rounds; the fastest counts (default: %(default)s)")
    p.add_argument("--fixed-length", type=int, default=0,
                   help="force every hypothesis to this many tokens so both models decode the "
                        "same steps; 0: the mean reference length (default: %(default)s)")
    p.add_argument("--free-length", action="store_true",
                   help="decode freely instead (a worse model may decode longer)")
    p.add_argument("--device", default=device, help="(default: %(default)s)")
    p.add_argument("-o", "--output", help="report JSON to write")
    p.set_defaults(func=cmd_bench)
    return parser


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def main(argv=None):
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "passthrough", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.INFO,
                        stream=sys.stderr)
    logging.getLogger("fairseq.tasks.text_to_speech").setLevel(logging.WARNING)  # tensorboardX
    try:
        if getattr(args, "passthrough", False):
            args.func(args, extra)
        else:
            args.func(args)
    except HeadPruneError as err:
        parser.exit(2, f"fairseq-headprune {args.command}: error: {err}\n")


if __name__ == "__main__":
    main()
