"""Tokenised, cleaned, split and BPE-segmented text of the papers' translation data, from the
unpacked downloads (:mod:`fairseq_headprune.data.download`), ready for ``fairseq-preprocess``.

One recipe per data set, each keeping the split rules of the script the papers used
(METHODS_NOTES.md, "Data and reproduction"), with the Moses scripts and subword-nmt replaced by
the pip packages ``sacremoses`` and ``subword-nmt`` (no cloned tool trees):

``iwslt14``      fairseq ``examples/translation/prepare-iwslt14.sh`` (DSP, GHA; Michel Sec. 6):
                 metadata lines dropped and <title>/<description> tags stripped from
                 ``de-en/train.tags.de-en.*``; Moses tokenizer without ``-a``; clean-corpus
                 ratio 1.5, 1-175 tokens (train); lowercase; valid = every 23rd training line;
                 test = TED.dev2010 + TEDX.dev2012 + TED.tst2010-2012 ``<seg>`` lines; joint
                 BPE with 10000 merges. ``--split-compounds`` adds GHA's ``##AT##-##AT##``.
``wmt14-en-de``  fairseq ``prepare-wmt14en2de.sh`` (GHA, DSP, Cordonnier): Europarl v7, Common
                 Crawl and News Commentary v12 (default, fairseq's ``wmt17_en_de``) or v9
                 (``--nc v9``, its ``--icml17``); normalize-punctuation, remove-non-printing-char,
                 tokenizer ``-a``; valid = every 100th training line (``--valid newstest2013``:
                 GHA's copy); test newstest2014 (``test-full`` SGML); joint BPE 40000; clean
                 ratio 1.5, 1-250 on train and valid after BPE.
``wmt-en-ru``    Voita et al. (2019): the paper's "WMT EN-RU, 2.5M pairs" is not specified
                 further; here Common Crawl + News Commentary v12 ru-en (the archives the en-de
                 recipe downloads), valid newstest2013 (``--valid``), test newstest2014
                 (``--test-set``, from ``test-full``); Moses
                 tokenizer, lowercase, clean 1.5 / 1-250 (train), subword-nmt BPE with 32000
                 merges learned per language (the authors' README). These choices are ours.
``newstest``     Michel et al. (2019) on the published ``wmt14.en-fr.joined-dict.transformer``:
                 newstest2009-2012 (importance, split ``valid``) and newstest2013 (BLEU, split
                 ``test``) from WMT14 ``dev/``, tokenised as ``prepare-wmt14en2fr.sh`` and
                 segmented with the model's own ``bpecodes`` (``--codes``).

Output: ``{train,valid,test}.{src,tgt}`` (``newstest``: valid and test only), the BPE codes
(``code``, or ``code.LANG`` per language) and ``prepare.json`` (recipe, settings, line counts),
written last: a folder with ``prepare.json`` is complete.

    python -m fairseq_headprune.data.prepare iwslt14 --orig ORIG -o OUT [--merges 10000]
"""

import argparse
import logging
import multiprocessing
import os
import re
import sys
import tempfile
import unicodedata
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from tqdm import tqdm

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.io import write_json

logger = logging.getLogger(__name__)

IWSLT_TEST = ("IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010",
              "IWSLT14.TED.tst2011", "IWSLT14.TED.tst2012")
IWSLT_DROP = ("<url>", "<talkid>", "<keywords>")
IWSLT_TAGS = re.compile(r"</?(title|description)>")
SEG = re.compile(r'^\s*<seg id="?\d+"?>\s*(.*?)\s*</seg>\s*$')


# ---------------------------------------------------------------- reading the downloads

def read_lines(path: str) -> List[str]:
    if not os.path.isfile(path):
        raise HeadPruneError(f"{path} is missing: the download did not unpack as expected.")
    with open(path, encoding="utf-8", errors="replace", newline="\n") as f:
        return [line.rstrip("\n").rstrip("\r") for line in f]


