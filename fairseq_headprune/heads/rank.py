"""Rank correlation between two head-score tables (importance, relevance, learned gates).

Spearman's rho per attention type over the heads both tables score (NaN = a removed head is
left out), with tied scores given their average rank, as ``scipy.stats.spearmanr``.
"""

from typing import Dict, Optional

import numpy as np

from fairseq_headprune.heads.scores import Scores


def average_ranks(values: np.ndarray) -> np.ndarray:
    """0-based ranks of ``values`` (1-D); ties get the mean of the ranks they span."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.arange(len(values), dtype=np.float64)
    for v in np.unique(values):
        tied = values == v
        if tied.sum() > 1:
            ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> Optional[float]:
    """Spearman's rho of two equal-length vectors; None when either is constant or shorter
    than 2 (the correlation is undefined)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(a) < 2:
        return None
    ra, rb = average_ranks(a), average_ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    return None if denom == 0 else float((ra * rb).sum() / denom)


def correlate(a: Scores, b: Scores) -> Dict[str, Optional[float]]:
    """``{type: rho}`` for every attention type both tables have, plus ``"all"`` over every
    head (meaningful for per-layer-normalised scores, which share one scale)."""
    out: Dict[str, Optional[float]] = {}
    xs, ys = [], []
    for kind in [k for k in a if k in b]:
        x, y = a[kind].double().numpy().ravel(), b[kind].double().numpy().ravel()
        both = ~(np.isnan(x) | np.isnan(y))
        out[kind] = spearman(x[both], y[both])
        xs.append(x[both])
        ys.append(y[both])
    if xs:
        out["all"] = spearman(np.concatenate(xs), np.concatenate(ys))
    return out
