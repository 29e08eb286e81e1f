"""The scorer contract shared by every method (as Torch-Pruning's ``Importance``): given a model,
a batch and a criterion, a scorer returns per attention type (E, D, A) a ``[layers, original
heads]`` float tensor summed over the batch; heads already removed from the model are NaN.

Every method writes the same importance file from these tables, so ``choose``, ``sweep`` and
``ablate`` work on any of them. Registry: ``SCORERS`` (name -> class), filled by
:func:`register_scorer`.
"""

import json
import math
from abc import ABC, abstractmethod
from typing import Dict, Tuple

import torch
import torch.nn as nn

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.heads.layout import ATTENTION_TYPES, HeadLayout

Scores = Dict[str, torch.Tensor]

SCORERS: Dict[str, type] = {}


def register_scorer(name: str):
    """Class decorator: make a :class:`HeadImportance` available as ``--importance-scorer name``."""
    def wrap(cls):
        if name in SCORERS:
            raise ValueError(f"scorer {name!r} is registered twice")
        SCORERS[name] = cls
        return cls
    return wrap


class HeadImportance(ABC):
    """Scores every head of a ``transformer_headprune`` model on one batch."""

    method = ""  # the paper and quantity, recorded in the importance file

    @classmethod
    def from_config(cls, cfg) -> "HeadImportance":
        """The scorer the ``head_importance`` task's options describe."""
        return cls()

    def options(self) -> dict:
        """The scorer's settings, recorded in the importance file."""
        return {}

    @abstractmethod
    def batch_scores(self, model: nn.Module, sample: dict, criterion
                     ) -> Tuple[Scores, torch.Tensor, int, dict]:
        """Return (scores summed over the batch, loss, sample_size, logging_output)."""


def empty_scores(layout: HeadLayout) -> Scores:
    """NaN tables of the original shape, one per attention type present."""
    return {k: torch.full((layout.num_layers(k), layout.num_heads[k]), math.nan,
                          dtype=torch.float64) for k in layout.kept}


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
            tables = json.load(f)["importance"]
        if not isinstance(tables, dict) or not tables or any(
                k not in ("E", "D", "A") or not isinstance(rows, list) or not rows
                or not all(isinstance(r, list) and len(r) == len(rows[0]) for r in rows)
                for k, rows in tables.items()):
            raise ValueError("'importance' must map E, D, A to layers x heads tables")
        return from_lists(tables)
    except FileNotFoundError as err:
        raise HeadPruneError(f"importance file {path} does not exist.") from err
    except IsADirectoryError as err:
        raise HeadPruneError(f"importance file {path} is a directory.") from err
    except (ValueError, KeyError, TypeError) as err:
        raise HeadPruneError(f"{path} is not an importance JSON written by the head_importance "
                             f"task ({type(err).__name__}: {err}).") from err


def from_lists(tables: Dict[str, list]) -> Scores:
    return {k: torch.tensor([[math.nan if v is None else v for v in row] for row in rows],
                            dtype=torch.float64) for k, rows in tables.items()}
