"""Atomic output files: a command that fails leaves no partial or corrupt file behind."""

import contextlib
import glob
import json
import os
import tempfile

from fairseq_headprune.errors import HeadPruneError


@contextlib.contextmanager
def atomic_path(path: str):
    """Yield a temporary path beside ``path``; move it onto ``path`` only if the block succeeds.

    The temporary file is named ``.tmp-PID-XXXX<name>``; one left by a writer that was killed
    (SIGKILL, power loss) is removed by the next write of the same file, once its PID is gone."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    _remove_stale(directory, os.path.basename(path))
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{os.getpid()}-", suffix=os.path.basename(path),
                               dir=directory)
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


def _remove_stale(directory: str, name: str):
    """Delete ``.tmp-PID-*name`` files whose writer process no longer exists."""
    for stale in glob.glob(os.path.join(glob.escape(directory), ".tmp-*-*" + glob.escape(name))):
        pid = os.path.basename(stale)[len(".tmp-"):].split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            try:
                os.unlink(stale)
            except FileNotFoundError:
                pass
        except PermissionError:  # alive, another user's
            pass


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
