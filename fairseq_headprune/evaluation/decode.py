"""Decode a subset with fairseq's generator and score it with sacrebleu on detokenised text.

Two kinds of data are detokenised: sentencepiece (the embedded demo corpus; pieces joined) and
Moses-tokenised text with subword-nmt BPE (the papers' data, ``fairseq_headprune.data.prepare``;
recognised by ``@@``-final dictionary entries): BPE joined (fairseq's ``subword_nmt``
post-processing) and the Moses tokenisation undone with sacremoses' detokenizer for the target
language, so that sacrebleu sees plain text on both sides.
"""

import glob
import os
import time
from argparse import Namespace
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import sacrebleu
import torch
from fairseq import checkpoint_utils, utils
from fairseq.data import Dictionary, data_utils

from fairseq_headprune import register  # noqa: F401
from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.pruning.checkpoint import load_checkpoint, model_args, require_headprune


@dataclass
class Translation:
    hypotheses: List[str]
    references: List[str]
    seconds: float
    hypothesis_tokens: int

    def bleu(self):
        """sacrebleu corpus BLEU; returns (score, signature)."""
        metric = sacrebleu.metrics.BLEU()
        result = metric.corpus_score(self.hypotheses, [self.references])
        return result.score, str(metric.get_signature())

    def chrf(self):
        """sacrebleu corpus chrF (chrF2, character 6-grams); returns (score, signature)."""
        metric = sacrebleu.metrics.CHRF()
        result = metric.corpus_score(self.hypotheses, [self.references])
        return result.score, str(metric.get_signature())


def check_data(state: dict, path: str, data: str, subset: Optional[str] = None):
    """One sentence, before any decoding, when DATA cannot serve the checkpoint: a missing
    folder, a missing split, or dictionaries whose sizes differ from the model's embeddings."""
    if not os.path.isdir(data):
        raise HeadPruneError(f"data directory {data} does not exist.")
    args = model_args(state)
    task = (state.get("cfg") or {}).get("task") or args
    langs = {"source": getattr(task, "source_lang", None),
             "target": getattr(task, "target_lang", None)}
    if None in langs.values():  # trained without --source-lang: fairseq infers it from DATA
        langs = dict(zip(("source", "target"), data_utils.infer_language_pair(data)))
    for side, stack in (("source", "encoder"), ("target", "decoder")):
        lang = langs[side]
        weight = state["model"].get(f"{stack}.embed_tokens.weight")
        dict_path = os.path.join(data, f"dict.{lang}.txt")
        if lang is None or weight is None:
            continue
        if not os.path.isfile(dict_path):
            raise HeadPruneError(f"{data} has no {side} dictionary dict.{lang}.txt for the "
                                 f"{lang} side of {path}.")
        size = len(Dictionary.load(dict_path))
        if size != weight.size(0):
            raise HeadPruneError(f"{dict_path} has {size} entries but {path} embeds "
                                 f"{weight.size(0)}: DATA was not built with this model's "
                                 f"dictionaries.")
    if subset and not glob.glob(os.path.join(glob.escape(data), f"{subset}.*.idx")):
        raise HeadPruneError(f"{data} has no '{subset}' split.")


def check_inputs(path: str, data: str, subset: Optional[str] = None):
    """One-sentence errors for a bad or gated checkpoint and for DATA that cannot serve it."""
    state = load_checkpoint(path)
    require_headprune(state, path)  # a transformer_headprune model without gates
    check_data(state, path, data, subset)


def load_model(path: str, data: str, device: str = "cpu", subset: Optional[str] = None,
               checked: bool = False):
    """Load a checkpoint with fairseq's loader, eval mode; first :func:`check_inputs` unless
    the caller already did (``checked``)."""
    if not checked:
        check_inputs(path, data, subset)
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [path], arg_overrides={"data": data})
    return models[0].to(device).eval(), task


def batches(task, subset: str, model, max_tokens: Optional[int] = 4000,
            batch_size: Optional[int] = None, max_sentences_total: Optional[int] = None):
    """The first ``max_sentences_total`` sentences of a subset (all by default), sorted by length
    and grouped by fairseq's ``batch_by_size``, as fairseq-generate groups them."""
    if subset not in task.datasets:
        task.load_dataset(subset)
    dataset = task.dataset(subset)
    n = min(max_sentences_total or len(dataset), len(dataset))
    limit = utils.resolve_max_positions(task.max_positions(), model.max_positions())
    ids = [i for i in range(n) if dataset.src_sizes[i] <= limit[0]]
    ids = np.array(sorted(ids, key=lambda i: (dataset.src_sizes[i], i)), dtype=np.int64)
    for chunk in data_utils.batch_by_size(ids, dataset.num_tokens, max_tokens=max_tokens,
                                          max_sentences=batch_size):
        yield dataset.collater([dataset[int(i)] for i in chunk])


def detokenizer(task):
    """The function from target token ids to plain text for ``task``'s data: sentencepiece
    pieces joined, or (a dictionary with ``@@``-final entries) subword-nmt BPE joined and the
    Moses tokenisation undone for the target language."""
    tgt = task.target_dictionary
    if not any(sym.endswith("@@") for sym in tgt.symbols):
        return lambda ids, escape_unk=False: tgt.string(ids, "sentencepiece",
                                                        escape_unk=escape_unk)
    from sacremoses import MosesDetokenizer

    moses = MosesDetokenizer(getattr(task.cfg, "target_lang", None) or "en")
    return lambda ids, escape_unk=False: moses.detokenize(
        tgt.string(ids, "subword_nmt", escape_unk=escape_unk).split())


def translate(model, task, subset: str = "test", beam: int = 5, max_tokens: Optional[int] = 4000,
              batch_size: Optional[int] = None, max_sentences: Optional[int] = None,
              device: str = "cpu", max_len_b: int = 200, fixed_length: Optional[int] = None,
              lenpen: float = 1.0) -> Translation:
    """Beam-search a subset; hypotheses and references detokenised (sentencepiece removed).

    ``lenpen`` is fairseq-generate's ``--lenpen``: a finished hypothesis is ranked by its
    log-probability divided by its length to the power ``lenpen`` (1: the mean per token).

    ``fixed_length`` forces every hypothesis to exactly that many tokens (no end of sentence
    before), so that two models do the same number of decoding steps in a speed comparison.
    """
    lengths = dict(max_len_a=0, max_len_b=fixed_length, min_len=fixed_length) if fixed_length \
        else dict(max_len_b=max_len_b)
    generator = task.build_generator([model], Namespace(beam=beam, lenpen=lenpen, **lengths))
    tgt = task.target_dictionary
    detok = detokenizer(task)
    hyps, refs, ids, n_tokens, seconds = [], [], [], 0, 0.0
    for sample in batches(task, subset, model, max_tokens, batch_size, max_sentences):
        sample = utils.move_to_cuda(sample) if device != "cpu" else sample
        if device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = task.inference_step(generator, [model], sample)
        if device != "cpu":
            torch.cuda.synchronize()
        seconds += time.perf_counter() - start
        for i, sid in enumerate(sample["id"].tolist()):
            best = out[i][0]["tokens"].int().cpu()
            n_tokens += len(best)
            hyps.append(detok(best))
            ref = utils.strip_pad(sample["target"][i], tgt.pad()).int().cpu()
            refs.append(detok(ref, escape_unk=True))
            ids.append(sid)
    order = sorted(range(len(ids)), key=ids.__getitem__)
    return Translation([hyps[i] for i in order], [refs[i] for i in order], seconds, n_tokens)
