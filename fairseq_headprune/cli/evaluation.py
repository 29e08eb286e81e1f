"""Subcommands that decode and measure: ``sweep``, ``ablate``, ``evaluate``, ``bench``,
``compare``."""

import os

from fairseq_headprune.cli.common import (
    check_writable, count, count0, default_device, finite, floats, ints, refuse_overwrite,
    share_open, types_arg)


def cmd_sweep(args):
    from fairseq_headprune.evaluation.plots import plot_heatmap, plot_sweep
    from fairseq_headprune.evaluation.sweep import run_sweep

    check_writable(args.output_dir)
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


def cmd_evaluate(args):
    from fairseq_headprune.errors import HeadPruneError
    from fairseq_headprune.evaluation.evaluate import evaluate_checkpoints

    if args.labels and len(args.labels) != len(args.paths):
        raise HeadPruneError(f"--labels gives {len(args.labels)} names for {len(args.paths)} "
                             f"checkpoints.")
    refuse_overwrite(args, *args.paths)
    rows = evaluate_checkpoints(args.data, args.paths, args.output, args.labels, args.subset,
                                args.beam, args.max_tokens, args.max_sentences, args.device,
                                args.lenpen)
    for r in rows:
        heads = " ".join(f"{k}:{n}/{r['heads_total'][k]}" for k, n in r["heads"].items())
        print(f"{r['label']:30s} {heads:30s} {r['params']:>12,} params  BLEU {r['bleu']:6.2f}")
    print(f"signature: {rows[0]['signature'] if rows else '-'}")


def cmd_bench(args):
    from fairseq_headprune.errors import HeadPruneError
    from fairseq_headprune.evaluation.bench import format_bench, run_bench, synthetic_bench
    from fairseq_headprune.io import write_json

    if args.synthetic:
        given = [o for o, v in (("DATA", args.data), ("--path", args.path),
                                ("--pruned", args.pruned)) if v]
        if given:
            raise HeadPruneError(f"--synthetic builds its own models and sentences: drop "
                                 f"{', '.join(given)}.")
        refuse_overwrite(args)
        report = synthetic_bench(args.synthetic, args.beam, args.batch_sizes,
                                 args.max_sentences or 64, args.repeats, args.device,
                                 args.fixed_length or 25, args.src_len, args.vocab,
                                 args.prune_share, args.seed, args.dtype)
    else:
        missing = [o for o, v in (("DATA", args.data), ("--path", args.path),
                                  ("--pruned", args.pruned)) if not v]
        if missing:
            raise HeadPruneError(f"bench needs DATA, --path and --pruned (or --synthetic "
                                 f"base|big): {', '.join(missing)} missing.")
        refuse_overwrite(args, args.path, args.pruned)
        report = run_bench(args.data, args.path, args.pruned, args.subset, args.beam,
                           args.batch_sizes, args.max_sentences or 200, args.repeats,
                           args.device, None if args.free_length else args.fixed_length,
                           args.dtype)
    if args.output:
        write_json(args.output, report)
    print(format_bench(report))


def cmd_compare(args):
    from fairseq_headprune.errors import HeadPruneError
    from fairseq_headprune.evaluation.compare import compare_runs, parse_runs

    runs = parse_runs(args.runs)
    out = os.path.realpath(args.output_dir)
    for label, path in runs:
        if os.path.realpath(path) == out:
            raise HeadPruneError(f"-o {args.output_dir} is the input checkpoint {path}: write to "
                                 f"another folder.")
    if os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        raise HeadPruneError(f"cannot write -o {args.output_dir}: it is a file, not a folder.")
    check_writable(args.output_dir)
    result = compare_runs(args.data, runs, args.output_dir, args.subset, args.beam,
                          args.max_tokens, args.max_sentences, args.device,
                          args.bootstrap_samples, args.seed, not args.no_bench,
                          args.bench_batch_sizes, args.bench_sentences, args.repeats, args.note,
                          args.lenpen)
    with open(os.path.join(args.output_dir, "compare.md"), encoding="utf-8") as f:
        print(f.read(), end="")
    print(f"results: {os.path.join(args.output_dir, 'compare')}.json/.csv/.md/.png "
          f"({len(result['rows'])} runs)")