def iwslt_train_lines(path: str) -> List[str]:
    """``train.tags.*``: metadata lines dropped, title/description tags stripped
    (prepare-iwslt14.sh's grep -v and sed)."""
    return [IWSLT_TAGS.sub("", line) for line in read_lines(path)
            if not any(tag in line for tag in IWSLT_DROP)]


def seg_lines(path: str) -> List[str]:
    """The sentences of an IWSLT XML or WMT SGML file: its ``<seg id="N">`` lines, curly
    apostrophes made straight (the scripts' grep/sed)."""
    out = []
    for line in read_lines(path):
        if "<seg id" in line:
            m = SEG.match(line)
            text = m.group(1) if m else re.sub(r"<seg id=\"?\d+\"?>\s*|\s*</seg>\s*", "", line)
            out.append(text.replace("\u2019", "'"))
    return out


# ---------------------------------------------------------------- the Moses steps, via sacremoses

def remove_non_printing(line: str) -> str:
    """remove-non-printing-char.perl: every character of Unicode category C becomes a space."""
    return "".join(" " if unicodedata.category(c)[0] == "C" else c for c in line)


class Moses:
    """One language's Moses pipeline as the scripts chain it: optional normalize-punctuation and
    remove-non-printing-char, tokenizer.perl (escaping, ``-a`` = ``aggressive``), optional
    ``##AT##`` compound marks (GHA), optional lowercase.perl."""

    def __init__(self, lang: str, aggressive: bool = False, normalize: bool = False,
                 lowercase: bool = False, compounds: bool = False):
        from sacremoses import MosesPunctNormalizer, MosesTokenizer

        self.tokenizer = MosesTokenizer(lang)
        self.normalizer = MosesPunctNormalizer(lang) if normalize else None
        self.aggressive = aggressive or compounds
        self.lowercase, self.compounds = lowercase, compounds

    def __call__(self, line: str) -> str:
        if self.normalizer is not None:
            line = remove_non_printing(self.normalizer.normalize(line))
        out = self.tokenizer.tokenize(line, aggressive_dash_splits=self.aggressive,
                                      return_str=True, escape=True)
        out = out.lower() if self.lowercase else out
        return mark_compounds(out) if self.compounds else out


def mark_compounds(line: str) -> str:
    """GHA's ``##AT##-##AT##`` for the ``@-@`` of Moses' aggressive hyphen splitting."""
    return line.replace(" @-@ ", " ##AT##-##AT## ")


_WORKER: Optional[Callable] = None


def _init(fn):
    global _WORKER
    _WORKER = fn


def _call(line):
    return _WORKER(line)


def parallel_map(fn: Callable[[str], str], lines: Sequence[str], workers: int,
                 desc: str) -> List[str]:
    """``[fn(x) for x in lines]`` with a tqdm bar, over ``workers`` processes when > 1."""
    if workers <= 1 or len(lines) < 10000:
        return [fn(x) for x in tqdm(lines, desc=desc, unit="line", mininterval=5)]
    with multiprocessing.get_context("fork").Pool(workers, _init, (fn,)) as pool:
        return list(tqdm(pool.imap(_call, lines, chunksize=2000), total=len(lines), desc=desc,
                         unit="line", mininterval=5))


def clean(src: List[str], tgt: List[str], ratio: float, low: int, high: int
          ) -> Tuple[List[str], List[str]]:
    """clean-corpus-n.perl: keep pairs whose sides have ``low``..``high`` tokens and whose length
    ratio (either way) is at most ``ratio``; whitespace collapsed."""
    keep_src, keep_tgt = [], []
    for s, t in zip(src, tgt):
        s, t = " ".join(s.split()), " ".join(t.split())
        ns, nt = len(s.split()), len(t.split())
        if not (low <= ns <= high and low <= nt <= high):
            continue
        if ns / nt > ratio or nt / ns > ratio:
            continue
        keep_src.append(s)
        keep_tgt.append(t)
    return keep_src, keep_tgt


