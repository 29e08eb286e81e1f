"""The vocabulary every layer shares: head specs (1-based text, 0-based in memory), head layouts
and the importance-table contract. Imports nothing of ours but ``errors``."""
