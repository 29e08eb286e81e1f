"""Small helpers shared by the subcommand modules: list options, the default device, and the
guard that keeps a command from writing over its own input."""

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


def refuse_overwrite(args, *inputs: str):
    """One sentence unless ``-o`` names a file other than every input (or ``--overwrite-input``
    asks for it): a pruned model written over its source loses the source."""
    from fairseq_headprune.errors import HeadPruneError

    if not getattr(args, "output", None):
        return
    out = os.path.realpath(args.output)
    for path in inputs:
        if path and os.path.realpath(path) == out and not getattr(args, "overwrite_input", False):
            what = "checkpoint" if _is_checkpoint(path) else "file"
            raise HeadPruneError(f"-o {args.output} is the input {what} {path}: write to "
                                 f"another file, or pass --overwrite-input to replace it.")


def add_overwrite_option(parser):
    parser.add_argument("--overwrite-input", action="store_true",
                        help="allow -o to name the input checkpoint (replaced atomically)")


def _is_checkpoint(path: str) -> bool:
    """A torch zip file (what fairseq writes), by its first bytes."""
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"PK"
    except OSError:
        return False
