"""Subcommand ``corpus``: build the embedded parallel corpus from gettext catalogs."""

from fairseq_headprune.cli.common import check_writable, count, share


def cmd_corpus(args):
    from fairseq_headprune.data.corpus import build_corpus

    check_writable(args.output_dir)
    sizes = build_corpus(args.catalogs, args.output_dir, args.src_lang, args.tgt_lang,
                         args.valid_share, args.test_share, args.vocab_size, args.workers)
    print(f"{args.src_lang}-{args.tgt_lang} corpus in {args.output_dir}: "
          + ", ".join(f"{k} {v:,}" for k, v in sizes.items())
          + f" pairs ({sum(sizes.values()):,} in all)")


def add_parsers(sub):
    p = sub.add_parser("corpus", help="build the embedded parallel corpus from gettext catalogs")
    p.add_argument("--catalogs", nargs="+", default=["/usr/share/locale"],
                   help="locale roots, folders or .mo/.po files (default: %(default)s)")
    p.add_argument("--src-lang", default="en", help="(default: %(default)s)")
    p.add_argument("--tgt-lang", default="de", help="(default: %(default)s)")
    p.add_argument("--valid-share", type=share, default=0.03, help="(default: %(default)s)")
    p.add_argument("--test-share", type=share, default=0.03, help="(default: %(default)s)")
    p.add_argument("--vocab-size", type=count, default=8000,
                   help="joint sentencepiece vocabulary (default: %(default)s)")
    p.add_argument("--workers", type=count, default=2, help="(default: %(default)s)")
    p.add_argument("-o", "--output-dir", required=True, help="where raw/, spm/, bin/ go")
    p.set_defaults(func=cmd_corpus)
