"""The gettext corpus builder on hand-written .po files."""

import hashlib
import json
import os

import pytest

from fairseq_headprune.data.corpus import (
    build_corpus,
    catalog_files,
    clean,
    filter_pairs,
    is_prose,
    read_pairs,
    split_of,
)
from fairseq_headprune.errors import HeadPruneError

PO = '''msgid ""
msgstr ""
"Content-Type: text/plain; charset=UTF-8\\n"
"Plural-Forms: nplurals=2; plural=(n != 1);\\n"

msgid "Open the _file"
msgstr "_Datei öffnen"

msgid "Open the _file"
msgstr "Die Datei öffnen"

msgid "%s: %d"
msgstr "%s: %d"

msgid "<b>%s</b> %d"
msgstr "<b>%s</b> %d"

#, fuzzy
msgid "Save all changes"
msgstr "Alle Änderungen verwerfen"

msgid "Untranslated message here"
msgstr ""

msgid "Copy of the same text"
msgstr "Copy of the same text"

msgid "%d file was deleted"
msgid_plural "%d files were deleted"
msgstr[0] "%d Datei wurde gelöscht"
msgstr[1] "%d Dateien wurden gelöscht"
'''


@pytest.fixture
def po_dir(tmp_path):
    (tmp_path / "one.po").write_text(PO, encoding="utf-8")
    second = PO.replace('msgstr "_Datei öffnen"', 'msgstr "Die Datei öffnen"')
    (tmp_path / "two.po").write_text(second, encoding="utf-8")
    return tmp_path


def test_filters_and_dedup(po_dir):
    pairs = filter_pairs(read_pairs(catalog_files([str(po_dir)], "de")))
    assert pairs == {
        "Open the file": "Die Datei öffnen",  # 3 votes against 1 for "Datei öffnen"
        "%d file was deleted": "%d Datei wurde gelöscht",
        "%d files were deleted": "%d Dateien wurden gelöscht",
    }


@pytest.mark.parametrize("text,expected", [
    ("Open the file", True), ("%s: %d", False), ("<b>%s</b> %d", False),
    ("%1$s of %2$s", False), ("Delete {name} now", True), ("File", False),
])
def test_is_prose(text, expected):
    assert is_prose(text) is expected


def test_clean_strips_accelerators():
    assert clean("_Open  &Recent\nfiles") == "Open Recent files"
    assert clean("Fi_le") == "File"
    assert clean("snake_case_name stays") == "snake_case_name stays"
    assert clean("Tom & Jerry") == "Tom & Jerry"
    assert clean("a &amp; b") == "a &amp; b"


def test_split_is_stable():
    names = [f"Message number {i} for you" for i in range(300)]
    first = {n: split_of(n, 0.1, 0.1) for n in names}
    assert {n: split_of(n, 0.1, 0.1) for n in names} == first
    assert 10 < sum(v == "test" for v in first.values()) < 60


def synthetic_po(path, n, seed_words):
    entries = [f'msgid "{w} item number {i}"\nmsgstr "{w.upper()} Eintrag Nummer {i}"\n'
               for i in range(n) for w in seed_words]
    path.write_text('msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
                    + "\n".join(entries), encoding="utf-8")


def test_build_corpus_end_to_end(tmp_path):
    cats = tmp_path / "cats"
    cats.mkdir()
    synthetic_po(cats / "a.po", 150, ["red", "blue"])
    out = tmp_path / "corpus"
    sizes = build_corpus([str(cats)], str(out), valid_share=0.1, test_share=0.1, vocab_size=200)
    assert sum(sizes.values()) == 300
    meta = json.loads((out / "corpus.json").read_text())
    assert meta["pairs"] == sizes and meta["pair"] == "en-de"
    for f in ("dict.en.txt", "dict.de.txt", "train.en-de.en.bin", "test.en-de.de.idx"):
        assert os.path.exists(out / "bin" / f)
    assert (out / "raw" / "test.en").read_text().count("\n") == sizes["test"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["catalogs"] == [{"path": str(cats / "a.po"), "pairs": 300,
                                     "sha256": hashlib.sha256((cats / "a.po").read_bytes())
                                     .hexdigest()}]
    assert manifest["filters"]["max_words"] == 50 and manifest["filters"]["valid_share"] == 0.1
    assert manifest["outputs"]["raw/test.en"] == hashlib.sha256(
        (out / "raw" / "test.en").read_bytes()).hexdigest()
    assert "bin/dict.en.txt" in manifest["outputs"] and "spm/spm.vocab" in manifest["outputs"]
    assert meta["manifest_sha256"] == hashlib.sha256(
        (out / "manifest.json").read_bytes()).hexdigest()
    again = tmp_path / "again"  # the same catalogs give the same corpus, file for file
    build_corpus([str(cats)], str(again), valid_share=0.1, test_share=0.1, vocab_size=200)
    assert json.loads((again / "manifest.json").read_text())["outputs"] == manifest["outputs"]
    # adding a catalog never moves an existing sentence to another split
    synthetic_po(cats / "b.po", 150, ["green"])
    before = set((out / "raw" / "test.en").read_text().splitlines())
    build_corpus([str(cats)], str(out), valid_share=0.1, test_share=0.1, vocab_size=200)
    after = set((out / "raw" / "test.en").read_text().splitlines())
    assert before <= after and len(after) > len(before)


def test_too_few_pairs_names_the_packages(tmp_path):
    cats = tmp_path / "cats"
    cats.mkdir()
    synthetic_po(cats / "a.po", 2, ["red"])
    with pytest.raises(HeadPruneError) as err:
        build_corpus([str(cats)], str(tmp_path / "out"), valid_share=0.1, test_share=0.1)
    assert str(err.value).startswith("only 2 usable pairs in 1 catalogs: too few to fill train, "
                                     "valid and test. Catalogs come with installed programs; on "
                                     "Debian or Ubuntu, 'apt-get install libc-l10n iso-codes ")


def test_no_catalogs(tmp_path):
    with pytest.raises(HeadPruneError, match=r"^no \.mo or \.po catalogs for 'de' found under"):
        build_corpus([str(tmp_path)], str(tmp_path / "out"))


def test_foreign_files_in_the_output_are_left_alone(tmp_path):
    cats = tmp_path / "cats"
    cats.mkdir()
    synthetic_po(cats / "a.po", 150, ["red", "blue"])
    out = tmp_path / "out"
    (out / "bin").mkdir(parents=True)
    (out / "bin" / "precious.bin").write_text("mine")
    with pytest.raises(HeadPruneError) as err:
        build_corpus([str(cats)], str(out), valid_share=0.1, test_share=0.1, vocab_size=200)
    assert str(err.value) == (f"{out / 'bin'} holds files that 'fairseq-headprune corpus' did "
                              f"not write: choose another output directory.")
    assert (out / "bin" / "precious.bin").read_text() == "mine"