def every_nth(lines: List[str], n: int) -> Tuple[List[str], List[str]]:
    """(rest, every n-th line counting from 1): the scripts' ``awk NR%n``."""
    return ([x for i, x in enumerate(lines, 1) if i % n],
            [x for i, x in enumerate(lines, 1) if i % n == 0])


# ---------------------------------------------------------------- BPE, via subword-nmt

def learn_bpe(texts: Iterable[List[str]], merges: int, codes: str):
    """subword-nmt learn_bpe on the concatenation of ``texts`` (the scripts' ``cat``)."""
    from subword_nmt.learn_bpe import learn_bpe as learn

    with tempfile.TemporaryFile("w+", encoding="utf-8") as text:
        for lines in texts:
            for line in lines:
                text.write(line + "\n")
        text.seek(0)
        with open(codes + ".part", "w", encoding="utf-8") as out:
            learn(text, out, merges)
    os.replace(codes + ".part", codes)


class ApplyBPE:
    def __init__(self, codes: str):
        from subword_nmt.apply_bpe import BPE

        with open(codes, encoding="utf-8") as f:
            self.bpe = BPE(f)

    def __call__(self, line: str) -> str:
        return self.bpe.process_line(line)


# ---------------------------------------------------------------- recipes

def _corpus(orig: str, names: Sequence[str], lang: str) -> List[str]:
    lines = []
    for name in names:
        lines += read_lines(os.path.join(orig, f"{name}.{lang}"))
    return lines


def _pair(src: List[str], tgt: List[str], what: str):
    if len(src) != len(tgt):
        raise HeadPruneError(f"{what} has {len(src)} source and {len(tgt)} target lines: the "
                             f"corpus is not parallel.")
    if not src:
        raise HeadPruneError(f"{what} has no sentences.")


def iwslt14(orig, merges=10000, split_compounds=False, workers=1, **_) -> Dict:
    src, tgt, lang = "de", "en", "de-en"
    data = {}
    tok = {l: Moses(l, aggressive=split_compounds) for l in (src, tgt)}
    lc = {l: Moses(l, lowercase=True, compounds=split_compounds) for l in (src, tgt)}
    raw = {l: iwslt_train_lines(os.path.join(orig, lang, f"train.tags.{lang}.{l}"))
           for l in (src, tgt)}
    _pair(raw[src], raw[tgt], f"{orig}/{lang}/train.tags.{lang}")
    t = {l: parallel_map(tok[l], raw[l], workers, f"tokenise train.{l}") for l in (src, tgt)}
    t[src], t[tgt] = clean(t[src], t[tgt], 1.5, 1, 175)
    for l in (src, tgt):
        t[l] = [x.lower() for x in t[l]]
        if split_compounds:
            t[l] = [mark_compounds(x) for x in t[l]]
        data["train", l], data["valid", l] = every_nth(t[l], 23)
        data["test", l] = []
        for name in IWSLT_TEST:
            data["test", l] += parallel_map(
                lc[l], seg_lines(os.path.join(orig, lang, f"{name}.{lang}.{l}.xml")), workers,
                f"tokenise {name}.{l}")
    return {"src": src, "tgt": tgt, "data": data, "bpe": ("joint", merges),
            "clean": None}


