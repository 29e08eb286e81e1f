"""The prunable Transformer: masked attention, layers, the ``transformer_headprune`` archs and the
gate seam (a registry of gate kinds). Knows nothing of any method."""
