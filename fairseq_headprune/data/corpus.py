"""An offline parallel corpus from gettext catalogs (the .mo files every Linux machine carries).

Each catalog entry pairs an English message (``msgid``) with its human translation (``msgstr``),
the same kind of text as OPUS's GNOME/KDE/Ubuntu corpora. The builder keeps translated, non-fuzzy
singular and plural entries, strips keyboard accelerators, drops entries that are mostly format
strings or markup, deduplicates on the source side, splits deterministically by a hash of the
source (so adding catalogs never moves an existing sentence between splits), trains a joint
sentencepiece model and binarises with ``fairseq-preprocess``.

``polib`` parses both compiled ``.mo`` and source ``.po`` catalogs (plural forms, contexts and
fuzzy flags included), which the standard library's ``gettext`` cannot do for ``.po``.
"""

import glob
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from typing import Dict, Iterable, List, Optional, Tuple

import polib

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.io import sha256_file, write_json, write_text

logger = logging.getLogger(__name__)

MAX_WORDS, MIN_LETTER_SHARE = 50, 0.5  # the filters (recorded in the manifest)
# Debian/Ubuntu packages that carry many catalogs (glibc, ISO names, GnuPG, util-linux, ...)
CATALOG_PACKAGES = ("libc-l10n", "iso-codes", "gnupg-l10n", "util-linux-locales", "gettext",
                    "git", "xkb-data", "coreutils")

_FORMAT = re.compile(
    r"%(?:\d+\$)?[-+ #0']*\d*(?:\.\d+)?(?:hh|h|ll|l|L|q|j|z|t|I64|PRI\w+)?[diouxXeEfgGcsSpm%]"
    r"|\{[^{}]*\}|\$\{[^{}]*\}|\$\w+|<[^<>]+>|&\w+;")
_SPACE = re.compile(r"\s+")


def clean(text: str) -> str:
    """One line, the keyboard accelerator (GNOME ``_File``, KDE ``&Open``, ``~Save``) removed,
    spaces collapsed. A marker that occurs more than once (``snake_case_name``) is text."""
    for mark in "_&~":
        if text.count(mark) == 1 and re.search(re.escape(mark) + r"\w(?!\w*;)", text):
            text = text.replace(mark, "", 1)
    return _SPACE.sub(" ", text).strip()


def is_prose(text: str, min_letter_share: float = MIN_LETTER_SHARE) -> bool:
    """True when ``text`` is language, not mostly format specifiers, markup or symbols."""
    stripped = _FORMAT.sub(" ", text)
    letters = sum(ch.isalpha() for ch in stripped)
    words = [w for w in stripped.split() if any(ch.isalpha() for ch in w)]
    return len(words) >= 2 and letters >= min_letter_share * max(len(text.replace(" ", "")), 1)


def catalog_files(paths: Iterable[str], lang: str) -> List[str]:
    """Expand locale roots (``/usr/share/locale``) and folders of .mo/.po files into file paths."""
    files = []
    for path in paths:
        if os.path.isfile(path):
            files.append(path)
            continue
        under_locale = os.path.join(path, lang, "LC_MESSAGES")
        root = under_locale if os.path.isdir(under_locale) else path
        files.extend(sorted(glob.glob(os.path.join(root, "**", "*.[mp]o"), recursive=True)))
    return files


def read_pairs(files: Iterable[str], counts: Optional[Dict[str, int]] = None
               ) -> Iterable[Tuple[str, str]]:
    """Yield (English source, translation) pairs of every usable entry of the catalogs; with
    ``counts``, also count the pairs each catalog gave (before filtering)."""
    for path in files:
        try:
            catalog = polib.mofile(path) if path.endswith(".mo") else polib.pofile(path)
        except (OSError, ValueError, UnicodeDecodeError) as err:
            logger.warning("skipping unreadable catalog %s: %s", path, err)
            continue
        for entry in catalog:
            if entry.obsolete or "fuzzy" in entry.flags or not entry.msgid:
                continue
            if entry.msgid_plural:
                forms = entry.msgstr_plural
                candidates = [(entry.msgid, forms.get(0, "")),
                              (entry.msgid_plural, forms.get(1, ""))]
            else:
                candidates = [(entry.msgid, entry.msgstr)]
            for src, tgt in candidates:
                if tgt:
                    if counts is not None:
                        counts[path] = counts.get(path, 0) + 1
                    yield src, tgt


