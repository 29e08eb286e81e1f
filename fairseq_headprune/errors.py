"""The one exception type that command-line tools turn into a one-sentence error and exit 2."""


class HeadPruneError(Exception):
    """A user-facing error: bad head spec, missing or corrupt checkpoint, wrong architecture."""
