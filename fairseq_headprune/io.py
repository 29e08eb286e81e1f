"""Atomic output files: a command that fails leaves no partial or corrupt file behind."""

import contextlib
import json
import os
import tempfile

from fairseq_headprune.errors import HeadPruneError


@contextlib.contextmanager
def atomic_path(path: str):
    """Yield a temporary path beside ``path``; move it onto ``path`` only if the block succeeds."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.basename(path), dir=directory)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600 files; give the usual permissions
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_rows(path: str, config: dict, what: str) -> list:
    """The rows of a resumable results file, [] if there is none; ``what`` names the run in the
    error raised when the file was written with another ``config``."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        saved = json.load(f)
    if saved.get("config") != config:
        raise HeadPruneError(f"{path} holds {what} with other settings; use another --output-dir "
                             f"or delete it.")
    return saved["rows"]


def write_json(path: str, data):
    """Write ``data`` as indented JSON, atomically."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=False)
        f.write("\n")


def write_text(path: str, text: str):
    """Write ``text`` atomically."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
