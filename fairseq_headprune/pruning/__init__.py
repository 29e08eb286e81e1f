"""Destructive and checkpoint-level steps shared by every method: choose heads, mask, remove,
fold gates, convert stock checkpoints, read and write checkpoints."""
