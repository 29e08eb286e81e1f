"""Confidence, positional and rare-word shares of attention heads (Voita et al. 2019, Sec. 4.1
and 5): pure functions of one module's per-head attention maps over a batch, so that sums over
batches give the measures over a subset.

Shapes: ``maps`` is ``[heads, batch, queries, keys]`` (softmax weights, padding keys 0);
``queries`` is a ``[batch, queries]`` bool mask of the query tokens that count (not padding,
not end of sentence: see :func:`fairseq_headprune.evaluation.roles`). Every function returns
per-head sums (``[heads]`` or ``[heads, offsets]``); divide by ``queries.sum()``.
"""

from typing import Sequence

import torch

# Voita et al. (2019), Sec. 5.1: a head is positional when at least 90 % of its tokens attend
# most to one fixed relative position; they report offsets -1 and +1.
POSITIONAL_SHARE = 0.9
OFFSETS = (-1, 1)


def confidence_sum(maps: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """Sum over the counted query tokens of each head's maximum attention weight
    (Voita et al. 2019, Sec. 4.1: confidence = the mean of it)."""
    top = maps.max(dim=-1).values  # H x B x Tq
    return (top * queries.unsqueeze(0)).sum(dim=(1, 2))


def positional_hits(maps: torch.Tensor, queries: torch.Tensor,
                    offsets: Sequence[int] = OFFSETS) -> torch.Tensor:
    """``[heads, offsets]``: how many counted query tokens at position i attend most to the key
    at position i + offset (self-attention, where queries and keys are the same tokens; ties of
    the maximum go to the lower position, as ``argmax``)."""
    best = maps.argmax(dim=-1)  # H x B x Tq
    position = torch.arange(maps.size(2), device=maps.device)
    hits = [((best - position) == off) & queries.unsqueeze(0) for off in offsets]
    return torch.stack([h.sum(dim=(1, 2)) for h in hits], dim=-1)


def rare_hits(maps: torch.Tensor, queries: torch.Tensor, rare: torch.Tensor) -> torch.Tensor:
    """``[heads]``: how many counted query tokens attend most to a least frequent key token of
    their sentence; ``rare`` is a ``[batch, keys]`` bool mask of those tokens (see
    :func:`rarest_tokens`)."""
    best = maps.argmax(dim=-1)  # H x B x Tq
    on_rare = torch.gather(rare.unsqueeze(0).expand(maps.size(0), -1, -1), 2, best)
    return (on_rare & queries.unsqueeze(0)).sum(dim=(1, 2))


def rarest_tokens(tokens: torch.Tensor, counts: torch.Tensor, allowed: torch.Tensor
                  ) -> torch.Tensor:
    """``[batch, keys]`` bool: the tokens of each sentence whose corpus count (``counts``
    indexed by token id, e.g. the source dictionary's counts from fairseq-preprocess) is the
    lowest among the ``allowed`` tokens of that sentence; ties all count."""
    freq = counts[tokens].double().masked_fill(~allowed, float("inf"))  # B x T
    return allowed & (freq == freq.min(dim=-1, keepdim=True).values)
