"""Compatibility with torch >= 2.6 for fairseq checkpoints, in one place.

torch 2.6 made ``torch.load(weights_only=True)`` the default. fairseq 0.12 checkpoints pickle an
``argparse.Namespace`` (``cfg["model"]`` of legacy models such as ``transformer``) and, after
validation, numpy scalars (``extra_state["best"]``), so ``fairseq.checkpoint_utils
.load_checkpoint_to_cpu`` fails (fairseq issue #5610). Rather than switching the safe loader off,
:func:`allow_fairseq_checkpoint_globals` adds exactly those classes to torch's allow-list, so
``fairseq-train --restore-file``, ``fairseq-validate``, ``fairseq-generate`` and
``fairseq-interactive`` load checkpoints once ``--user-dir`` has imported this plugin, and a
checkpoint carrying any other pickled object is still refused by torch.
"""

import argparse

import numpy as np
import torch

_NUMPY_SCALAR_TYPES = (np.float64, np.float32, np.int64, np.int32, np.bool_)


def fairseq_checkpoint_globals():
    """Return the non-tensor classes a fairseq translation checkpoint pickles."""
    allowed = [argparse.Namespace, np.dtype]
    core = getattr(np, "_core", None) or np.core  # numpy 2 renamed np.core to np._core
    allowed.append(core.multiarray.scalar)
    allowed.extend(type(np.dtype(t)) for t in _NUMPY_SCALAR_TYPES)
    return allowed


def allow_fairseq_checkpoint_globals():
    """Allow-list fairseq's checkpoint classes in ``torch.load(weights_only=True)``; idempotent."""
    add_safe_globals = getattr(torch.serialization, "add_safe_globals", None)
    if add_safe_globals is not None:  # torch < 2.4 loads everything anyway
        add_safe_globals(fairseq_checkpoint_globals())
