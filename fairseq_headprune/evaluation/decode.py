"""Decode a subset with fairseq's generator and score it with sacrebleu on detokenised text."""

import time
from argparse import Namespace
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import sacrebleu
import torch
from fairseq import checkpoint_utils, utils
from fairseq.data import data_utils

from fairseq_headprune import register  # noqa: F401
from fairseq_headprune.pruning.checkpoint import load_checkpoint, refuse_gates


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


def load_model(path: str, data: str, device: str = "cpu"):
    """Load a checkpoint (after a one-sentence check) with fairseq's loader; eval mode."""
    refuse_gates(load_checkpoint(path), path)  # clear errors for bad files and gated models
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


def translate(model, task, subset: str = "test", beam: int = 5, max_tokens: Optional[int] = 4000,
              batch_size: Optional[int] = None, max_sentences: Optional[int] = None,
              device: str = "cpu", max_len_b: int = 200, fixed_length: Optional[int] = None
              ) -> Translation:
    """Beam-search a subset; hypotheses and references detokenised (sentencepiece removed).

    ``fixed_length`` forces every hypothesis to exactly that many tokens (no end of sentence
    before), so that two models do the same number of decoding steps in a speed comparison.
    """
    lengths = dict(max_len_a=0, max_len_b=fixed_length, min_len=fixed_length) if fixed_length \
        else dict(max_len_b=max_len_b)
    generator = task.build_generator([model], Namespace(beam=beam, **lengths))
    tgt = task.target_dictionary
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
            hyps.append(tgt.string(best, "sentencepiece"))
            ref = utils.strip_pad(sample["target"][i], tgt.pad()).int().cpu()
            refs.append(tgt.string(ref, "sentencepiece", escape_unk=True))
            ids.append(sid)
    order = sorted(range(len(ids)), key=ids.__getitem__)
    return Translation([hyps[i] for i in order], [refs[i] for i in order], seconds, n_tokens)
