"""``fairseq-headprune analyze``: the roles of a model's heads (Voita et al. 2019, Sec. 4-5)
over a subset, written as ``roles.json`` (tables per attention type, ``[layers, original
heads]``, ``null`` for removed heads, as importance files), ``roles.csv`` (one row per head)
and heatmaps (:mod:`.role_plots`).

Teacher-forced forward passes (the reference target as decoder input; no beam search) give
each head's attention maps. Counted query tokens: every source token but the end-of-sentence
token for E; for D and A every target step except the one that predicts end of sentence (its
query is the last real token), padding never. Voita et al. exclude EOS; which side's EOS is not
stated, so both are left out.

- confidence: mean over counted tokens of the head's maximum weight (E, D, A);
- positional: share of counted tokens whose maximum lies at offset -1 or +1 (the larger is
  reported with its offset); a head is positional at >= 90 % (E, D; not A, whose keys are
  another sequence);
- rare-word: share of counted tokens whose maximum lies on the least frequent source token of
  the sentence, frequency = the source dictionary's counts (fairseq-preprocess's ``dict.*.txt``
  over the training data); labelled at ``rare_share`` (the paper gives no threshold; default
  0.5, ours) (E, A: the heads that attend over the source);
- relevance (:mod:`fairseq_headprune.methods.analysis.lrp`) and syntactic accuracy
  (:mod:`fairseq_headprune.methods.analysis.syntax`) where asked for.
"""

import csv
import io
import logging
import math
import os
from typing import Dict, List, Optional, Sequence

import torch
from tqdm import tqdm

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.evaluation.decode import batches, check_inputs, load_model
from fairseq_headprune.evaluation.role_measures import (
    _table, _to, prepare_syntax, relevance_tables, syntax_tables)
from fairseq_headprune.evaluation.role_overlay import (
    compare_with_importance, overlay_survivors, read_scores)
from fairseq_headprune.heads.layout import ATTENTION_TYPES, HeadLayout
from fairseq_headprune.heads.scores import to_lists
from fairseq_headprune.io import atomic_path, data_fingerprint, write_json
from fairseq_headprune.methods.analysis import measures
from fairseq_headprune.methods.analysis.attention import record_attention

logger = logging.getLogger(__name__)

METHOD = "Voita et al. 2019, head roles (confidence, LRP relevance, positional, syntactic, " \
         "rare-word)"
POSITIONAL_TYPES = ("E", "D")
RARE_TYPES = ("E", "A")


class RoleCounts:
    """Running sums of the attention measures of every module over the batches seen."""

    def __init__(self, layout: HeadLayout):
        self.layout = layout
        self.tokens = {k: 0 for k in layout.kept}
        self.sentences = 0
        self.sums: Dict[str, Dict[str, Dict[int, torch.Tensor]]] = {
            name: {k: {} for k in layout.kept} for name in ("confidence", "positional", "rare")}

    def _add(self, name, kind, layer, value):
        table = self.sums[name][kind]
        table[layer] = table[layer] + value if layer in table else value.double().clone()

    def add_batch(self, maps, sample, pad: int, eos: int, counts: torch.Tensor,
                  syntax=None):
        src = sample["net_input"]["src_tokens"]
        tgt = sample["target"]
        self.sentences += src.size(0)
        queries = {"E": (src != pad) & (src != eos)}
        queries["D"] = queries["A"] = (tgt != pad) & (tgt != eos)
        rare = measures.rarest_tokens(src, counts, queries["E"])
        for kind in self.layout.kept:
            self.tokens[kind] += int(queries[kind].sum())
        for (kind, layer), m in maps.items():
            q = queries[kind]
            self._add("confidence", kind, layer, measures.confidence_sum(m, q))
            if kind in POSITIONAL_TYPES:
                self._add("positional", kind, layer, measures.positional_hits(m, q))
            if kind in RARE_TYPES:
                self._add("rare", kind, layer, measures.rare_hits(m, q, rare))
        if syntax is not None:
            syntax.add_batch(maps, sample, queries["E"])

    def tables(self) -> Dict[str, Dict[str, torch.Tensor]]:
        """Per type: ``confidence``, ``positional_share``, ``positional_offset``, ``rare_share``."""
        out = {"confidence": {}, "positional_share": {}, "positional_offset": {},
               "rare_share": {}}
        for kind in self.layout.kept:
            n = max(self.tokens[kind], 1)
            conf = self.sums["confidence"][kind]
            out["confidence"][kind] = _table(self.layout, kind,
                                             {k: v / n for k, v in conf.items()})
            if kind in POSITIONAL_TYPES:
                pos = self.sums["positional"][kind]
                out["positional_share"][kind] = _table(
                    self.layout, kind, {k: v.max(-1).values / n for k, v in pos.items()})
                offsets = torch.tensor(measures.OFFSETS)
                out["positional_offset"][kind] = _table(
                    self.layout, kind, {k: offsets[v.argmax(-1)].double() for k, v in pos.items()})
            if kind in RARE_TYPES:
                out["rare_share"][kind] = _table(
                    self.layout, kind, {k: v / n for k, v in self.sums["rare"][kind].items()})
        return out


