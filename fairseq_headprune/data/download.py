"""Fetch and unpack the archives of a reproduction, each once.

A file is downloaded to ``NAME.part`` and renamed when complete, so an interrupted download is
never taken for a finished one; a file already present is skipped. Any URL scheme that
:mod:`urllib` reads works, ``file://`` included (the offline test mirror of
``tests/test_reproduce.py`` uses it). Archives (``.tgz``, ``.tar.gz``, ``.tar``, ``.tar.bz2``)
are unpacked beside themselves once, remembered by a ``.NAME.unpacked`` marker, so that
``DIR/training/europarl-v7.de-en.en`` exists after ``training-parallel-europarl-v7.tgz``, as
fairseq's ``examples/translation/prepare-*.sh`` expect.

    python -m fairseq_headprune.data.download -o DIR --extract URL [URL ...]
"""

import argparse
import os
import sys
import tarfile
import urllib.error
import urllib.request
from typing import List

from tqdm import tqdm

from fairseq_headprune.errors import HeadPruneError

ARCHIVES = (".tgz", ".tar.gz", ".tar", ".tar.bz2")


def fetch(url: str, directory: str) -> str:
    """Download ``url`` into ``directory`` under its own file name, unless it is there; returns
    the path. One sentence (:class:`HeadPruneError`) when the URL cannot be read."""
    name = os.path.basename(url.rstrip("/"))
    path = os.path.join(directory, name)
    if os.path.exists(path):
        return path
    os.makedirs(directory, exist_ok=True)
    part = path + ".part"
    try:
        with urllib.request.urlopen(url) as response, open(part, "wb") as out:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=name) as bar:
                for block in iter(lambda: response.read(1 << 20), b""):
                    out.write(block)
                    bar.update(len(block))
    except (urllib.error.URLError, OSError, ValueError) as err:
        if os.path.exists(part):
            os.unlink(part)
        reason = getattr(err, "reason", None) or err
        raise HeadPruneError(f"could not download {url}: {reason}.") from None
    os.replace(part, path)
    return path


def extract(path: str) -> bool:
    """Unpack the archive ``path`` into its folder once; False when ``path`` is no archive."""
    if not path.endswith(ARCHIVES):
        return False
    directory, name = os.path.split(path)
    marker = os.path.join(directory, f".{name}.unpacked")
    if os.path.exists(marker):
        return True
    try:
        with tarfile.open(path) as tar:
            members = tar.getmembers()
            for m in members:  # no absolute paths or '..' out of the folder
                if os.path.isabs(m.name) or ".." in m.name.split("/"):
                    raise HeadPruneError(f"{path} holds the unsafe member {m.name!r}.")
            for m in tqdm(members, desc=f"unpack {name}", unit="file"):
                tar.extract(m, directory)
    except (tarfile.TarError, EOFError, OSError):
        raise HeadPruneError(f"{path} is not a readable archive: delete it and rerun to "
                             f"download it again.") from None
    open(marker, "w").close()
    return True


def fetch_all(urls: List[str], directory: str, unpack: bool = True) -> List[str]:
    """:func:`fetch` (and :func:`extract`) every URL in order; returns the local paths."""
    paths = []
    for url in urls:
        paths.append(fetch(url, directory))
        if unpack:
            extract(paths[-1])
    return paths


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("urls", nargs="+", help="http(s)://, ftp:// or file:// URLs")
    parser.add_argument("-o", "--output-dir", required=True, help="download folder")
    parser.add_argument("--extract", action="store_true", help="unpack archives once")
    opts = parser.parse_args(argv)
    try:
        for path in fetch_all(opts.urls, opts.output_dir, opts.extract):
            print(path)
    except HeadPruneError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")


if __name__ == "__main__":
    main(sys.argv[1:])
