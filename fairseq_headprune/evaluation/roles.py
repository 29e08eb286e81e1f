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


def _table(layout: HeadLayout, kind: str, values: Dict[int, torch.Tensor]) -> torch.Tensor:
    """``[layers, original heads]`` float64, NaN where a head is removed or has no value."""
    table = torch.full((layout.num_layers(kind), layout.num_heads[kind]), math.nan,
                       dtype=torch.float64)
    for layer, kept in enumerate(layout.kept[kind]):
        if layer in values and kept:
            table[layer, kept] = values[layer].double().cpu()
    return table


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
        """``confidence``, ``positional_share``, ``positional_offset`` and ``rare_share`` per type."""
        out = {"confidence": {}, "positional_share": {}, "positional_offset": {},
               "rare_share": {}}
        for kind in self.layout.kept:
            n = max(self.tokens[kind], 1)
            out["confidence"][kind] = _table(self.layout, kind,
                                             {k: v / n for k, v in self.sums["confidence"][kind].items()})
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


def relevance_tables(model, task, subset: str, layout: HeadLayout, sentences: int,
                     device: str):
    """LRP relevance of every head (:class:`HeadRelevance`) for each top-1 prediction of the
    first ``sentences`` sentences (one at a time), summed over predictions, then divided per
    layer by the layer's sum (the heads of a layer share 1); returns (tables, predictions)."""
    from fairseq_headprune.methods.analysis.lrp import HeadRelevance

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
        normed = {layer: v / v.sum() for layer, v in sums[kind].items() if v.numel() and v.sum() > 0}
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
    part = {"conllu": os.path.abspath(conllu), "relations": relations,
            "word_attention": "from word i to word j: mean over i's pieces of the summed weight "
                              "on j's pieces; the head's choice is the word of maximum weight",
            "baseline": "per relation and direction, the most frequent relative offset"}
    return part, {"syntactic_accuracy": {"E": accuracy}, "syntactic_margin": {"E": margin}}, \
        names, notes


def prepare_syntax(conllu: str, task, subset: str, model, max_sentences: Optional[int]):
    """Read and check the parses against the source side (one sentence naming the first
    mismatch); returns the :class:`SyntaxPass`."""
    from fairseq_headprune.methods.analysis.syntax import (
        check_alignment, piece_words, read_conllu)

    parses = read_conllu(conllu)
    dataset = task.dataset(subset)
    src_dict = task.source_dictionary
    n = min(max_sentences or len(dataset), len(dataset))
    sources = [[src_dict[t] for t in dataset.src[i].tolist() if t != src_dict.eos()]
               for i in range(n)]
    check_alignment(parses, sources, conllu, subset, len(dataset))
    owners = [piece_words(pieces, parses[i][0]) for i, pieces in enumerate(sources)]
    return SyntaxPass(parses, owners)


def _same_shape(tables, layout: HeadLayout, what: str):
    """One sentence unless ``tables`` has the analysed model's types, layers and heads."""
    shape = {k: [layout.num_layers(k), layout.num_heads[k]] for k in layout.kept}
    theirs = {k: list(t.shape) for k, t in tables.items()}
    if theirs != shape:
        raise HeadPruneError(f"{what} is for a model with layers x heads {theirs}, not the "
                             f"analysed model's {shape}.")


