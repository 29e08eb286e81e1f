#!/usr/bin/env python
"""Cost of the gates: transformer_headprune with every gate open versus the stock transformer,
and (``--gates KIND``) with a gate module of that kind versus without, and (``--group-constraint
C``) a training update with Ni et al. (2023)'s group constraint (k-means of every module's heads
into C groups, the criterion's loss) versus without.

Builds the models with identical weights in one process, times them interleaved on the same
batch, and prints per model the median [min-max] of a training update (forward, backward and an
Adam step) and of beam search, and the ratios of the medians: masked / stock, gated / masked.
"""

import argparse
import logging
from argparse import Namespace
from contextlib import nullcontext

import torch
from fairseq.data import Dictionary
from fairseq.models.transformer import TransformerModel, base_architecture
from fairseq.sequence_generator import SequenceGenerator

from fairseq_headprune import register  # noqa: F401  (gate kinds)
from fairseq_headprune.evaluation.timing import interleaved_times, median
from fairseq_headprune.methods.gha import FeatureTap, constraint_loss
from fairseq_headprune.model.gates import GATE_REGISTRY
from fairseq_headprune.model.transformer import HeadPruneTransformerModel


def build(cls, arch_fn, dictionary, args):
    args = Namespace(**vars(args))
    arch_fn(args)
    task = Namespace(source_dictionary=dictionary, target_dictionary=dictionary)
    return cls.build_model(args, task)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=6, help="(default: %(default)s)")
    parser.add_argument("--embed-dim", type=int, default=512, help="(default: %(default)s)")
    parser.add_argument("--heads", type=int, default=8, help="(default: %(default)s)")
    parser.add_argument("--vocab", type=int, default=8000, help="(default: %(default)s)")
    parser.add_argument("--batch", type=int, default=32, help="sentences (default: %(default)s)")
    parser.add_argument("--length", type=int, default=24, help="tokens (default: %(default)s)")
    parser.add_argument("--beam", type=int, default=5, help="(default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=5, help="(default: %(default)s)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="(default: %(default)s)")
    parser.add_argument("--gates", choices=sorted(GATE_REGISTRY),
                        help="also time a model with this gate kind on every head")
    parser.add_argument("--gate-types", default="E,D,A", help="(default: %(default)s)")
    parser.add_argument("--gate-option", action="append", default=[], metavar="NAME=VALUE",
                        help="a model option of the gate kind, e.g. subset_heads=25%% "
                             "(default for subset: subset_heads=50%%)")
    parser.add_argument("--group-constraint", type=int, metavar="C",
                        help="also time training updates with the GHA group constraint, C groups")
    parser.add_argument("--group-feature", default="headout", help="(default: %(default)s)")
    opts = parser.parse_args()
    logging.getLogger("fairseq").setLevel(logging.WARNING)

    torch.manual_seed(0)
    dictionary = Dictionary()
    for i in range(opts.vocab):
        dictionary.add_symbol(f"w{i}")
    args = Namespace(
        encoder_layers=opts.layers, decoder_layers=opts.layers,
        encoder_embed_dim=opts.embed_dim, decoder_embed_dim=opts.embed_dim,
        encoder_ffn_embed_dim=4 * opts.embed_dim, decoder_ffn_embed_dim=4 * opts.embed_dim,
        encoder_attention_heads=opts.heads, decoder_attention_heads=opts.heads,
        dropout=0.1, encoder_layers_to_keep=None, decoder_layers_to_keep=None,
        share_all_embeddings=True, share_decoder_input_output_embed=True)
    stock = build(TransformerModel, base_architecture, dictionary, args).to(opts.device)
    masked = build(HeadPruneTransformerModel, base_architecture, dictionary, args).to(opts.device)
    masked.load_state_dict(stock.state_dict(), strict=False)
    models = {"stock": stock, "masked": masked}
    if opts.gates:
        extra = {"subset_heads": "50%"} if opts.gates == "subset" else {}
        for option in opts.gate_option:
            name, sep, value = option.partition("=")
            if not sep:
                parser.error(f"--gate-option '{option}' is not NAME=VALUE")
            extra[name.strip().replace("-", "_")] = value
        gated_args = Namespace(**vars(args), head_gates=opts.gates,
                               head_gates_types=opts.gate_types, **extra)
        gated = build(HeadPruneTransformerModel, base_architecture, dictionary, gated_args)
        gated.load_state_dict(stock.state_dict(), strict=False)
        models["gated"] = gated.to(opts.device)
    if opts.group_constraint:
        grouped = build(HeadPruneTransformerModel, base_architecture, dictionary, args)
        grouped.load_state_dict(stock.state_dict(), strict=False)
        models["grouped"] = grouped.to(opts.device)
    optimizers = {name: torch.optim.Adam(m.parameters(), lr=1e-4) for name, m in models.items()}

    tokens = torch.randint(dictionary.nspecial, len(dictionary), (opts.batch, opts.length),
                           device=opts.device)
    lengths = torch.full((opts.batch,), opts.length, device=opts.device)
    prev = torch.roll(tokens, 1, dims=1)

    def train_step(name):
        model = models[name]
        model.train()
        model.zero_grad()
        with FeatureTap(model, "EDA", opts.group_feature) if name == "grouped" else nullcontext(
                ) as tap:
            logits, _ = model(tokens, lengths, prev)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
        if name == "grouped":
            loss = loss + constraint_loss(tap, opts.group_constraint)
        loss.backward()
        optimizers[name].step()

    sample = {"net_input": {"src_tokens": tokens, "src_lengths": lengths}}

    def generate(name):
        model = models[name]
        model.eval()
        gen = SequenceGenerator([model], dictionary, beam_size=opts.beam, max_len_a=0,
                                max_len_b=opts.length, min_len=opts.length)
        with torch.no_grad():
            gen.generate([model], sample)

    train = interleaved_times({n: (lambda n=n: train_step(n)) for n in models}, opts.repeats)
    decode = interleaved_times({n: (lambda n=n: generate(n)) for n in models if n != "grouped"},
                               opts.repeats)
    print(f"device {opts.device}, {opts.layers}+{opts.layers} layers, d={opts.embed_dim}, "
          f"{opts.heads} heads, batch {opts.batch} x {opts.length} tokens, beam {opts.beam}, "
          f"{opts.repeats} repeats" + (f", gates {opts.gates} on {opts.gate_types}"
                                       if opts.gates else "")
          + (f", group constraint C={opts.group_constraint} on {opts.group_feature}"
             if opts.group_constraint else "")
          + "".join(f", {k}={v}" for k, v in (extra if opts.gates else {}).items()))
    for what, times in (("update", train), ("generate", decode)):
        cells = "  ".join(f"{n} {median(t) * 1000:7.1f} ms [{min(t) * 1000:.1f}-"
                          f"{max(t) * 1000:.1f}]" for n, t in times.items())
        ratios = f"masked/stock {median(times['masked']) / median(times['stock']):.3f}"
        if "gated" in times:
            ratios += f"  gated/masked {median(times['gated']) / median(times['masked']):.3f}"
        if "grouped" in times:
            ratios += (f"  grouped/masked "
                       f"{median(times['grouped']) / median(times['masked']):.3f}")
        print(f"{what:9s} {cells}  ratio {ratios}")


if __name__ == "__main__":
    main()
