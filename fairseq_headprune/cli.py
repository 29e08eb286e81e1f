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
    from fairseq_headprune.checkpoint import (
        checkpoint_layout, count_parameters, load_checkpoint, require_headprune, save_checkpoint,
        strip_training_state)
    from fairseq_headprune.remove import remove_heads
    from fairseq_headprune.spec import format_head_spec, parse_head_spec

    spec = parse_head_spec(args.heads)
    state = load_checkpoint(args.path)
    model_args = require_headprune(state, args.path)
    sd = state["model"]
    params_before = count_parameters(sd)
    heads_before = checkpoint_layout(state).count()
    removed = remove_heads(sd, checkpoint_layout(state), spec)
    layout = checkpoint_layout(state)
    model_args.head_layout = layout.to_json()
    strip_training_state(state)
    save_checkpoint(state, args.output)
    params_after = count_parameters(sd)
    print(f"removed {removed} heads ({format_head_spec(spec)}): "
          f"{heads_before} -> {layout.count()} heads")
    print(f"parameters: {params_before:,} -> {params_after:,} "
          f"({params_after - params_before:+,})")
    print(f"file size:  {_size(args.path)} -> {_size(args.output)}")


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fairseq-headprune",
        description="Score, prune and physically remove attention heads of fairseq Transformers. "
                    "Head specs are 1-based: E:1:1,2 (encoder self), D:... (decoder self), "
                    "A:... (encoder-decoder).")
    sub = parser.add_subparsers(dest="command", required=True)

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
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.INFO,
                        stream=sys.stderr)
    logging.getLogger("fairseq.tasks.text_to_speech").setLevel(logging.WARNING)  # tensorboardX
    try:
        args.func(args)
    except HeadPruneError as err:
        parser.exit(2, f"fairseq-headprune {args.command}: error: {err}\n")


if __name__ == "__main__":
    main()
