"""``--task head_importance``: score every head with ``fairseq-validate``.

    fairseq-validate DATA --user-dir user_dir --task head_importance --path ckpt.pt \\
        --valid-subset valid --importance-output importance.json

Each worker adds its batches' scores (one ``[layers, heads]`` table per attention type, and the
number of tokens or sentences they sum over) into running totals on the task; at the end,
:meth:`HeadImportanceTask.reduce_metrics` all-reduces the totals across the data-parallel
workers (when there are several) and rank 0 writes the JSON file. The totals do not travel in
the logging outputs: fairseq-validate gathers those through a fixed 16 KB buffer
(``--all-gather-list-size``), which per-batch tables of a large model overflow.
"""

import logging
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
from fairseq import distributed_utils
from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from fairseq_headprune.heads.layout import ATTENTION_TYPES, HeadLayout
from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.heads.scores import (
    SCORERS, Scores, empty_scores, normalize_by_layer, to_lists)
from fairseq_headprune.heads.spec import spec_to_json
from fairseq_headprune.io import check_writable, data_fingerprint, write_json
from fairseq_headprune.methods import gha  # noqa: F401  (registers the votes scorer)
from fairseq_headprune.methods.michel import COUNT  # importing registers the gradient scorer

logger = logging.getLogger(__name__)

KEY = "head_importance_"  # + attention type


@dataclass
class HeadImportanceConfig(TranslationConfig):
    importance_output: str = field(
        default="head_importance.json",
        metadata={"help": "JSON file the head importance is written to"})
    importance_scorer: ChoiceEnum(list(SCORERS)) = field(
        default="gradient",
        metadata={"help": "gradient: Michel et al. (2019) I_h = E_x |dL(x)/dxi_h|; votes: Ni "
                          "et al. (2023) Voting-to-Stay, the fraction of batches in which a "
                          "head is its group's member nearest the centre"})
    importance_abs: ChoiceEnum(["token", "sentence", "batch"]) = field(
        default="token",
        metadata={"help": "token: |<ctx, dL/dctx>| per token, averaged over tokens (the "
                          "authors' code); sentence: |dL(x)/dxi| per sentence (the paper's "
                          "equation); batch: per batch. token and sentence do not depend on "
                          "batching"})
    importance_normalize: ChoiceEnum(["layer_l2", "none"]) = field(
        default="layer_l2",
        metadata={"help": "divide each layer's scores by their L2 norm (the paper's default) "
                          "or keep raw mean scores"})
    vote_groups: int = field(
        default=gha.GROUPS, metadata={"help": "votes: C, the groups each module's heads are "
                                              "clustered into (one vote per group per batch)"})
    vote_feature: ChoiceEnum(list(gha.FEATURES)) = field(
        default="headout", metadata={"help": "votes: the feature map clustered"})
    vote_types: str = field(
        default="E,D,A", metadata={"help": "votes: attention types scored"})
    vote_seed: int = field(default=gha.SEED, metadata={"help": "votes: k-means seed"})


def scores_to_log(scores: Scores) -> Dict[str, torch.Tensor]:
    """Logging-output entries of one batch's scores (fairseq sums them across workers)."""
    return {KEY + kind: table for kind, table in scores.items()}


def reduce_importance(logging_outputs: List[dict], normalize: str = "layer_l2") -> Dict:
    """Sum the per-batch scores of any number of logging outputs (any number of workers).

    Returns:
        ``{"sentences", "tokens", "raw", "importance", "removed"}``; ``raw`` is the mean over
        the units each type's scores sum over (tokens in ``token`` mode, sentences otherwise) of
        the absolute gradients, ``importance`` the same after the chosen normalisation,
        ``removed`` the heads absent from the model (1-based).
    """
    sentences = sum(int(log.get("nsentences", 0)) for log in logging_outputs)
    tokens = sum(int(log.get("ntokens", 0)) for log in logging_outputs)
    totals: Scores = {}
    for kind in ATTENTION_TYPES:
        tables = [log[KEY + kind] for log in logging_outputs if KEY + kind in log]
        if tables:
            totals[kind] = torch.stack([torch.as_tensor(t) for t in tables]).sum(0)
    counts = {k: sum(int(log.get(COUNT + k, 0)) for log in logging_outputs) for k in totals}
    raw = {k: v / max(counts[k] or sentences, 1) for k, v in totals.items()}
    final = normalize_by_layer(raw) if normalize == "layer_l2" else raw
    removed = {k: {layer: [h for h in range(v.size(1)) if torch.isnan(v[layer, h])]
                   for layer in range(v.size(0))} for k, v in raw.items()}
    return {"sentences": sentences, "tokens": tokens, "raw": to_lists(raw),
            "importance": to_lists(final), "removed": spec_to_json(removed)}