def _is_checkpoint(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"PK"  # a torch zip file, as fairseq writes


def overlay_survivors(name: str, path: str, layout: HeadLayout, keep: float) -> Dict:
    """The heads of the analysed model that a method keeps: from a checkpoint (its kept heads,
    e.g. Voita's gates folded and removed), a head spec JSON (``choose -o``: the heads it
    prunes) or an importance/votes JSON (its ``keep`` best heads: a fraction < 1 of the
    analysed model's heads, or a count)."""
    what = f"--overlay {name}={path}"
    if not os.path.isfile(path):
        raise HeadPruneError(f"{what}: the file does not exist.")
    if _is_checkpoint(path):
        from fairseq_headprune.pruning.checkpoint import checkpoint_layout, load_checkpoint

        theirs = checkpoint_layout(load_checkpoint(path))
        _same_shape({k: torch.empty(theirs.num_layers(k), theirs.num_heads[k])
                     for k in theirs.kept}, layout, what)
        kept, source = theirs.kept, "checkpoint"
    else:
        import json

        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except ValueError as err:
            raise HeadPruneError(f"{what}: not JSON and not a checkpoint ({err}).") from err
        if isinstance(data, dict) and isinstance(data.get("importance"), dict):
            from fairseq_headprune.heads.scores import read_importance

            scores = read_importance(path)
            _same_shape(scores, layout, what)
            present = [(float(scores[k][layer, h]), k, layer, h) for k in layout.kept
                       for layer, heads in enumerate(layout.kept[k]) for h in heads
                       if not math.isnan(float(scores[k][layer, h]))]
            total = layout.count()
            n = int(round(keep * total)) if keep < 1 else min(int(keep), total)
            order = {k: i for i, k in enumerate("EDA")}
            best = sorted(present, key=lambda x: (-x[0], order[x[1]], x[2], x[3]))[:n]
            kept = {k: [sorted(h for _, kk, ll, h in best if kk == k and ll == layer)
                        for layer in range(layout.num_layers(k))] for k in layout.kept}
            source = "importance"
        else:
            from fairseq_headprune.heads.spec import spec_from_json

            pruned = spec_from_json(data)
            kept = {k: [[h for h in heads if h not in pruned.get(k, {}).get(layer, [])]
                        for layer, heads in enumerate(layout.kept[k])] for k in layout.kept}
            source = "head spec (pruned heads)"
    kept = {k: [[h for h in kept[k][layer] if h in layout.kept[k][layer]]
                for layer in range(layout.num_layers(k))] for k in layout.kept if k in kept}
    return {"source": os.path.abspath(path), "read_as": source, "kept": kept,
            "counts": {k: sum(len(x) for x in v) for k, v in kept.items()}}


def compare_with_importance(tables, importance: str, layout: HeadLayout):
    """Michel et al.'s importance of the same model, masked to its heads, and Spearman's rho of
    relevance and confidence against it, per type and over all heads."""
    from fairseq_headprune.heads.rank import correlate
    from fairseq_headprune.heads.scores import read_importance

    scores = read_importance(importance)
    _same_shape(scores, layout, f"--importance {importance}")
    scores = {k: v + (tables["confidence"][k] * 0) for k, v in scores.items()}  # NaN: removed
    correlation = {f"{name}_vs_importance": correlate(tables[name], scores)
                   for name in ("relevance", "confidence") if name in tables}
    return scores, {"importance": os.path.abspath(importance), "spearman": correlation}


def analyze(data: str, path: str, output_dir: str, subset: str = "valid",
            max_sentences: Optional[int] = 500, max_tokens: int = 4000, device: str = "cpu",
            min_tokens: int = 100, rare_share: float = 0.5, lrp_sentences: int = 50,
            conllu: Optional[str] = None, min_pairs: int = 20, importance: Optional[str] = None,
            overlays: Sequence = (), overlay_keep: float = 0.5) -> Dict:
    """Measure every head of ``path`` on ``subset`` of ``data``; write ``roles.json`` and
    ``roles.csv`` into ``output_dir``; return the JSON dict (see the module docstring)."""
    check_inputs(path, data, subset)
    model, task = load_model(path, data, device, subset, checked=True)
    layout = HeadLayout.from_model(model)
    methods = {name: overlay_survivors(name, file, layout, overlay_keep)
               for name, file in overlays}  # every input checked before the long passes
    src_dict = task.source_dictionary
    counts = torch.tensor(src_dict.count, dtype=torch.long, device=device)
    stats = RoleCounts(layout)
    task.load_dataset(subset)
    syntax = prepare_syntax(conllu, task, subset, model, max_sentences) if conllu else None
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
    notes = []
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
            syntax, layout, min_pairs, conllu)
        tables.update(syntax_measures)
        notes.extend(syntax_notes)
    predictions = 0
    if lrp_sentences:
        tables["relevance"], predictions = relevance_tables(model, task, subset, layout,
                                                            lrp_sentences, device)
    correlation = None
    if importance:
        tables["importance"], correlation = compare_with_importance(tables, importance, layout)
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


def _to(sample, device):
    if device == "cpu":
        return sample
    from fairseq import utils

    return utils.move_to_cuda(sample)


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
