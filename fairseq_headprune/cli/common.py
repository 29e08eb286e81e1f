"""Small helpers shared by the subcommand modules: list options and the default device."""

import os


def floats(text):
    return [float(x) for x in text.split(",") if x]


def ints(text):
    return [int(x) for x in text.split(",") if x]


def file_size(path: str) -> str:
    return f"{os.path.getsize(path) / 2**20:.2f} MiB"


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