@register_task("head_importance", dataclass=HeadImportanceConfig)
class HeadImportanceTask(TranslationTask):
    """A translation task whose validation scores attention heads instead of only the loss."""

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        """The translation task's set-up, with a missing data folder or dictionary as one
        sentence."""
        data = str(cfg.data).split(os.pathsep)[0]
        if not os.path.isdir(data):
            raise HeadPruneError(f"data directory {data} does not exist.")
        try:
            return super().setup_task(cfg, **kwargs)
        except FileNotFoundError as err:
            raise HeadPruneError(f"{data} is not a fairseq-preprocess folder: "
                                 f"{str(err).splitlines()[0]}.") from err

    def __init__(self, cfg, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        check_writable(str(cfg.importance_output), "importance_output")
        self.scorer = SCORERS[str(cfg.importance_scorer)].from_config(cfg)
        self.scored_subset = None
        self.totals: Optional[Dict[str, torch.Tensor]] = None  # this worker's running sums

    def build_model(self, cfg, from_checkpoint=False):
        """The translation task's model, its layers never wrapped for activation checkpointing:
        a checkpoint trained with --checkpoint-activations / --offload-activations saves them in
        its options, and the wrapped layers' first pass runs without gradients, where the probe
        gates would get none (every score 0)."""
        for name in ("checkpoint_activations", "offload_activations"):
            if getattr(cfg, name, False):
                setattr(cfg, name, False)
        return super().build_model(cfg, from_checkpoint)

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        try:
            super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        except FileNotFoundError as err:
            raise HeadPruneError(f"split '{split}' is not in {self.cfg.data}: "
                                 f"{str(err).splitlines()[0]}; nothing was written.") from err
        if split != getattr(self.cfg, "train_subset", "train"):
            self.scored_subset = split

    def valid_step(self, sample, model, criterion):
        model.eval()
        if not sample or "net_input" not in sample:  # the filler batch of a shorter shard
            if self.totals is None:  # every worker all-reduces the same keys, even one
                layout = HeadLayout.from_model(model)
                zeros = empty_scores(layout)  # NaN for removed heads, 0 for kept ones
                for kind, layers in layout.kept.items():
                    for layer, kept in enumerate(layers):
                        zeros[kind][layer, kept] = 0.0
                self.totals = {**scores_to_log(zeros), **{
                    COUNT + k: torch.zeros((), dtype=torch.float64) for k in zeros}}
            return torch.zeros(()), 0, {"nsentences": 0, "ntokens": 0, "sample_size": 0}
        scores, loss, sample_size, logging_output = self.scorer.batch_scores(
            model, sample, criterion)
        totals = self.totals if self.totals is not None else {}
        for key, value in {**scores_to_log(scores), **{
                k: torch.tensor(float(v), dtype=torch.float64)
                for k, v in logging_output.items() if k.startswith(COUNT)}}.items():
            totals[key] = totals[key] + value if key in totals else value.clone()
        self.totals = totals
        logging_output = {k: v for k, v in logging_output.items() if not k.startswith(COUNT)}
        return loss, sample_size, logging_output

    def _reduced_totals(self) -> Dict[str, torch.Tensor]:
        """This worker's totals, summed over every data-parallel worker when there are several."""
        totals, self.totals = self.totals or {}, None
        if distributed_utils.get_data_parallel_world_size() > 1:
            group = distributed_utils.get_data_parallel_group()
            device = torch.device("cuda") if torch.cuda.is_available() and (
                torch.distributed.get_backend() == "nccl") else torch.device("cpu")
            totals = {k: v.cpu() for k, v in distributed_utils.all_reduce_dict(
                totals, device=device, group=group).items()}
        return totals

    def reduce_metrics(self, logging_outputs, criterion):
        super().reduce_metrics(logging_outputs, criterion)
        if self.totals is None:  # nothing scored (not a head-importance run)
            return
        totals = self._reduced_totals()
        logging_outputs = [{k: v for k, v in log.items() if k.startswith("n")}
                           for log in logging_outputs] + [totals]
        subset = self.scored_subset
        expected = len(self.dataset(subset)) if subset in self.datasets else None
        counted = sum(int(log.get("nsentences", 0)) for log in logging_outputs)
        if expected is not None and counted != expected:
            raise HeadPruneError(
                f"head importance saw {counted} of the {expected} sentences of '{subset}' in "
                f"{self.cfg.data}: fairseq-validate drops the last batch unless "
                f"--required-batch-size-multiple 1 (and skips sentences longer than the model's "
                f"positions); nothing was written.")
        result = {"method": self.scorer.method,
                  "data": os.path.abspath(str(self.cfg.data)), "subset": subset,
                  "data_sha256": data_fingerprint(str(self.cfg.data), subset),
                  "scorer": str(self.cfg.importance_scorer),
                  **self.scorer.options(),
                  "normalize": str(self.cfg.importance_normalize),
                  **reduce_importance(logging_outputs, str(self.cfg.importance_normalize))}
        if distributed_utils.get_global_rank() == 0:
            write_json(self.cfg.importance_output, result)
            logger.info("head importance of %d sentences written to %s", result["sentences"],
                        self.cfg.importance_output)
