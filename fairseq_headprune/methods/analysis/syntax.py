"""Syntactic heads (Voita et al. 2019, Sec. 5.2): how often a head's maximum attention links
the two words of a dependency relation (nsubj, dobj, amod, advmod; dependent to head and head
to dependent), against a positional baseline (the relation's most frequent relative offset).

Parses come as CoNLL-U, one sentence per source sentence of the subset, in order, read with
the ``conllu`` package. Words are mapped to the model's source tokens by their characters:
sentencepiece pieces (``\u2581`` starts a word) or BPE pieces (``@@`` continues one) are joined and
must spell the CoNLL-U words; a piece belongs to the word that holds its first character.

Word-level attention (our convention; the paper works on words and does not say how): from word
i to word j = the mean over i's pieces of the summed weight on j's pieces; a head's choice for
word i is the word of maximum weight (the end-of-sentence token is not a word).
"""

from typing import Dict, List, Optional, Sequence, Tuple

import torch

from fairseq_headprune.errors import HeadPruneError

# relation -> the UD / Stanford labels counted (UD v2 renamed dobj to obj; subtypes count)
RELATIONS = {"nsubj": ("nsubj",), "dobj": ("dobj", "obj"), "amod": ("amod",),
             "advmod": ("advmod",)}
DIRECTIONS = ("dep->head", "head->dep")
SPACE = "\u2581"


def read_conllu(path: str) -> List[Tuple[List[str], List[Tuple[int, int, str]]]]:
    """Every sentence of a CoNLL-U file as (words, arcs): arcs are (dependent, head, relation)
    with 0-based words and relation one of :data:`RELATIONS`' keys (others and root arcs left
    out); multiword token lines and empty nodes are skipped."""
    import conllu

    label = {name: rel for rel, names in RELATIONS.items() for name in names}
    try:
        with open(path, encoding="utf-8") as f:
            sentences = []
            for sentence in conllu.parse_incr(f):
                tokens = [t for t in sentence if isinstance(t["id"], int)]
                index = {t["id"]: i for i, t in enumerate(tokens)}
                arcs = []
                for i, t in enumerate(tokens):
                    rel = label.get(str(t["deprel"] or "").split(":")[0])
                    if rel and t["head"] and t["head"] in index:
                        arcs.append((i, index[t["head"]], rel))
                sentences.append(([t["form"] for t in tokens], arcs))
            return sentences
    except FileNotFoundError as err:
        raise HeadPruneError(f"CoNLL-U file {path} does not exist.") from err
    except IsADirectoryError as err:
        raise HeadPruneError(f"CoNLL-U file {path} is a directory.") from err
    except (UnicodeDecodeError, conllu.exceptions.ParseException, ValueError) as err:
        raise HeadPruneError(f"{path} is not a readable CoNLL-U file: "
                             f"{str(err).splitlines()[0]}.") from err
    except (KeyError, IndexError, TypeError) as err:
        raise HeadPruneError(f"{path} is not a readable CoNLL-U file: a token line lacks the "
                             f"ten tab-separated columns ({type(err).__name__}: {err}).") from err


def piece_words(pieces: Sequence[str], words: Sequence[str]) -> Optional[List[int]]:
    """The word of each piece (0-based), or None when the pieces do not spell the words."""
    surface = [p.replace(SPACE, "").replace("@@", "") if p not in ("<unk>",) else None
               for p in pieces]
    if None in surface or "".join(surface) != "".join(w.replace(" ", "") for w in words):
        return None
    ends, pos = [], 0
    for w in words:
        pos += len(w.replace(" ", ""))
        ends.append(pos)
    owner, pos = [], 0
    for s in surface:
        word = next(i for i, end in enumerate(ends) if pos < end) if pos < ends[-1] else \
            len(words) - 1
        owner.append(word)
        pos += len(s)
    return owner


def check_alignment(parses, sources: Sequence[Sequence[str]], conllu_path: str,
                    subset: str, total: int):
    """One sentence unless the CoNLL-U file has one parse per sentence of the split
    (``total``) and each of the analysed ``sources`` (pieces, without EOS) spells its parse's
    words; the message names the first sentence that differs (1-based)."""
    first = None
    for i, pieces in enumerate(sources):
        if i >= len(parses) or piece_words(pieces, parses[i][0]) is None:
            first = i
            break
    where = ""
    if first is not None:
        words = " ".join(parses[first][0]) if first < len(parses) else "(none)"
        where = (f"sentence {first + 1} differs: CoNLL-U '{_short(words)}', source "
                 f"'{_short(' '.join(sources[first]))}'")
    if len(parses) != total:
        raise HeadPruneError(
            f"{conllu_path} has {len(parses)} sentences but the source side of '{subset}' has "
            f"{total}" + (f"; {where}" if where else "") + ".")
    if first is not None:
        raise HeadPruneError(f"{conllu_path} does not match the source side of '{subset}': "
                             f"{where}.")