def cmd_ablate(args):
    from fairseq_headprune.evaluation.ablation import run_ablation

    check_writable(args.output_dir)
    result = run_ablation(args.data, args.path, args.output_dir, args.mode, args.types,
                          args.importance, args.subset, args.beam, args.max_tokens,
                          args.max_sentences, args.device)
    for row in result["rows"]:
        print(f"{row['spec'] or 'unpruned':40s} BLEU {row['bleu']:6.2f} ({row['delta']:+.2f})")
    print(f"signature: {result['rows'][0]['signature']}")


def add_decoding_options(p, device: str):
    """The options of every subcommand that decodes a subset with beam search."""
    p.add_argument("--subset", default="test", help="(default: %(default)s)")
    p.add_argument("--beam", type=count, default=5, help="(default: %(default)s)")
    p.add_argument("--max-tokens", type=count, default=4000, help="(default: %(default)s)")
    p.add_argument("--max-sentences", type=count, help="decode only the first N sentences")
    p.add_argument("--device", default=device, help="(default: %(default)s)")


def add_lenpen(p):
    p.add_argument("--lenpen", type=finite, default=1.0,
                   help="fairseq-generate's length penalty: hypotheses ranked by log-probability "
                        "/ length^LENPEN (default: %(default)s)")


def add_parsers(sub):
    device = default_device()

    p = sub.add_parser("sweep", help="BLEU vs. share of heads pruned, with plots")
    p.add_argument("data", help="fairseq-preprocess output folder")
    p.add_argument("--path", required=True, help="transformer_headprune checkpoint")
    p.add_argument("--importance", required=True, help="importance JSON")
    p.add_argument("-o", "--output-dir", required=True, help="results folder (resumable)")
    p.add_argument("--levels", type=floats, default=[i / 10 for i in range(10)],
                   help="fractions pruned (default: 0,0.1,...,0.9)")
    p.add_argument("--curves", nargs="+", default=["all", "E", "D", "A"],
                   help="all types together and/or one type alone (default: %(default)s)")
    add_decoding_options(p, device)
    p.add_argument("--keep-one-per-layer", action="store_true", help="never empty a layer")
    p.add_argument("--iterative", action="store_true",
                   help="re-score the pruned model before each level (curve 'all')")
    p.add_argument("--rescore-subset", default="valid", help="(default: %(default)s)")
    p.add_argument("--save-levels", type=floats, default=[],
                   help="levels whose pruned checkpoint to write, e.g. 0.5")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("ablate", help="Michel et al.'s ablations: remove one head at a time "
                                      "(Table 1) or keep only the best head of a layer (Table 2)")
    p.add_argument("data", help="fairseq-preprocess output folder")
    p.add_argument("--path", required=True, help="transformer_headprune checkpoint")
    p.add_argument("--mode", choices=["single", "best-per-layer"], default="single",
                   help="(default: %(default)s)")
    p.add_argument("--types", type=types_arg, default="EDA",
                   help="attention types (default: %(default)s)")
    p.add_argument("--importance", help="importance JSON (best-per-layer ranks heads by it)")
    p.add_argument("-o", "--output-dir", required=True, help="results folder (resumable)")
    add_decoding_options(p, device)
    p.set_defaults(func=cmd_ablate)

    p = sub.add_parser("evaluate", help="BLEU, heads and parameters of checkpoints on one subset")
    p.add_argument("data", help="fairseq-preprocess output folder")
    p.add_argument("--paths", nargs="+", required=True, help="transformer_headprune checkpoints")
    p.add_argument("--labels", nargs="+", help="a name per checkpoint (default: file names)")
    p.add_argument("-o", "--output", required=True, help="rows JSON to write (resumable)")
    add_decoding_options(p, device)
    add_lenpen(p)
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser(
        "compare", help="checkpoints side by side on one subset: BLEU and chrF with sacrebleu's "
                        "paired bootstrap test against the first, heads kept, parameters, file "
                        "size, decoding speed; JSON, CSV, Markdown and a plot")
    p.add_argument("data", help="fairseq-preprocess output folder")
    p.add_argument("--runs", nargs="+", required=True, metavar="[LABEL=]PATH",
                   help="transformer_headprune checkpoints, the baseline first; LABEL defaults "
                        "to the file name without .pt; LABEL METHOD/SETTING (michel/50) makes the "
                        "runs of one METHOD one line of the plot")
    p.add_argument("-o", "--output-dir", required=True,
                   help="results folder: compare.json/.csv/.md/.png (resumable)")
    add_decoding_options(p, device)
    add_lenpen(p)
    p.add_argument("--bootstrap-samples", type=count, default=1000,
                   help="resamples of the paired bootstrap test (default: %(default)s)")
    p.add_argument("--seed", type=count, default=12345,
                   help="resampling seed, >= 1 (default: sacrebleu's, %(default)s)")
    p.add_argument("--bench-batch-sizes", type=ints, default=[1, 64],
                   help="batch sizes of the speed measurement (default: 1,64)")
    p.add_argument("--bench-sentences", type=count, default=200,
                   help="sentences timed per run and round (default: %(default)s)")
    p.add_argument("--repeats", type=count, default=3,
                   help="interleaved timing rounds after a warm-up; the median counts (default: %(default)s)")
    p.add_argument("--no-bench", action="store_true", help="skip the speed measurement")
    p.add_argument("--note", help="a sentence saved with the results and printed above the "
                                  "table (e.g. how the runs were made)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("bench", help="decoding speed: unpruned vs physically pruned")
    p.add_argument("data", nargs="?", help="fairseq-preprocess output folder")
    p.add_argument("--path", help="unpruned checkpoint")
    p.add_argument("--pruned", help="pruned checkpoint")
    p.add_argument("--synthetic", choices=["base", "big"],
                   help="instead of checkpoints: random-weight models of this standard size "
                        "(base: 6+6 layers, 512 dims, 8 heads; big: 1024 dims, 16 heads) and a "
                        "copy with --prune-share of every module's heads removed, decoding "
                        "random sentences")
    p.add_argument("--prune-share", type=share_open, default=0.5,
                   help="with --synthetic: share of each module's heads removed "
                        "(default: %(default)s)")
    p.add_argument("--src-len", type=count, default=25,
                   help="with --synthetic: source tokens per sentence (default: %(default)s)")
    p.add_argument("--vocab", type=count, default=32000,
                   help="with --synthetic: joined vocabulary size (default: %(default)s)")
    p.add_argument("--seed", type=count0, default=0,
                   help="with --synthetic: weights, sentences and removed heads "
                        "(default: %(default)s)")
    p.add_argument("--subset", default="test", help="(default: %(default)s)")
    p.add_argument("--beam", type=count, default=5, help="(default: %(default)s)")
    p.add_argument("--batch-sizes", type=ints, default=[1, 64], help="(default: 1,64)")
    p.add_argument("--max-sentences", type=count,
                   help="sentences decoded per round (default: 200; 64 with --synthetic)")
    p.add_argument("--repeats", type=count, default=3,
                   help="interleaved rounds after one warm-up; figures are the median with "
                        "the min-max range (default: %(default)s)")
    p.add_argument("--dtype", choices=["fp32", "fp16", "bf16"], default="fp32",
                   help="model and activations; fp16/bf16 on a GPU (default: %(default)s)")
    p.add_argument("--fixed-length", type=count0, default=0,
                   help="force every hypothesis to this many tokens so both models decode the "
                        "same steps; 0: the mean reference length, or 25 with --synthetic "
                        "(default: %(default)s)")
    p.add_argument("--free-length", action="store_true",
                   help="decode freely instead (a worse model may decode longer)")
    p.add_argument("--device", default=device, help="(default: %(default)s)")
    p.add_argument("-o", "--output", help="report JSON to write")
    p.set_defaults(func=cmd_bench)
