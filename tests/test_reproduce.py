"""The paper reproductions (scripts/reproduce/*_{wmt,iwslt}*.sh, dsp.sh, gha.sh) end to end,
offline: a local mirror with the real downloads' file names and archive layouts (a few
sentences each, and a tiny stock fairseq transformer packed as fairseq's published
wmt14.en-fr.joined-dict.transformer) served through file:// URL bases, tiny models, CPU.

The scripts share one DATA_ROOT, as users' runs do, so the IWSLT14 and WMT preparations are done
once and found done by the next script (stage skipping)."""

import io
import json
import os
import random
import subprocess
import sys
import tarfile

import pytest

from conftest import BIN, REPO, TINY_MODEL, TRAIN, old_format, run

# a word-for-word toy language family: the models can learn it, the tokenizers meet hyphens,
# apostrophes, punctuation and Cyrillic
LEXICON = {
    "the": ("die", "le", "эта"), "house": ("haus", "maison", "дом"),
    "is": ("ist", "est", "есть"), "small": ("klein", "petit", "малый"),
    "green": ("grün", "vert", "зелёный"), "cat": ("katze", "chat", "кошка"),
    "sees": ("sieht", "voit", "видит"), "a": ("ein", "un", "один"),
    "dog": ("hund", "chien", "пёс"), "and": ("und", "et", "и"),
    "we": ("wir", "nous", "мы"), "read": ("lesen", "lisons", "читаем"),
    "books": ("bücher", "livres", "книги"), "today": ("heute", "aujourd'hui", "сегодня"),
    "well-known": ("welt-bekannt", "bien-connu", "известный"),
    "old": ("alt", "vieux", "старый"), "city": ("stadt", "ville", "город"),
    "red": ("rot", "rouge", "красный"),
}
COLUMN = {"de": 0, "fr": 1, "ru": 2}


def sentences(n, lang, seed):
    """n (English, translation) pairs, capitalised and punctuated."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(list(LEXICON)) for _ in range(rng.randint(3, 8))]
        tail = rng.choice([".", "!", "?", ", too."])
        other = [LEXICON[w][COLUMN[lang]] for w in words]
        out.append((" ".join(words).capitalize() + tail, " ".join(other).capitalize() + tail))
    return out


def pack(path, files, mode="w:gz"):
    """A tar archive at ``path`` holding {member name: text or bytes}."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tarfile.open(path, mode) as tar:
        for name, body in files.items():
            data = body.encode("utf-8") if isinstance(body, str) else body
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def lines(xs):
    return "".join(x + "\n" for x in xs)


def sgm(xs, setid, lang):
    body = "".join(f'<seg id="{i}">{x}</seg>\n' for i, x in enumerate(xs, 1))
    return (f'<srcset setid="{setid}" srclang="any">\n<doc docid="toy" genre="news" '
            f'origlang="{lang}">\n<p>\n{body}</p>\n</doc>\n</srcset>\n')


def iwslt_archive(root):
    """fairseq/data/iwslt14/de-en.tgz: de-en/train.tags.de-en.{de,en} (with metadata lines) and
    the IWSLT14.TED*/TEDX* XML valid/test sets."""
    pairs = sentences(140, "de", 1)
    files = {}
    for lang, i in (("de", 1), ("en", 0)):
        body = [f"<url>http://www.ted.com/talks/toy_{lang}.html</url>", "<talkid>1</talkid>",
                "<keywords>toy</keywords>", f"<title>{pairs[0][i]}</title>",
                f"<description>{pairs[1][i]}</description>"]
        files[f"de-en/train.tags.de-en.{lang}"] = lines(body + [p[i] for p in pairs[2:]])
    for k, name in enumerate(("IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012",
                              "IWSLT14.TED.tst2010", "IWSLT14.TED.tst2011",
                              "IWSLT14.TED.tst2012")):
        test = sentences(3, "de", 100 + k)
        for lang, i in (("de", 1), ("en", 0)):
            segs = "".join(f'<seg id="{j}"> {p[i]} </seg>\n' for j, p in enumerate(test, 1))
            files[f"de-en/{name}.de-en.{lang}.xml"] = (
                f'<?xml version="1.0" encoding="UTF-8"?>\n<mteval>\n<srcset setid="{name}" '
                f'srclang="{lang}">\n<doc docid="1">\n{segs}</doc>\n</srcset>\n</mteval>\n')
    pack(os.path.join(root, "fair/data/iwslt14/de-en.tgz"), files)