def label_roles(tables: Dict[str, Dict[str, torch.Tensor]], layout: HeadLayout,
                rare_share: float) -> Dict[str, List[List[Optional[List[str]]]]]:
    """Per type and layer, for each original head, the list of its roles (``positional``,
    ``syntactic``, ``rare``), ``None`` for a removed head."""
    roles = {}
    for kind in layout.kept:
        rows = []
        for layer, kept in enumerate(layout.kept[kind]):
            row: List[Optional[List[str]]] = [None] * layout.num_heads[kind]
            for h in kept:
                mine = []
                pos = tables.get("positional_share", {}).get(kind)
                if pos is not None and pos[layer, h] >= measures.POSITIONAL_SHARE:
                    mine.append("positional")
                syn = tables.get("syntactic_margin", {}).get(kind)
                if syn is not None and syn[layer, h] >= SYNTACTIC_MARGIN:
                    mine.append("syntactic")
                rare = tables.get("rare_share", {}).get(kind)
                if rare is not None and rare[layer, h] >= rare_share:
                    mine.append("rare")
                row[h] = mine
            rows.append(row)
        roles[kind] = rows
    return roles


# Voita et al. (2019), Sec. 5.2: syntactic when clearly above the positional baseline; the
# notes' secondary summary gives 10 points of accuracy.
SYNTACTIC_MARGIN = 0.10


