"""Head importance scorers. Contract (as Torch-Pruning's ``Importance``): given a model, a batch
and a criterion, return per attention type (E, D, A) a ``[layers, original heads]`` float tensor
summed over the batch; heads already removed from the model are NaN. Registry: ``SCORERS``.
"""

import json
import math
from abc import ABC, abstractmethod
from typing import Dict, List, Tuple

import torch
import torch.nn as nn

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.layout import ATTENTION_TYPES, HeadLayout, attention_modules

Scores = Dict[str, torch.Tensor]


class HeadImportance(ABC):
    """Scores every head of a ``transformer_headprune`` model on one batch."""

    @abstractmethod
    def batch_scores(self, model: nn.Module, sample: dict, criterion
                     ) -> Tuple[Scores, torch.Tensor, int, dict]:
        """Return (scores summed over the batch, loss, sample_size, logging_output)."""


def empty_scores(layout: HeadLayout) -> Scores:
    """NaN tables of the original shape, one per attention type present."""
    return {k: torch.full((layout.num_layers(k), layout.num_heads[k]), math.nan,
                          dtype=torch.float64) for k in layout.kept}


class GradientImportance(HeadImportance):
    """Michel, Levy & Neubig (2019), "Are Sixteen Heads Really Better than One?", eq. 3:
    I_h = E_x |d L(x) / d xi_h| at xi = 1, where xi_h gates head h's context.

    Args:
        absolute: ``"sentence"`` takes the absolute value of each sentence's gradient, as in the
            paper's equation, so the scores do not depend on how sentences are batched (one gate
            per sentence and head: a ``[batch, heads]`` gate whose gradient row b is
            d L(x_b) / d xi, since L sums over sentences); ``"batch"`` takes it of the whole
            batch's gradient, as the authors' code does.
    """

    def __init__(self, absolute: str = "sentence"):
        if absolute not in ("sentence", "batch"):
            raise ValueError(f"absolute must be 'sentence' or 'batch', got {absolute!r}")
        self.absolute = absolute

    def batch_scores(self, model, sample, criterion):
        layout = HeadLayout.from_model(model)
        bsz = sample["net_input"]["src_tokens"].size(0)
        device = sample["net_input"]["src_tokens"].device
        gates: List[Tuple[str, int, nn.Module, torch.Tensor]] = []
        for kind, layer, module in attention_modules(model):
            if module.num_heads == 0:
                continue
            shape = (bsz, module.num_heads) if self.absolute == "sentence" else (module.num_heads,)
            gate = torch.ones(shape, device=device, requires_grad=True)
            module.head_gate = gate
            gates.append((kind, layer, module, gate))
        try:
            with torch.enable_grad():
                loss, sample_size, logging_output = criterion(model, sample)
                grads = torch.autograd.grad(loss, [g for *_, g in gates], allow_unused=True)
        finally:
            for _, _, module, _ in gates:
                module.head_gate = None
        scores = empty_scores(layout)
        for (kind, layer, module, gate), grad in zip(gates, grads):
            grad = torch.zeros_like(gate) if grad is None else grad
            per_head = grad.abs().sum(0) if grad.dim() == 2 else grad.abs()  # [kept heads]
            scores[kind][layer, module.kept_heads] = per_head.double().cpu()
        return scores, loss.detach(), sample_size, logging_output


SCORERS = {"gradient": GradientImportance}


def normalize_by_layer(scores: Scores) -> Scores:
    """Divide each layer's scores by their L2 norm (Michel et al.'s ``--normalize-by-layer``),
    per attention type; removed heads (NaN) stay NaN and do not count in the norm."""
    out = {}
    for kind, table in scores.items():
        norm = torch.nan_to_num(table, nan=0.0).pow(2).sum(-1, keepdim=True).sqrt()
        out[kind] = table / (norm + 1e-20)
    return out


def to_lists(scores: Scores) -> Dict[str, list]:
    """JSON-ready tables, ``null`` for removed heads, in E, D, A order."""
    return {k: [[None if math.isnan(v) else v for v in row] for row in scores[k].tolist()]
            for k in ATTENTION_TYPES if k in scores}


def read_importance(path: str) -> Scores:
    """The ``importance`` tables of an importance JSON file, or a one-sentence error."""
    try:
        with open(path, encoding="utf-8") as f:
            return from_lists(json.load(f)["importance"])
    except FileNotFoundError as err:
        raise HeadPruneError(f"importance file {path} does not exist.") from err
    except (ValueError, KeyError, TypeError) as err:
        raise HeadPruneError(f"{path} is not an importance JSON written by the head_importance "
                             f"task ({type(err).__name__}: {err}).") from err


def from_lists(tables: Dict[str, list]) -> Scores:
    return {k: torch.tensor([[math.nan if v is None else v for v in row] for row in rows],
                            dtype=torch.float64) for k, rows in tables.items()}
