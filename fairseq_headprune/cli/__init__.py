"""``fairseq-headprune``: the command-line entry point. It only builds the parser from the
subcommand modules of this package and dispatches; no logic lives here.

Subcommand groups: :mod:`.checkpoints` (convert, prune, fold, inspect), :mod:`.scoring` (importance,
choose), :mod:`.evaluation` (sweep, ablate, evaluate, bench, compare), :mod:`.data` (corpus),
:mod:`.analysis` (analyze).
"""

import argparse
import logging
import sys
import warnings

from fairseq_headprune.cli import analysis, checkpoints, data, evaluation, scoring
from fairseq_headprune.errors import HeadPruneError

GROUPS = (checkpoints, data, scoring, evaluation, analysis)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fairseq-headprune",
        description="Score, prune and physically remove attention heads of fairseq Transformers. "
                    "Head specs are 1-based: E:1:1,2 (encoder self), D:... (decoder self), "
                    "A:... (encoder-decoder).")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.add_parsers(sub)
    return parser


# Deprecation notices raised inside fairseq, Hydra and torch by the calls this command makes;
# nothing a user can act on (fairseq-train and the other fairseq commands keep theirs).
QUIET = (r"The version_base parameter is not specified", r"hydra.experimental",
         r"In 'config': Usage of deprecated",
         r"'config' is validated against ConfigStore", r"The strict flag in the compose API",
         r"`torch.cuda.amp.autocast\(args...\)` is deprecated", r".*pin_memory",
         r"`torch.jit.script` is deprecated", r"Support for mismatched key_padding_mask",
         r"Please install tensorboardX")


def quiet_warnings():
    for message in QUIET:
        warnings.filterwarnings("ignore", message=r"\s*" + message)


def main(argv=None):
    quiet_warnings()
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "passthrough", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.INFO,
                        stream=sys.stderr)
    logging.getLogger("fairseq.tasks.text_to_speech").setLevel(logging.WARNING)  # tensorboardX
    try:
        from fairseq_headprune import register  # noqa: F401  (archs, tasks, gate kinds)

        if getattr(args, "passthrough", False):
            args.func(args, extra)
        else:
            args.func(args)
    except HeadPruneError as err:
        parser.exit(2, f"fairseq-headprune {args.command}: error: {err}\n")
    except KeyboardInterrupt:
        parser.exit(130, f"fairseq-headprune {args.command}: interrupted; finished results are "
                         f"kept, rerun the same command to resume.\n")


if __name__ == "__main__":
    main()
