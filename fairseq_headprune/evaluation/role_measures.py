"""The measures of ``analyze`` beyond the attention shares: LRP relevance over a subset
(:mod:`fairseq_headprune.methods.analysis.lrp_model`) and the syntactic accuracy from CoNLL-U
parses (:mod:`fairseq_headprune.methods.analysis.syntax`), as ``[layers, original heads]``
tables (NaN for removed heads)."""

import math
import os
from typing import Dict, Optional

import torch
from tqdm import tqdm

from fairseq_headprune.evaluation.decode import batches
from fairseq_headprune.heads.layout import HeadLayout
from fairseq_headprune.heads.scores import to_lists


def _table(layout: HeadLayout, kind: str, values: Dict[int, torch.Tensor]) -> torch.Tensor:
    """``[layers, original heads]`` float64, NaN where a head is removed or has no value."""
    table = torch.full((layout.num_layers(kind), layout.num_heads[kind]), math.nan,
                       dtype=torch.float64)
    for layer, kept in enumerate(layout.kept[kind]):
        if layer in values and kept:
            table[layer, kept] = values[layer].double().cpu()
    return table


def _to(sample, device):
    if device == "cpu":
        return sample
    from fairseq import utils

    return utils.move_to_cuda(sample)


def relevance_tables(model, task, subset: str, layout: HeadLayout, sentences: int,
                     device: str):
    """LRP relevance of every head (:class:`HeadRelevance`) for each top-1 prediction of the
    first ``sentences`` sentences (one at a time), summed over predictions, then divided per
    layer by the layer's sum (the heads of a layer share 1); returns (tables, predictions)."""
    from fairseq_headprune.methods.analysis.lrp_model import HeadRelevance

    lrp = HeadRelevance(model)
    sums: Dict[str, Dict[int, torch.Tensor]] = {k: {} for k in layout.kept}
    eos, pad = task.target_dictionary.eos(), task.target_dictionary.pad()
    predictions = 0
    for sample in tqdm(list(batches(task, subset, model, None, 1, sentences)),
                       desc="analyze: LRP", unit="sent"):
        sample = _to(sample, device)
        target = sample["target"][0]
        positions = [t for t, tok in enumerate(target.tolist()) if tok not in (eos, pad)]
        if not positions:
            continue
        predictions += len(positions)
        for (kind, layer), value in lrp.sentence(sample, positions).items():
            table = sums[kind]
            table[layer] = table[layer] + value.double() if layer in table else value.double()
    tables = {}
    for kind in layout.kept:
        normed = {layer: v / v.sum() for layer, v in sums[kind].items()
                  if v.numel() and v.sum() > 0}
        tables[kind] = _table(layout, kind, normed)
    return tables, predictions


class SyntaxPass:
    """The syntactic measure's share of the attention pass: per sentence of a batch, its
    encoder maps without padding and EOS, mapped to the words of its parse."""

    def __init__(self, parses, owners):
        from fairseq_headprune.methods.analysis.syntax import SyntaxCounts

        self.parses, self.owners = parses, owners
        self.counts = SyntaxCounts()

    def add_batch(self, maps, sample, words_mask):
        for b, sid in enumerate(sample["id"].tolist()):
            words, arcs = self.parses[sid]
            if not arcs:
                continue
            self.counts.add_sentence(arcs)
            keep = words_mask[b].nonzero().squeeze(1)
            for (kind, layer), m in maps.items():
                if kind == "E":
                    one = m[:, b].index_select(1, keep).index_select(2, keep)
                    self.counts.add(layer, one, self.owners[sid], len(words), arcs)


def syntax_tables(syntax: SyntaxPass, layout: HeadLayout, min_pairs: int, conllu: str):
    """The syntactic measure's JSON part, its E tables (accuracy and margin over the baseline
    at each head's best relation, and that relation's name) and notes."""
    found, notes = syntax.counts.summary(min_pairs)
    relations = {key: {**{k: v for k, v in r.items() if k != "accuracy"},
                       "accuracy": to_lists({"E": _table(layout, "E", r["accuracy"])})["E"]}
                 for key, r in found.items()}
    accuracy = torch.full((layout.num_layers("E"), layout.num_heads["E"]), math.nan,
                          dtype=torch.float64)
    margin, names = accuracy.clone(), [[None] * layout.num_heads["E"]
                                       for _ in range(layout.num_layers("E"))]
    for key, r in found.items():
        acc = _table(layout, "E", r["accuracy"])
        gain = acc - r["baseline"]
        better = ~torch.isnan(gain) & (torch.isnan(margin) | (gain > margin))
        margin[better], accuracy[better] = gain[better], acc[better]
        for layer, head in better.nonzero().tolist():
            names[layer][head] = key
    source = conllu if conllu.startswith("spacy:") else os.path.abspath(conllu)
    part = {"parses": source, "relations": relations,
            "word_attention": "from word i to word j: mean over i's pieces of the summed weight "
                              "on j's pieces; the head's choice is the word of maximum weight",
            "baseline": "per relation and direction, the most frequent relative offset"}
    return part, {"syntactic_accuracy": {"E": accuracy}, "syntactic_margin": {"E": margin}}, \
        names, notes


def prepare_syntax(conllu: Optional[str], task, subset: str, max_sentences: Optional[int],
                   spacy_model: Optional[str] = None):
    """The :class:`SyntaxPass` of CoNLL-U parses (read and checked against the source side: one
    sentence naming the first mismatch) or of spaCy parses of the detokenised source (sentences
    whose pieces spaCy's words do not spell are left out); returns (pass or None, notes)."""
    from fairseq_headprune.methods.analysis.syntax import (
        check_alignment, detokenize, parse_with_spacy, piece_words, read_conllu)

    dataset = task.dataset(subset)
    src_dict = task.source_dictionary
    n = min(max_sentences or len(dataset), len(dataset))
    sources = [[src_dict[t] for t in dataset.src[i].tolist() if t != src_dict.eos()]
               for i in range(n)]
    if conllu:
        parses = read_conllu(conllu)
        check_alignment(parses, sources, conllu, subset, len(dataset))
        return SyntaxPass(parses, [piece_words(p, parses[i][0])
                                   for i, p in enumerate(sources)]), []
    parses, note = parse_with_spacy([detokenize(p) for p in sources], spacy_model)
    if parses is None:
        return None, [note]
    owners = [piece_words(p, parses[i][0]) for i, p in enumerate(sources)]
    notes = []
    missed = sum(o is None for o in owners)
    if missed:
        notes.append(f"syntactic: spaCy's words do not spell the source pieces of {missed} of "
                     f"{n} sentences; they are left out.")
    parses = [(w, arcs if owners[i] is not None else []) for i, (w, arcs) in enumerate(parses)]
    return SyntaxPass(parses, owners), notes