def wmt_archives(root):
    """statmt.org's WMT13/14 and data.statmt.org's WMT17 archives, en-de and ru-en parts."""
    de = {name: sentences(40, "de", seed) for seed, name in enumerate(("ep", "cc", "nc"), 10)}
    ru = {name: sentences(50, "ru", seed) for seed, name in enumerate(("cc", "nc"), 20)}

    def corpus(prefix, pairs, src):
        return {f"{prefix}.{src}": lines(p[1] for p in pairs), f"{prefix}.en": lines(
            p[0] for p in pairs)}

    pack(os.path.join(root, "statmt/wmt13/training-parallel-europarl-v7.tgz"),
         corpus("training/europarl-v7.de-en", de["ep"], "de"))
    pack(os.path.join(root, "statmt/wmt13/training-parallel-commoncrawl.tgz"),
         {**corpus("commoncrawl.de-en", de["cc"], "de"),
          **corpus("commoncrawl.ru-en", ru["cc"], "ru")})
    pack(os.path.join(root, "data.statmt/wmt17/translation-task/training-parallel-nc-v12.tgz"),
         {**corpus("training/news-commentary-v12.de-en", de["nc"], "de"),
          **corpus("training/news-commentary-v12.ru-en", ru["nc"], "ru")})
    dev_de, dev_ru = sentences(6, "de", 30), sentences(6, "ru", 31)
    pack(os.path.join(root, "data.statmt/wmt17/translation-task/dev.tgz"),
         {"dev/newstest2013.en": lines(p[0] for p in dev_de),
          "dev/newstest2013.de": lines(p[1] for p in dev_de),
          "dev/newstest2013.ru": lines(p[1] for p in dev_ru)})
    test_de, test_ru = sentences(8, "de", 40), sentences(8, "ru", 41)
    pack(os.path.join(root, "statmt/wmt14/test-full.tgz"), {
        "test-full/newstest2014-deen-src.en.sgm": sgm([p[0] for p in test_de], "newstest2014", "en"),
        "test-full/newstest2014-deen-ref.de.sgm": sgm([p[1] for p in test_de], "newstest2014", "de"),
        "test-full/newstest2014-ruen-src.en.sgm": sgm([p[0] for p in test_ru], "newstest2014", "en"),
        "test-full/newstest2014-ruen-ref.ru.sgm": sgm([p[1] for p in test_ru], "newstest2014", "ru"),
    })
    dev = {}
    for k, year in enumerate(range(2009, 2014)):
        pairs = sentences(6, "fr", 50 + k)
        dev[f"dev/newstest{year}.en"] = lines(p[0] for p in pairs)
        dev[f"dev/newstest{year}.fr"] = lines(p[1] for p in pairs)
    pack(os.path.join(root, "statmt/wmt14/dev.tgz"), dev)


def published_model(root, work):
    """fairseq/models/wmt14.en-fr.joined-dict.transformer.tar.bz2: one folder with model.pt (a
    stock fairseq transformer with shared embeddings, trained here on Moses-tokenised,
    BPE-segmented toy en-fr, saved in the 2018 format of the real one: conftest.old_format),
    dict.en.txt, dict.fr.txt and bpecodes."""
    from fairseq_headprune.data.prepare import ApplyBPE, Moses, learn_bpe

    pairs = sentences(120, "fr", 60)
    text = {"en": [Moses("en", True, True)(p[0]) for p in pairs],
            "fr": [Moses("fr", True, True)(p[1]) for p in pairs]}
    codes = os.path.join(work, "bpecodes")
    learn_bpe([text["en"], text["fr"]], 200, codes)
    bpe = ApplyBPE(codes)
    for lang in text:
        for split, part in (("train", text[lang][:100]), ("valid", text[lang][100:])):
            with open(os.path.join(work, f"{split}.{lang}"), "w", encoding="utf-8") as f:
                f.write(lines(bpe(x) for x in part))
    run(["fairseq-preprocess", "--source-lang", "en", "--target-lang", "fr", "--joined-dictionary",
         "--trainpref", os.path.join(work, "train"), "--validpref", os.path.join(work, "valid"),
         "--destdir", os.path.join(work, "bin"), "--workers", "1"])
    run(["fairseq-train", os.path.join(work, "bin"), "--arch", "transformer",
         "--share-all-embeddings", *TINY_MODEL, *TRAIN, "--max-update", "30", "--save-interval", "1000",
         "--max-target-positions", "32", "--skip-invalid-size-inputs-valid-test",
         "--save-dir", os.path.join(work, "ckpt"), "--no-epoch-checkpoints"])
    folder = "wmt14.en-fr.joined-dict.transformer"
    files = {f"{folder}/bpecodes": codes,
             f"{folder}/model.pt": old_format(os.path.join(work, "ckpt", "checkpoint_last.pt"),
                                             os.path.join(work, "model.pt")),
             f"{folder}/dict.en.txt": os.path.join(work, "bin", "dict.en.txt"),
             f"{folder}/dict.fr.txt": os.path.join(work, "bin", "dict.fr.txt")}
    blobs = {}
    for name, path in files.items():
        with open(path, "rb") as f:
            blobs[name] = f.read()
    pack(os.path.join(root, f"fair/models/{folder}.tar.bz2"), blobs, "w:bz2")


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("mirror"))
    iwslt_archive(root)
    wmt_archives(root)
    published_model(root, str(tmp_path_factory.mktemp("published")))
    return root