def wmt14_en_de(orig, merges=40000, nc="v12", valid="split", split_compounds=False, workers=1,
                **_) -> Dict:
    src, tgt = "en", "de"
    corpora = ["training/europarl-v7.de-en", "commoncrawl.de-en",
               f"training/news-commentary-{nc}.de-en"]
    data = {}
    for l in (src, tgt):
        moses = Moses(l, aggressive=True, normalize=True, compounds=split_compounds)
        train = parallel_map(moses, _corpus(orig, corpora, l), workers, f"tokenise train.{l}")
        side = "src" if l == src else "ref"
        test = seg_lines(os.path.join(orig, "test-full", f"newstest2014-deen-{side}.{l}.sgm"))
        test_tok = Moses(l, aggressive=True, compounds=split_compounds)
        data["test", l] = parallel_map(test_tok, test, workers, f"tokenise test.{l}")
        if valid == "split":
            data["train", l], data["valid", l] = every_nth(train, 100)
        else:  # GHA's copy: newstest2013 as valid
            data["train", l] = train
            data["valid", l] = parallel_map(
                moses, read_lines(os.path.join(orig, "dev", f"{valid}.{l}")), workers,
                f"tokenise {valid}.{l}")
    _pair(data["train", src], data["train", tgt], "the en-de training corpora")
    return {"src": src, "tgt": tgt, "data": data, "bpe": ("joint", merges),
            "clean": ("after-bpe", ("train", "valid"), 1.5, 1, 250)}


def wmt_en_ru(orig, merges=32000, valid="newstest2013", test_set="newstest2014", workers=1,
              **_) -> Dict:
    src, tgt = "en", "ru"
    corpora = ["commoncrawl.ru-en", "training/news-commentary-v12.ru-en"]
    data = {}
    for l in (src, tgt):
        moses = Moses(l, lowercase=True)
        data["train", l] = parallel_map(moses, _corpus(orig, corpora, l), workers,
                                        f"tokenise train.{l}")
        data["valid", l] = parallel_map(
            moses, read_lines(os.path.join(orig, "dev", f"{valid}.{l}")), workers,
            f"tokenise valid.{l}")
        side = "src" if l == src else "ref"
        data["test", l] = parallel_map(
            moses, seg_lines(os.path.join(orig, "test-full", f"{test_set}-ruen-{side}.{l}.sgm")),
            workers, f"tokenise test.{l}")
    _pair(data["train", src], data["train", tgt], "the en-ru training corpora")
    data["train", src], data["train", tgt] = clean(data["train", src], data["train", tgt],
                                                   1.5, 1, 250)
    return {"src": src, "tgt": tgt, "data": data, "bpe": ("per-language", merges),
            "clean": None}


def newstest(orig, codes=None, valid_sets="newstest2009,newstest2010,newstest2011,newstest2012",
             test_set="newstest2013", src="en", tgt="fr", workers=1, **_) -> Dict:
    if not codes or not os.path.isfile(codes):
        raise HeadPruneError(f"the newstest recipe needs --codes, the model's BPE codes file; "
                             f"got {codes!r}.")
    data = {}
    for l in (src, tgt):
        moses = Moses(l, aggressive=True, normalize=True)
        data["valid", l] = parallel_map(
            moses, _corpus(os.path.join(orig, "dev"), valid_sets.split(","), l), workers,
            f"tokenise {valid_sets}.{l}")
        data["test", l] = parallel_map(moses, read_lines(os.path.join(orig, "dev",
                                                                      f"{test_set}.{l}")),
                                       workers, f"tokenise {test_set}.{l}")
    _pair(data["valid", src], data["valid", tgt], valid_sets)
    return {"src": src, "tgt": tgt, "data": data, "bpe": ("given", codes), "clean": None}


RECIPES = {"iwslt14": iwslt14, "wmt14-en-de": wmt14_en_de, "wmt-en-ru": wmt_en_ru,
           "newstest": newstest}


