"""Decode a subset with fairseq's generator and score it with sacrebleu on detokenised text."""

import time
from argparse import Namespace
from dataclasses import dataclass
from typing import List, Optional

import sacrebleu
import torch
from fairseq import checkpoint_utils, utils

from fairseq_headprune import register  # noqa: F401
from fairseq_headprune.checkpoint import load_checkpoint


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
    load_checkpoint(path)  # clear errors for missing, corrupt or foreign files
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [path], arg_overrides={"data": data})
    return models[0].to(device).eval(), task


def batches(task, subset: str, model, max_tokens: Optional[int] = 4000,
            batch_size: Optional[int] = None, max_sentences_total: Optional[int] = None):
    """fairseq's batch iterator over a subset (sorted by length, as fairseq-generate does)."""
    if subset not in task.datasets:
        task.load_dataset(subset)
    dataset = task.dataset(subset)
    limit = max_sentences_total if max_sentences_total and max_sentences_total < len(dataset) \
        else None
    itr = task.get_batch_iterator(
        dataset=dataset, max_tokens=max_tokens, max_sentences=batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=True, seed=1).next_epoch_itr(shuffle=False)
    for sample in itr:
        if limit is not None:  # the first `limit` sentences of the subset
            keep = sample["id"] < limit
            if not keep.any():
                continue
            if not keep.all():
                sample = _select(sample, keep)
        yield sample


def _select(sample, keep):
    net = sample["net_input"]
    return {**sample, "id": sample["id"][keep], "nsentences": int(keep.sum()),
            "target": sample["target"][keep],
            "net_input": {**net, "src_tokens": net["src_tokens"][keep],
                          "src_lengths": net["src_lengths"][keep],
                          "prev_output_tokens": net["prev_output_tokens"][keep]}}


def translate(model, task, subset: str = "test", beam: int = 5, max_tokens: Optional[int] = 4000,
              batch_size: Optional[int] = None, max_sentences: Optional[int] = None,
              device: str = "cpu", max_len_b: int = 200) -> Translation:
    """Beam-search a subset; hypotheses and references detokenised (sentencepiece removed)."""
    generator = task.build_generator([model], Namespace(beam=beam, max_len_b=max_len_b))
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