# tiny models; at most 31 target positions, so that beam search of a barely trained model stops
# there instead of at fairseq's 200 tokens (BPE_MERGES=200 leaves the toy words whole: at most
# about 20 tokens a sentence)
TINY = " ".join(TINY_MODEL + ["--max-tokens", "1000", "--required-batch-size-multiple", "1",
                              "--max-target-positions", "32",
                              "--skip-invalid-size-inputs-valid-test"])


def reproduce(script, mirror, work, **env):
    """Run scripts/reproduce/SCRIPT on the mirror with tiny settings; returns stdout."""
    proc = subprocess.run(
        ["bash", os.path.join(REPO, "scripts", "reproduce", script)], capture_output=True,
        text=True, env={
            **os.environ, "PATH": BIN + os.pathsep + os.environ["PATH"], "PY": sys.executable,
            "FAIR_URL": f"file://{mirror}/fair", "STATMT_URL": f"file://{mirror}/statmt",
            "STATMT_DATA_URL": f"file://{mirror}/data.statmt", "WORK": str(work),
            "DATA_ROOT": str(work / "data"), "WORKERS": "1", "BPE_MERGES": "200",
            "MAX_UPDATE": "3", "SENTENCES": "4", "ARCH_OVERRIDES": TINY, "BEAM": "1", **env})
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def table(work, name):
    with open(work / name / f"{name}.json", encoding="utf-8") as f:
        data = json.load(f)
    assert os.path.getsize(work / name / f"{name}.md") > 0
    assert os.path.getsize(work / name / f"{name}.csv") > 0
    return data["rows"]


def ours(rows, row):
    """Our values beside the paper row ``row``."""
    return [r["ours"] for r in rows if r["row"] == row]


def test_archive_layouts(mirror):
    """The mirror holds what fairseq's prepare-*.sh read, under the real names."""
    with tarfile.open(os.path.join(mirror, "fair/data/iwslt14/de-en.tgz")) as tar:
        names = tar.getnames()
    assert "de-en/train.tags.de-en.de" in names and "de-en/IWSLT14.TED.tst2012.de-en.en.xml" in names
    with tarfile.open(os.path.join(
            mirror, "fair/models/wmt14.en-fr.joined-dict.transformer.tar.bz2")) as tar:
        assert sorted(tar.getnames()) == [f"wmt14.en-fr.joined-dict.transformer/{n}" for n in (
            "bpecodes", "dict.en.txt", "dict.fr.txt", "model.pt")]