def prepare(recipe: str, orig: str, output_dir: str, workers: int = 1, **options) -> Dict:
    """Run ``recipe`` on the unpacked downloads in ``orig``; write the BPE-segmented splits to
    ``output_dir``; returns the manifest (also ``prepare.json``)."""
    if recipe not in RECIPES:
        raise HeadPruneError(f"unknown recipe {recipe!r}; expected one of {', '.join(RECIPES)}.")
    if not os.path.isdir(orig):
        raise HeadPruneError(f"{orig} does not exist: download the archives first.")
    r = RECIPES[recipe](orig, workers=workers, **options)
    src, tgt, data = r["src"], r["tgt"], r["data"]
    os.makedirs(output_dir, exist_ok=True)
    kind, value = r["bpe"]
    if kind == "given":
        apply = {l: ApplyBPE(value) for l in (src, tgt)}
    elif kind == "joint":
        codes = os.path.join(output_dir, "code")
        learn_bpe([data["train", src], data["train", tgt]], value, codes)
        apply = {l: ApplyBPE(codes) for l in (src, tgt)}
    else:  # per language
        apply = {}
        for l in (src, tgt):
            learn_bpe([data["train", l]], value, os.path.join(output_dir, f"code.{l}"))
            apply[l] = ApplyBPE(os.path.join(output_dir, f"code.{l}"))
    splits = sorted({split for split, _ in data}, key=("train", "valid", "test").index)
    out = {(s, l): parallel_map(apply[l], data[s, l], workers, f"bpe {s}.{l}")
           for s in splits for l in (src, tgt)}
    if r["clean"]:
        _, which, ratio, low, high = r["clean"]
        for s in which:
            out[s, src], out[s, tgt] = clean(out[s, src], out[s, tgt], ratio, low, high)
    for (s, l), lines in out.items():
        with open(os.path.join(output_dir, f"{s}.{l}"), "w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in lines)
    manifest = {"recipe": recipe, "orig": os.path.abspath(orig), "src": src, "tgt": tgt,
                "bpe": [kind, value],
                "options": {k: v for k, v in options.items() if v is not None},
                "lines": {s: len(out[s, src]) for s in splits}}
    write_json(os.path.join(output_dir, "prepare.json"), manifest)
    return manifest


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", choices=sorted(RECIPES))
    parser.add_argument("--orig", required=True, help="folder of the unpacked downloads")
    parser.add_argument("-o", "--output-dir", required=True, help="where the text splits go")
    parser.add_argument("--merges", type=int, help="BPE merges (default: the recipe's: "
                        "iwslt14 10000, wmt14-en-de 40000, wmt-en-ru 32000 per language)")
    parser.add_argument("--nc", choices=["v12", "v9"], default="v12",
                        help="wmt14-en-de: News Commentary version (default: %(default)s)")
    parser.add_argument("--valid",
                        help="wmt14-en-de: 'split' (every 100th training line, the default) or a "
                             "dev/ set such as newstest2013; wmt-en-ru: a dev/ set (default "
                             "newstest2013)")
    parser.add_argument("--split-compounds", action="store_true",
                        help="iwslt14, wmt14-en-de: GHA's ##AT##-##AT## compound splitting")
    parser.add_argument("--codes", help="newstest: the model's BPE codes")
    parser.add_argument("--valid-sets", help="newstest: the importance split (default: "
                        "newstest2009,newstest2010,newstest2011,newstest2012)")
    parser.add_argument("--test-set", help="newstest: the BLEU split from dev/ (default "
                        "newstest2013); wmt-en-ru: the test-full/ set (default newstest2014)")
    parser.add_argument("--workers", type=int, default=1, help="(default: %(default)s)")
    opts = parser.parse_args(argv)
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.INFO)
    options = {k: getattr(opts, k) for k in ("nc", "valid", "split_compounds", "codes",
                                             "valid_sets", "test_set")
               if getattr(opts, k) is not None}
    if opts.merges is not None:
        if opts.merges < 1:
            parser.error(f"--merges must be a whole number >= 1, got {opts.merges}")
        options["merges"] = opts.merges
    try:
        m = prepare(opts.recipe, opts.orig, opts.output_dir, max(1, opts.workers), **options)
    except HeadPruneError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    print(f"{opts.recipe}: " + ", ".join(f"{s} {n:,}" for s, n in m["lines"].items())
          + f" pairs in {opts.output_dir}")


if __name__ == "__main__":
    main(sys.argv[1:])
