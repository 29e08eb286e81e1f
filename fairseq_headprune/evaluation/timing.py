"""Side-by-side timing helpers shared by the benchmark commands."""

import statistics
import time
from typing import Callable, Dict, List

import torch


def interleaved_times(fns: Dict[str, Callable[[], object]], repeats: int, warmup: int = 1
                      ) -> Dict[str, List[float]]:
    """Time each callable ``repeats`` times, alternating between them so drift hits all alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    return times


def median(values: List[float]) -> float:
    return statistics.median(values)
