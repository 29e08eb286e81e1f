"""Subcommand that characterises heads (Voita et al. 2019, Sec. 4-5): ``analyze``."""

import sys

from fairseq_headprune.cli.common import (
    amount, count, count0, default_device, portion, refuse_overwrite)


def named_file(text):
    """``NAME=FILE`` of ``--overlay``."""
    import argparse

    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"must be NAME=FILE, got '{text}'")
    return name, path


def cmd_analyze(args):
    from fairseq_headprune.errors import HeadPruneError
    from fairseq_headprune.evaluation.roles import analyze

    if args.conllu and args.spacy_model:
        raise HeadPruneError("give --conllu or --spacy-model, not both.")
    refuse_overwrite(args, args.path, args.data, args.conllu, args.importance,
                     *[file for _, file in args.overlay or []])
    result = analyze(args.data, args.path, args.output, subset=args.subset,
                     max_sentences=args.max_sentences, max_tokens=args.max_tokens,
                     device=args.device, min_tokens=args.min_tokens, rare_share=args.rare_share,
                     lrp_sentences=args.lrp_sentences, conllu=args.conllu,
                     min_pairs=args.min_pairs, importance=args.importance,
                     overlays=args.overlay or [], overlay_keep=args.overlay_keep,
                     spacy_model=args.spacy_model)
    for name, rho in result.get("correlation", {}).get("spearman", {}).items():
        print(f"{name.replace('_', ' ')}: Spearman " + "  ".join(
            f"{k} {'-' if v is None else f'{v:+.3f}'}" for k, v in rho.items()))
    for note in result["notes"]:
        print(f"fairseq-headprune analyze: note: {note}", file=sys.stderr)
    print(f"head roles of {result['sentences']} sentences written to {args.output}/roles.json "
          f"and roles.csv")


def add_parsers(sub):
    p = sub.add_parser("analyze", help="Voita et al. (2019) head roles: confidence, LRP "
                                       "relevance, positional, syntactic and rare-word heads")
    p.add_argument("data", help="fairseq-preprocess output folder")
    p.add_argument("--path", required=True, help="transformer_headprune checkpoint (pruned or "
                                                 "not; convert stock ones first)")
    p.add_argument("-o", "--output", required=True, help="folder to write roles.json, "
                                                         "roles.csv and the plots to")
    p.add_argument("--subset", default="valid", help="(default: %(default)s)")
    p.add_argument("--max-sentences", type=count, default=500,
                   help="first N sentences of the subset (default: %(default)s)")
    p.add_argument("--max-tokens", type=count, default=4000,
                   help="tokens per batch (default: %(default)s)")
    p.add_argument("--min-tokens", type=count, default=100,
                   help="fewer counted tokens of a type leave its attention measures empty, "
                        "with a note (default: %(default)s)")
    p.add_argument("--rare-share", type=portion, default=0.5,
                   help="share of tokens on the rarest source token that makes a rare-word "
                        "head (default: %(default)s; the paper gives none)")
    p.add_argument("--lrp-sentences", type=count0, default=50,
                   help="first N sentences for LRP relevance, one at a time (slow: its cost "
                        "grows with the square of the length); 0 skips it (default: "
                        "%(default)s)")
    p.add_argument("--conllu", help="dependency parses of the subset's source side, one "
                                    "CoNLL-U sentence per source sentence in order: adds "
                                    "syntactic heads (nsubj, dobj/obj, amod, advmod)")
    p.add_argument("--spacy-model", metavar="NAME",
                   help="instead of --conllu: parse the detokenised source with this spaCy "
                        "pipeline (pip install .[syntax]; skipped with a note when spaCy or the "
                        "model is missing), e.g. en_core_web_sm")
    p.add_argument("--min-pairs", type=count, default=20,
                   help="relations with fewer pairs are left out, with a note (default: "
                        "%(default)s)")
    p.add_argument("--importance", help="Michel et al. importance JSON of the same model "
                                        "(fairseq-headprune importance): Spearman's rho of "
                                        "relevance and confidence against it, per type")
    p.add_argument("--overlay", type=named_file, action="append", metavar="NAME=FILE",
                   help="a method's heads for the pruning overlay (overlay.png), repeatable: "
                        "a pruned or folded checkpoint (its kept heads), a head spec JSON "
                        "(choose -o: heads pruned) or an importance/votes JSON (its best "
                        "--overlay-keep heads)")
    p.add_argument("--overlay-keep", type=amount, default=0.5,
                   help="heads an importance overlay keeps: a fraction (< 1) of the analysed "
                        "model's heads or a count (default: %(default)s)")
    p.add_argument("--device", default=default_device(), help="(default: %(default)s)")
    p.set_defaults(func=cmd_analyze)