def filter_pairs(pairs: Iterable[Tuple[str, str]], max_words: int = MAX_WORDS
                 ) -> Dict[str, str]:
    """Clean, filter and deduplicate: one translation per source (the most frequent, then the
    alphabetically first), prose on both sides, not copied untranslated, at most ``max_words``."""
    counts: Dict[str, Counter] = {}
    for src, tgt in pairs:
        src, tgt = clean(src), clean(tgt)
        if src == tgt or not is_prose(src) or not is_prose(tgt):
            continue
        if len(src.split()) > max_words or len(tgt.split()) > max_words:
            continue
        counts.setdefault(src, Counter())[tgt] += 1
    return {src: min(c.items(), key=lambda kv: (-kv[1], kv[0]))[0] for src, c in counts.items()}


def split_of(src: str, valid_share: float, test_share: float) -> str:
    """Deterministic split by a hash of the source sentence."""
    bucket = int(hashlib.sha1(src.encode("utf-8")).hexdigest()[:8], 16) / 0xFFFFFFFF
    if bucket < test_share:
        return "test"
    if bucket < test_share + valid_share:
        return "valid"
    return "train"


def split_pairs(pairs: Dict[str, str], valid_share: float, test_share: float
                ) -> Dict[str, List[Tuple[str, str]]]:
    splits = {"train": [], "valid": [], "test": []}
    for src in sorted(pairs):
        splits[split_of(src, valid_share, test_share)].append((src, pairs[src]))
    return splits