def _short(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[:n] + "..."


def word_attention(maps: torch.Tensor, owner: Sequence[int], n_words: int) -> torch.Tensor:
    """``[heads, pieces, pieces]`` (one sentence, EOS dropped) -> ``[heads, words, words]``:
    summed over the attended word's pieces, averaged over the attending word's pieces."""
    to_word = torch.zeros(len(owner), n_words, dtype=maps.dtype, device=maps.device)
    to_word[torch.arange(len(owner)), torch.as_tensor(owner)] = 1.0  # pieces x words
    summed = maps @ to_word  # H x pieces x words
    return (to_word.T @ summed) / to_word.sum(0).clamp_min(1).view(1, -1, 1)


def relation_hits(word_maps: torch.Tensor, arcs: Sequence[Tuple[int, int, str]]
                  ) -> Dict[str, Tuple[torch.Tensor, int, List[int]]]:
    """Per ``relation:direction``: (hits per head, pairs, relative offsets of the pairs) over
    one sentence's arcs; the attending word's maximum must be the other word of the arc."""
    best = word_maps.argmax(-1)  # H x words
    out: Dict[str, Tuple[torch.Tensor, int, List[int]]] = {}
    for dep, head, rel in arcs:
        for direction, (src, dst) in zip(DIRECTIONS, ((dep, head), (head, dep))):
            key = f"{rel}:{direction}"
            hits, n, offsets = out.get(key, (torch.zeros(word_maps.size(0)), 0, []))
            out[key] = (hits + (best[:, src] == dst).float().cpu(), n + 1, offsets + [dst - src])
    return out


def positional_baseline(offsets: Sequence[int]) -> Tuple[int, float]:
    """The most frequent relative offset of a relation's pairs (ties to the smaller
    distance, then the smaller offset) and the share of pairs it gets right."""
    counts: Dict[int, int] = {}
    for o in offsets:
        counts[o] = counts.get(o, 0) + 1
    best = max(counts, key=lambda o: (counts[o], -abs(o), -o))
    return best, counts[best] / len(offsets)


class SyntaxCounts:
    """Running hits per encoder layer and ``relation:direction`` over the sentences seen."""

    def __init__(self):
        self.hits: Dict[int, Dict[str, torch.Tensor]] = {}
        self.pairs: Dict[str, int] = {}
        self.offsets: Dict[str, List[int]] = {}

    def add_sentence(self, arcs: Sequence[Tuple[int, int, str]]):
        """Count a sentence's pairs and their relative offsets (once, whatever the layers)."""
        for dep, head, rel in arcs:
            for direction, (src, dst) in zip(DIRECTIONS, ((dep, head), (head, dep))):
                key = f"{rel}:{direction}"
                self.pairs[key] = self.pairs.get(key, 0) + 1
                self.offsets.setdefault(key, []).append(dst - src)

    def add(self, layer: int, maps: torch.Tensor, owner: Sequence[int], n_words: int,
            arcs: Sequence[Tuple[int, int, str]]):
        """One sentence of one layer: ``maps [heads, pieces, pieces]`` without EOS."""
        table = self.hits.setdefault(layer, {})
        for key, (hits, _, _) in relation_hits(word_attention(maps, owner, n_words),
                                               arcs).items():
            table[key] = table[key] + hits if key in table else hits

    def summary(self, min_pairs: int):
        """``{key: {"pairs", "baseline_offset", "baseline", "accuracy": {layer: [heads]}}}``
        for relations with at least ``min_pairs`` pairs, and notes for the others."""
        out, notes = {}, []
        for key in sorted(self.pairs):
            n = self.pairs[key]
            if n < min_pairs:
                notes.append(f"syntactic: {key} has {n} pairs, fewer than --min-pairs "
                             f"{min_pairs}: left out.")
                continue
            offset, baseline = positional_baseline(self.offsets[key])
            out[key] = {"pairs": n, "baseline_offset": offset, "baseline": baseline,
                        "accuracy": {layer: t[key] / n for layer, t in self.hits.items()
                                     if key in t}}
        if not self.pairs:
            notes.append("syntactic: the parses hold no nsubj, dobj/obj, amod or advmod arc.")
        return out, notes


def parse_with_spacy(texts: Sequence[str], model: str):
    """Parse raw sentences with a spaCy pipeline (the optional ``syntax`` extra): the same
    (words, arcs) as :func:`read_conllu`, or (None, note) when spaCy or the model is missing,
    so that the syntactic measure is skipped with a note instead of failing."""
    try:
        import spacy
    except ImportError:
        return None, "syntactic: spaCy is not installed (pip install .[syntax]): skipped."
    try:
        nlp = spacy.load(model)
    except OSError:
        return None, (f"syntactic: the spaCy model '{model}' is not installed (python -m spacy "
                      f"download {model}): skipped.")
    label = {name: rel for rel, names in RELATIONS.items() for name in names}
    parses = []
    for doc in nlp.pipe(texts):
        arcs = [(t.i, t.head.i, label[t.dep_.split(":")[0]]) for t in doc
                if t.head.i != t.i and t.dep_.split(":")[0] in label]
        parses.append(([t.text for t in doc], arcs))
    return parses, None


def detokenize(pieces: Sequence[str]) -> str:
    """Raw text of a sentence's source pieces: sentencepiece, BPE (``@@``) or plain tokens."""
    if any(p.startswith(SPACE) for p in pieces):
        return "".join(pieces).replace(SPACE, " ").strip()
    return " ".join(pieces).replace("@@ ", "").strip()
