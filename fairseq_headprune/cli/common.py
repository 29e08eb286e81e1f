"""Small helpers shared by the subcommand modules: list options, the default device, and the
guard that keeps a command from writing over its own input."""

import argparse
import math
import os


def _number(text, cast, what):
    try:
        value = cast(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got '{text}'") from None
    return value


def _checked(cast, ok, what):
    """An argparse ``type=``: ``cast`` the text and keep it only where ``ok``; else one sentence."""
    def parse(text):
        value = _number(text, cast, what)
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {what}, got '{text}'")
        return value
    parse.__name__ = what
    return parse


def _list_of(item):
    def parse(text):
        values = [item(x) for x in text.split(",") if x.strip()]
        if not values:
            raise argparse.ArgumentTypeError(f"needs at least one value, got '{text}'")
        return values
    return parse


count = _checked(int, lambda v: v >= 1, "a whole number >= 1")
count0 = _checked(int, lambda v: v >= 0, "a whole number >= 0")
fraction = _checked(float, lambda v: math.isfinite(v) and 0 <= v < 1, "a fraction in [0, 1)")
share = _checked(float, lambda v: math.isfinite(v) and 0 < v < 0.5, "a share in (0, 0.5)")
share_open = _checked(float, lambda v: math.isfinite(v) and 0 < v < 1, "a share in (0, 1)")
portion = _checked(float, lambda v: math.isfinite(v) and 0 < v <= 1, "a share in (0, 1]")
amount = _checked(float, lambda v: math.isfinite(v) and v > 0,
                  "a fraction (< 1) or a count (>= 1) of heads, above 0")
finite = _checked(float, math.isfinite, "a finite number")
floats = _list_of(fraction)  # e.g. --levels 0,0.1,0.5
ints = _list_of(count)  # e.g. --batch-sizes 1,64


def types_arg(text):
    """``EDA``-style attention types: known letters, each once, in E, D, A order."""
    letters = [c for c in text if c not in ", "]
    bad = [c for c in letters if c not in "EDA"]
    if bad or not letters:
        raise argparse.ArgumentTypeError(
            f"must be letters among E (encoder self), D (decoder self), A (encoder-decoder), "
            f"got '{text}'")
    return "".join(k for k in "EDA" if k in letters)


def file_size(path: str) -> str:
    return f"{os.path.getsize(path) / 2**20:.2f} MiB"


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def refuse_overwrite(args, *inputs: str):
    """One sentence unless ``-o`` names a file other than every input: no command writes over
    one of its inputs (a pruned model written over its source loses the source)."""
    from fairseq_headprune.errors import HeadPruneError

    if not getattr(args, "output", None):
        return
    out = os.path.realpath(args.output)
    for path in inputs:
        if path and os.path.realpath(path) == out:
            what = "checkpoint" if _is_checkpoint(path) else "file"
            raise HeadPruneError(f"-o {args.output} is the input {what} {path}: write to "
                                 f"another file.")
    check_writable(args.output)


def check_writable(output: str):
    """:func:`fairseq_headprune.io.check_writable` for ``-o``."""
    from fairseq_headprune.io import check_writable as check

    check(output, "-o")


def _is_checkpoint(path: str) -> bool:
    """A torch zip file (what fairseq writes), by its first bytes."""
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"PK"
    except OSError:
        return False
