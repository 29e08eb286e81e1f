"""The one exception type that command-line tools turn into a one-sentence error and a nonzero exit."""

import sys


class HeadPruneError(Exception):
    """A user-facing error: bad head spec, missing or corrupt checkpoint, wrong architecture."""


def install_error_hook():
    """Inside fairseq's own commands (fairseq-train/-validate/-generate with ``--user-dir``), print
    an uncaught :class:`HeadPruneError` as its one sentence instead of a traceback (the process
    still exits nonzero); every other exception keeps Python's usual report. Idempotent."""
    previous = sys.excepthook
    if getattr(previous, "headprune", False):
        return

    def hook(exc_type, exc, tb):
        if issubclass(exc_type, HeadPruneError):
            sys.stderr.write(f"{sys.argv[0].rsplit('/', 1)[-1]}: error: {exc}\n")
        else:
            previous(exc_type, exc, tb)

    hook.headprune = True
    sys.excepthook = hook