def build_corpus(sources: List[str], out_dir: str, src_lang: str = "en", tgt_lang: str = "de",
                 valid_share: float = 0.03, test_share: float = 0.03, vocab_size: int = 8000,
                 workers: int = 1) -> Dict[str, int]:
    """Build raw text, sentencepiece pieces and fairseq binaries under ``out_dir``.

    Args:
        sources: locale roots (``/usr/share/locale``), folders or single .mo/.po files.
        out_dir: destination; ``raw/``, ``spm/``, ``bin/`` and ``corpus.json`` are written.
        src_lang, tgt_lang: the pair; catalogs are English-source, so one of them must be ``en``.
        valid_share, test_share: fractions of distinct sources sent to valid and test.
        vocab_size: joint sentencepiece vocabulary size (shrunk for tiny corpora).
        workers: fairseq-preprocess workers.

    Returns:
        number of pairs per split.
    """
    import sentencepiece as spm

    if "en" not in (src_lang, tgt_lang) or src_lang == tgt_lang:
        raise HeadPruneError(
            f"catalogs translate from English: one of --src-lang/--tgt-lang must be 'en', "
            f"got {src_lang}-{tgt_lang}.")
    other = tgt_lang if src_lang == "en" else src_lang
    for d in ("raw", "spm", "bin"):  # never replace files this command did not write
        path = os.path.join(out_dir, d)
        if os.path.isdir(path) and os.listdir(path) and not os.path.exists(
                os.path.join(out_dir, "corpus.json")):
            raise HeadPruneError(f"{path} holds files that 'fairseq-headprune corpus' did not "
                                 f"write: choose another output directory.")
    files = catalog_files(sources, other)
    if not files:
        raise HeadPruneError(f"no .mo or .po catalogs for '{other}' found under {', '.join(sources)}.")
    read: Dict[str, int] = {}
    pairs = filter_pairs(read_pairs(files, read))
    if src_lang != "en":
        pairs = filter_pairs((t, s) for s, t in pairs.items())
    splits = split_pairs(pairs, valid_share, test_share)
    if min(len(v) for v in splits.values()) == 0:
        raise HeadPruneError(
            f"only {len(pairs)} usable pairs in {len(files)} catalogs: too few to fill train, "
            f"valid and test. Catalogs come with installed programs; on Debian or Ubuntu, "
            f"'apt-get install {' '.join(CATALOG_PACKAGES)}' adds thousands of pairs (and "
            f"slim images may exclude /usr/share/locale in /etc/dpkg/dpkg.cfg.d).")
    raw, pieces, binary = (os.path.join(out_dir, d) for d in ("raw", "spm", "bin"))
    for d in (raw, pieces):
        os.makedirs(d, exist_ok=True)
    sides = ((0, src_lang), (1, tgt_lang))
    for split, rows in splits.items():
        for side, lang in sides:
            write_text(os.path.join(raw, f"{split}.{lang}"), "".join(r[side] + "\n" for r in rows))
    train_text = [os.path.join(raw, f"train.{lang}") for lang in (src_lang, tgt_lang)]
    n_chars = sum(len(set("".join(r[side] + "\n" for r in splits["train"]))) for side, _ in sides)
    vocab = min(vocab_size, max(n_chars + 4, len(splits["train"]) // 2))
    spm.SentencePieceTrainer.train(
        input=",".join(train_text), model_prefix=os.path.join(pieces, "spm"), vocab_size=vocab,
        character_coverage=1.0, model_type="unigram", hard_vocab_limit=False,
        input_sentence_size=2000000, shuffle_input_sentence=True, num_threads=max(workers, 1),
        minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(pieces, "spm.model"))
    for split, rows in splits.items():
        for side, lang in sides:
            write_text(os.path.join(pieces, f"{split}.{lang}"),
                       "".join(" ".join(sp.encode(r[side], out_type=str)) + "\n" for r in rows))
    preprocess = os.path.join(os.path.dirname(sys.executable), "fairseq-preprocess")
    shutil.rmtree(binary, ignore_errors=True)  # fairseq-preprocess refuses to overwrite
    proc = subprocess.run(
        [preprocess, "--source-lang", src_lang, "--target-lang", tgt_lang,
         *(f"--{s}pref={os.path.join(pieces, s)}" for s in ("train", "valid", "test")),
         "--destdir", binary, "--joined-dictionary", "--workers", str(workers)],
        capture_output=True, text=True)
    if proc.returncode != 0:
        raise HeadPruneError(f"fairseq-preprocess failed: {proc.stderr.strip().splitlines()[-1]}")
    sizes = {split: len(rows) for split, rows in splits.items()}
    manifest = {
        "catalogs": [{"path": path, "sha256": sha256_file(path), "pairs": read.get(path, 0)}
                     for path in files],
        "filters": {"max_words": MAX_WORDS, "min_letter_share": MIN_LETTER_SHARE,
                    "min_words": 2, "untranslated": "dropped", "duplicates":
                    "most frequent translation, then alphabetically first",
                    "valid_share": valid_share, "test_share": test_share,
                    "split": "sha1 of the source sentence", "sentencepiece_vocab": vocab},
        # spm.model and preprocess.log embed the output paths; spm.vocab and the encoded text
        # stand for them, so two machines with the same catalogs get the same hashes
        "outputs": {os.path.relpath(path, out_dir): sha256_file(path)
                    for d in (raw, pieces, binary) for path in sorted(glob.glob(
                        os.path.join(d, "*")))
                    if os.path.basename(path) not in ("spm.model", "preprocess.log")},
    }
    write_json(os.path.join(out_dir, "manifest.json"), manifest)
    write_json(os.path.join(out_dir, "corpus.json"), {
        "pair": f"{src_lang}-{tgt_lang}", "catalogs": len(files), "pairs": sizes,
        "sentencepiece_vocab": vocab, "sources": sources,
        "manifest_sha256": sha256_file(os.path.join(out_dir, "manifest.json"))})
    return sizes

