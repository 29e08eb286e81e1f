#!/usr/bin/env python
"""Cost of the gates: transformer_headprune with every gate open versus the stock transformer.

Builds both models with identical weights in one process and prints the ratio (masked / stock)
of the median training-step time (forward + backward) and of the median beam-search time.
"""

import argparse
import logging
from argparse import Namespace

import torch
from fairseq.data import Dictionary
from fairseq.models.transformer import TransformerModel, base_architecture
from fairseq.sequence_generator import SequenceGenerator

from fairseq_headprune.evaluation.timing import interleaved_times, median
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

    tokens = torch.randint(dictionary.nspecial, len(dictionary), (opts.batch, opts.length),
                           device=opts.device)
    lengths = torch.full((opts.batch,), opts.length, device=opts.device)
    prev = torch.roll(tokens, 1, dims=1)

    def train_step(model):
        model.train()
        model.zero_grad()
        logits, _ = model(tokens, lengths, prev)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()

    sample = {"net_input": {"src_tokens": tokens, "src_lengths": lengths}}

    def generate(model):
        model.eval()
        gen = SequenceGenerator([model], dictionary, beam_size=opts.beam, max_len_a=0,
                                max_len_b=opts.length, min_len=opts.length)
        with torch.no_grad():
            gen.generate([model], sample)

    train = interleaved_times({"stock": lambda: train_step(stock),
                               "masked": lambda: train_step(masked)}, opts.repeats)
    decode = interleaved_times({"stock": lambda: generate(stock),
                                "masked": lambda: generate(masked)}, opts.repeats)
    print(f"device {opts.device}, {opts.layers}+{opts.layers} layers, d={opts.embed_dim}, "
          f"{opts.heads} heads, batch {opts.batch} x {opts.length} tokens, beam {opts.beam}")
    for name, times in (("training step", train), ("generate", decode)):
        s, m = median(times["stock"]), median(times["masked"])
        print(f"{name:14s} stock {s * 1000:8.1f} ms  masked {m * 1000:8.1f} ms  "
              f"ratio masked/stock {m / s:.3f}")


if __name__ == "__main__":
    main()