def test_prepare_iwslt14_splits(mirror, tmp_path):
    """prepare-iwslt14.sh's rules on the mirror: metadata dropped, title/description kept, every
    23rd line to valid, the five XML sets concatenated as test, lowercased, BPE-segmented."""
    from fairseq_headprune.data.download import fetch_all
    from fairseq_headprune.data.prepare import prepare

    fetch_all([f"file://{mirror}/fair/data/iwslt14/de-en.tgz"], str(tmp_path / "orig"))
    m = prepare("iwslt14", str(tmp_path / "orig"), str(tmp_path / "out"), merges=30,
                split_compounds=True)
    # 138 sentences + title + description; none dropped by the 1.5 ratio (word-for-word toy)
    assert m["lines"] == {"train": 140 - 140 // 23, "valid": 140 // 23, "test": 15}
    with open(tmp_path / "out" / "train.en", encoding="utf-8") as f:
        train = f.read()
    plain = train.replace("##AT##", "")
    assert "<" not in train and plain == plain.lower() and "@@" in train
    assert "well ##AT##-##AT## known" in train.replace("@@ ", "")  # GHA's compound marks


def test_reproduce_scripts(mirror, tmp_path):
    work = tmp_path
    reproduce("michel_wmt14_enfr.sh", mirror, work, LEVELS="0.2,0.4,0.6", CURVES="all")
    rows = table(work, "michel-wmt14-enfr")
    assert [r["row"] for r in rows] == ["unpruned"] + [f"table2-{t}{l}" for t in "EAD"
                                                       for l in range(1, 7)] + [
        "table1-changed", "table1-improved", "fig3-20", "fig3-40", "fig3-60"]
    # the toy model has 2 layers: Table 2 rows for layers 1-2 only, 8 encoder heads in Table 1
    assert all(ours(rows, f"table2-{t}{l}")[0] is not None for t in "EAD" for l in (1, 2))
    assert all(ours(rows, f"table2-{t}{l}") == [None] for t in "EAD" for l in (3, 4, 5, 6))
    assert 0 <= ours(rows, "table1-improved")[0] <= ours(rows, "table1-changed")[0] <= 8 and ours(rows, "fig3-60")[0] is not None

    reproduce("dsp.sh", mirror, work, KEEP="50")
    rows = table(work, "dsp-iwslt14-deen")
    assert [(r["row"], r["label"]) for r in rows] == [
        ("baseline", "unpruned"), ("dsp-30M", ""), ("-", "dsp-joint-50"),
        ("-", "dsp-pipelined-ft-50")]
    assert [sum(r["heads"].values()) for r in rows if r["heads"]] == [24, 12, 12]

    # fairseq's IWSLT14 text (SPLIT_COMPOUNDS=0): the data DSP prepared is found done, and
    # DSP's baseline stands in for vanilla (BASELINE); w/o GC skipped (ABLATION=0) for time
    reproduce("gha.sh", mirror, work, SPLIT_COMPOUNDS="0", ABLATION="0",
              BASELINE=str(work / "dsp-iwslt14-deen" / "runs" / "baseline" / "checkpoint_last.pt"))
    rows = table(work, "gha-iwslt14-deen")
    assert [(r["row"], r["paper"], r["label"]) for r in rows] == [
        ("vanilla", 34.4, "unpruned"), ("ght", 35.4, "ght"), ("ght-ps", 35.2, "ght-ps"),
        ("ght-ps-no-gc", 34.0, "")]
    assert [sum(r["heads"].values()) for r in rows[:3]] == [24, 24, 12]  # C = 2 of 4 kept
    assert not os.path.exists(work / "gha-iwslt14-deen" / "runs" / "vanilla")

    reproduce("voita_wmt_enru.sh", mirror, work, LAMBDAS="0.5", ENC_LAMBDA="0.5")
    rows = table(work, "voita-wmt-enru")
    assert [r["row"] for r in rows] == ["baseline", "eda-1", "eda-2", "eda-3", "eda-4", "enc-10"]
    assert ours(rows, "eda-2") == [None] and ours(rows, "eda-1")[0] is not None
    enc = next(r for r in rows if r["row"] == "enc-10")
    assert enc["heads"]["D"] == 8 and enc["heads"]["A"] == 8 and enc["unit"] == "BLEU diff."

    # the re-parametrisation route only (SCRATCH=0: --collab-key-dim training is tested in
    # test_collab.py), for time
    reproduce("collab_wmt17_ende.sh", mirror, work, KEY_DIMS="8", SCRATCH="0")
    rows = table(work, "collab-wmt17-ende")
    assert [(r["row"], r["label"]) for r in rows] == [
        ("concat-1024", "unpruned"), ("concat-256", ""), ("concat-128", ""), ("concat-64", ""),
        ("concat-32", ""), ("collab-256", ""), ("collab-128", ""), ("collab-64", ""),
        ("collab-32", ""), ("-", "collab-reparam-8")]
    assert [sum(r["heads"].values()) for r in rows if r["heads"]] == [24, 24]


def test_reproduce_wmt14_branches(mirror, tmp_path):
    """dsp.sh and gha.sh with DATASET=wmt14: fairseq's prepare-wmt14en2de.sh (valid: every 100th
    training line) for DSP, GHA's copy (valid newstest2013, ##AT## compounds) for GHA, joined
    dictionaries, and the WMT decoding of both papers (lenpen 0.6)."""
    work = tmp_path
    reproduce("dsp.sh", mirror, work, DATASET="wmt14", KEEP="50")
    rows = table(work, "dsp-wmt14-ende")
    assert [(r["row"], r["label"]) for r in rows] == [
        ("baseline", "unpruned"), ("dsp-30M", ""), ("-", "dsp-joint-50"),
        ("-", "dsp-pipelined-ft-50")]
    assert [sum(r["heads"].values()) for r in rows if r["heads"]] == [24, 12, 12]

    baseline = work / "dsp-wmt14-ende" / "runs" / "baseline" / "checkpoint_last.pt"
    reproduce("gha.sh", mirror, work, DATASET="wmt14", ABLATION="0", BASELINE=str(baseline))
    rows = table(work, "gha-wmt14-ende")
    assert [(r["row"], r["label"]) for r in rows][:3] == [
        ("vanilla", "unpruned"), ("ght", "ght"), ("ght-ps", "ght-ps")]
    assert [sum(r["heads"].values()) for r in rows[:3]] == [24, 24, 12]  # C = 2 of 4 kept

    text = work / "data" / "text"
    with open(text / "wmt17_en_de" / "prepare.json", encoding="utf-8") as f:
        fairseq_split = json.load(f)["lines"]
    with open(text / "wmt17_en_de.gha" / "prepare.json", encoding="utf-8") as f:
        gha_split = json.load(f)["lines"]
    # 3 x 40 training pairs: fairseq's recipe moves 1 to valid; GHA's takes newstest2013's 6
    assert fairseq_split == {"train": 119, "valid": 1, "test": 8}
    assert gha_split == {"train": 120, "valid": 6, "test": 8}
    with open(text / "wmt17_en_de.gha" / "train.en", encoding="utf-8") as f:
        assert "well ##AT##-##AT## known" in f.read().replace("@@ ", "")
    for name in ("wmt17_en_de", "wmt17_en_de.gha"):  # joined dictionary
        dicts = [(work / "data" / "bin" / name / f"dict.{lang}.txt").read_text()
                 for lang in ("en", "de")]
        assert dicts[0] == dicts[1] and "haus" in dicts[0]
    for name in ("dsp-wmt14-ende", "gha-wmt14-ende"):
        with open(work / name / "eval.json", encoding="utf-8") as f:
            config = json.load(f)["config"]
        assert config["beam"] == 1 and config["lenpen"] == 0.6


def test_clean_and_split_rules():
    """clean-corpus-n.perl's length and ratio rules and awk's NR%n split, on hand-made lines."""
    from fairseq_headprune.data.prepare import clean, every_nth

    src = ["a b", "a  b c", "a", "a b c d", ""]
    tgt = ["x y", "x y", "x y", "x y z w v w", "x"]
    # 2/2 kept; 3/2 = 1.5 kept (whitespace collapsed); 1/2 ratio 2 dropped; 6 tokens > 5
    # dropped; 0 tokens dropped
    assert clean(src, tgt, 1.5, 1, 5) == (["a b", "a b c"], ["x y", "x y"])
    assert every_nth(list("abcdefg"), 3) == (list("abdeg"), list("cf"))


def test_download_errors(tmp_path):
    """A URL that cannot be read and a broken archive are one sentence each; no .part is left."""
    from fairseq_headprune.data.download import extract, fetch
    from fairseq_headprune.errors import HeadPruneError

    with pytest.raises(HeadPruneError, match=r"^could not download file://.*/nothing\.tgz: "):
        fetch(f"file://{tmp_path}/nothing.tgz", str(tmp_path / "orig"))
    assert not os.path.exists(tmp_path / "orig" / "nothing.tgz.part")
    bad = tmp_path / "bad.tgz"
    bad.write_bytes(b"not a tar archive")
    with pytest.raises(HeadPruneError, match=r"bad\.tgz is not a readable archive: delete it and rerun"):
        extract(str(bad))
    assert not os.path.exists(tmp_path / ".bad.tgz.unpacked")


def test_detokenizer_subword_nmt():
    """BLEU of the papers' data is taken on plain text: BPE joined, Moses escapes and spacing
    undone; a sentencepiece dictionary keeps the sentencepiece path."""
    from argparse import Namespace

    import torch
    from fairseq.data import Dictionary

    from fairseq_headprune.evaluation.decode import detokenizer

    d = Dictionary()
    for sym in ["Das", "ist", "&apos;s", ",", "Te@@", "st", "@-@", "Fall", "."]:
        d.add_symbol(sym)
    task = Namespace(target_dictionary=d, cfg=Namespace(target_lang="en"))  # English 's rule
    ids = torch.tensor([d.index(s) for s in ["Das", "ist", "&apos;s", ",", "Te@@", "st", "@-@",
                                             "Fall", "."]])
    assert detokenizer(task)(ids) == "Das ist's, Test-Fall."
    sp = Dictionary()
    for sym in ["\u2581Das", "\u2581is", "t"]:
        sp.add_symbol(sym)
    ids = torch.tensor([sp.index(s) for s in ["\u2581Das", "\u2581is", "t"]])
    assert detokenizer(Namespace(target_dictionary=sp, cfg=Namespace(target_lang="de")))(ids) \
        == "Das ist"


def test_paper_table_rows():
    """Ours beside the paper's rows: a difference row takes BLEU minus the unpruned model's; a
    row the paper has not is one sentence."""
    from fairseq_headprune.errors import HeadPruneError
    from fairseq_headprune.evaluation.paper_table import PAPERS, build, from_eval

    evaluated = [{"label": "unpruned", "bleu": 30.0, "heads": {"E": 48}, "signature": "s",
                  "sentences": 3},
                 {"label": "enc", "bleu": 29.75, "heads": {"E": 10}, "signature": "s",
                  "sentences": 3}]
    ours_ = from_eval(PAPERS["voita-wmt-enru"], evaluated,
                      [["unpruned", "baseline", ""], ["enc", "enc-10", "lambda 1"]])
    rows = build("voita-wmt-enru", ours_)
    assert [(r["row"], r["paper"], r["ours"]) for r in rows] == [
        ("baseline", 29.6, 30.0), ("eda-1", 29.62, None), ("eda-2", 29.36, None),
        ("eda-3", 29.06, None), ("eda-4", 28.90, None), ("enc-10", -0.15, -0.25)]
    with pytest.raises(HeadPruneError, match="beside row 'eda-9', which the paper's table has "
                                             "not"):
        from_eval(PAPERS["voita-wmt-enru"], evaluated, [["enc", "eda-9", ""]])


def test_michel_rows_from_ablations():
    """Michel's Table 2 rows from best-per-layer specs (the layer whose other heads are pruned),
    Table 1 counts from single-head deltas, Figure 3 from the 'all' curve only."""
    from fairseq_headprune.evaluation.paper_table import build, from_michel

    sig = "nrefs:1|case:mixed"
    best = {"rows": [{"spec": "", "bleu": 20.0, "delta": 0.0, "signature": sig},
                     {"spec": "E:1:2,3,4", "bleu": 19.5, "delta": -0.5, "signature": sig},
                     {"spec": "A:2:1,3,4", "bleu": 20.25, "delta": 0.25, "signature": sig}]}
    single = {"rows": [{"spec": "", "delta": 0.0, "signature": sig}]
              + [{"spec": f"E:1:{h}", "delta": d, "signature": sig}
                 for h, d in enumerate([0.0, -0.3, 0.2, 0.0, 0.1], 1)]}
    sweep = {"rows": [{"curve": c, "level": lv, "bleu": b, "heads_pruned": n, "heads_total": 24,
                       "signature": sig}
                      for c, lv, b, n in (("all", 0.2, 18.0, 5), ("E", 0.2, 19.0, 2),
                                          ("all", 0.4, 15.0, 10))]}
    rows = {r["row"]: r["ours"] for r in build("michel-wmt14-enfr",
                                                from_michel(best, single, sweep))}
    assert rows["unpruned"] == 20.0 and rows["table2-E1"] == -0.5 and rows["table2-A2"] == 0.25
    assert rows["table2-D1"] is None
    assert rows["table1-changed"] == 3 and rows["table1-improved"] == 2
    assert rows["fig3-20"] == 18.0 and rows["fig3-40"] == 15.0 and rows["fig3-60"] is None