def analyze(data: str, path: str, output_dir: str, subset: str = "valid",
            max_sentences: Optional[int] = 500, max_tokens: int = 4000, device: str = "cpu",
            min_tokens: int = 100, rare_share: float = 0.5, lrp_sentences: int = 50,
            conllu: Optional[str] = None, min_pairs: int = 20, importance: Optional[str] = None,
            overlays: Sequence = (), overlay_keep: float = 0.5,
            spacy_model: Optional[str] = None) -> Dict:
    """Measure every head of ``path`` on ``subset`` of ``data``; write ``roles.json`` and
    ``roles.csv`` into ``output_dir``; return the JSON dict (see the module docstring)."""
    check_inputs(path, data, subset)
    model, task = load_model(path, data, device, subset, checked=True)
    layout = HeadLayout.from_model(model)
    methods = {name: overlay_survivors(name, file, layout, overlay_keep)
               for name, file in overlays}  # every input checked before the long passes
    scores = read_scores(importance, layout) if importance else None
    src_dict = task.source_dictionary
    counts = torch.tensor(src_dict.count, dtype=torch.long, device=device)
    stats = RoleCounts(layout)
    task.load_dataset(subset)
    if lrp_sentences:  # before the long passes
        from fairseq_headprune.methods.analysis.lrp_model import check_supported

        check_supported(model)
    syntax, notes = None, []
    if conllu or spacy_model:
        syntax, notes = prepare_syntax(conllu, task, subset, max_sentences, spacy_model)
    total = min(max_sentences or len(task.dataset(subset)), len(task.dataset(subset)))
    progress = tqdm(total=total, desc="analyze: attention", unit="sent")
    with torch.no_grad(), record_attention(model) as maps:
        for sample in batches(task, subset, model, max_tokens, None, max_sentences):
            sample = _to(sample, device)
            maps.clear()
            model(**sample["net_input"])
            stats.add_batch(maps, sample, src_dict.pad(), src_dict.eos(), counts, syntax)
            progress.update(sample["nsentences"])
    progress.close()
    if stats.sentences == 0:
        raise HeadPruneError(f"the '{subset}' split of {data} has no sentence the model can "
                             f"read; nothing was written.")
    tables = stats.tables()
    for kind, n in stats.tokens.items():
        if n < min_tokens:
            note = (f"{kind}: {n} counted tokens in {stats.sentences} sentences, fewer than "
                    f"--min-tokens {min_tokens}: confidence, positional and rare-word shares of "
                    f"{kind} are left empty.")
            notes.append(note)
            for name in tables:
                if kind in tables[name]:
                    tables[name][kind].fill_(math.nan)
    syntactic, relation_names = None, None
    if syntax is not None:
        syntactic, syntax_measures, relation_names, syntax_notes = syntax_tables(
            syntax, layout, min_pairs, conllu or f"spacy:{spacy_model}")
        tables.update(syntax_measures)
        notes.extend(syntax_notes)
    predictions = 0
    if lrp_sentences:
        tables["relevance"], predictions = relevance_tables(model, task, subset, layout,
                                                            lrp_sentences, device)
    correlation = None
    if scores is not None:
        tables["importance"] = scores
        correlation = compare_with_importance(tables, scores, importance)
    result = {
        "method": METHOD, "checkpoint": os.path.abspath(path), "data": os.path.abspath(data),
        "subset": subset, "data_sha256": data_fingerprint(data, subset),
        "sentences": stats.sentences, "tokens": stats.tokens,
        "lrp": {"sentences": min(lrp_sentences, stats.sentences), "predictions": predictions,
                "rule": "two-sided alpha 0.5, beta 0.5, eps 1e-5, zero reference, bias spread "
                        "uniformly, rescaled to conserve relevance (voita lib/layers/lrp.py)",
                "start": "relevance 1 on the top-1 logit of each target step (teacher forced)",
                "normalised": "per layer: the kept heads of a layer sum to 1"},
        "thresholds": {"positional_share": measures.POSITIONAL_SHARE,
                       "positional_offsets": list(measures.OFFSETS),
                       "rare_share": rare_share, "syntactic_margin": SYNTACTIC_MARGIN},
        "frequency": "source dictionary counts (fairseq-preprocess dict over the training data)",
        "kept": layout.kept,
        "measures": {name: to_lists(t) for name, t in tables.items()},
        "roles": label_roles(tables, layout, rare_share),
        "notes": notes,
    }
    if syntactic is not None:
        result["measures"]["syntactic_relation"] = {"E": relation_names}
        result["syntactic"] = syntactic
    if correlation is not None:
        result["correlation"] = correlation
    if methods:
        result["overlay"] = {"keep": overlay_keep, "methods": methods}
    write_results(output_dir, result)
    return result


CSV_MEASURES = ("confidence", "relevance", "positional_share", "positional_offset",
                "rare_share", "syntactic_accuracy", "syntactic_relation", "syntactic_margin",
                "importance")


def csv_text(result: Dict) -> str:
    """One row per head of the original model: type, 1-based layer and head, kept, each
    measure (empty where it does not apply or the head is removed) and its roles."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["type", "layer", "head", "kept", *CSV_MEASURES, "roles"])
    m = result["measures"]
    for kind in ATTENTION_TYPES:
        if kind not in result["kept"]:
            continue
        for layer, kept in enumerate(result["kept"][kind]):
            for head in range(len(result["roles"][kind][layer])):
                cells = []
                for name in CSV_MEASURES:
                    table = m.get(name, {}).get(kind)
                    value = table[layer][head] if table else None
                    cells.append("" if value is None else
                                 (f"{value:.6g}" if isinstance(value, float) else value))
                roles = result["roles"][kind][layer][head]
                writer.writerow([kind, layer + 1, head + 1, int(head in kept), *cells,
                                 "" if roles is None else " ".join(roles)])
    return out.getvalue()


def write_results(output_dir: str, result: Dict):
    """``roles.json``, ``roles.csv`` and the figures (:mod:`.role_plots`) in ``output_dir``,
    each written atomically."""
    from fairseq_headprune.evaluation.role_plots import plot_measures, plot_overlay

    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "roles.json")
    write_json(path, result)
    with atomic_path(os.path.join(output_dir, "roles.csv")) as tmp, \
            open(tmp, "w", encoding="utf-8") as f:
        f.write(csv_text(result))
    plot_measures(path, output_dir)
    if result.get("overlay"):
        plot_overlay(path, os.path.join(output_dir, "overlay.png"))
