"""Decoding, BLEU sweeps, ablations, speed benchmarks, cost model, plots and result summaries;
they work on any method's importance file or pruned checkpoint."""
