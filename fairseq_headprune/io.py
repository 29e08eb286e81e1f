"""Atomic output files: a command that fails leaves no partial or corrupt file behind."""

import contextlib
import glob
import hashlib
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
    old = saved.get("config") or {}
    if old != config:
        changed = [k for k in config if old.get(k) != config[k]] + [
            k for k in old if k not in config]
        raise HeadPruneError(f"{path} holds {what} with other settings ({', '.join(changed)} "
                             f"changed); use another --output-dir or delete it.")
    return saved["rows"]


def sha256_file(path: str) -> str:
    """The sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def data_fingerprint(data: str, subset: str) -> str:
    """One sha256 over a fairseq data-bin's dictionaries and the files of one split, so that a
    resumed run notices another DATA (or a rebuilt one) behind the same path."""
    digest = hashlib.sha256()
    names = sorted(n for n in os.listdir(data)
                   if n.startswith(subset + ".") or (n.startswith("dict.") and n.endswith(".txt")))
    for name in names:
        digest.update(name.encode() + b"\0" + sha256_file(os.path.join(data, name)).encode())
    return digest.hexdigest()


def write_json(path: str, data):
    """Write ``data`` as indented JSON, atomically."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=False)
        f.write("\n")


def write_text(path: str, text: str):
    """Write ``text`` atomically."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)


def check_writable(output: str, option: str):
    """One sentence, before any work, unless ``output`` (a file or folder to write, given as
    ``option``) can be created: its nearest existing folder must be a folder and writable."""
    place = os.path.abspath(output)
    if not os.path.isdir(place):
        place = os.path.dirname(place)
        while not os.path.exists(place):
            place = os.path.dirname(place)
    if not os.path.isdir(place):
        raise HeadPruneError(f"cannot write {option} {output}: {place} is a file, not a folder.")
    if not os.access(place, os.W_OK | os.X_OK):
        raise HeadPruneError(f"cannot write {option} {output}: the folder {place} is not "
                             f"writable.")
