"""Folding: turn a model with continuous head gates into a plain pruned ``transformer_headprune``.

Shared by every method that learns gates (Voita's Hard Concrete, DSP's subset, fixed masks):
heads whose evaluation gate is exactly 0 are removed, each surviving head's gate value is
multiplied into its ``out_proj`` columns (the gate scales the head's context right before
``out_proj``, so ``out_proj(g * ctx) == (out_proj.weight * g) ctx``), and the gate module is
dropped. The result has no ``head_gates`` entries and decodes in stock ``fairseq-generate
--user-dir user_dir``, with the gated model's outputs.
"""

from typing import Dict, Optional

import torch

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.heads.layout import module_prefix
from fairseq_headprune.heads.spec import HeadSpec
from fairseq_headprune.model.gates import gates_from_state_dict, split_key
from fairseq_headprune.pruning.checkpoint import (
    checkpoint_layout, count_parameters, load_checkpoint, model_args, require_headprune,
    save_checkpoint, strip_training_state)
from fairseq_headprune.pruning.remove import remove_heads


def checkpoint_gates(state: dict):
    """The gate module of a loaded gated checkpoint (eval values via ``.eval_values()``), or None."""
    args = model_args(state)
    kind = getattr(args, "head_gates", None)
    if not kind:
        return None
    return gates_from_state_dict(kind, getattr(args, "head_gates_types", "E,D,A"),
                                 state["model"], args)


def keep_largest(values: Dict[str, torch.Tensor], keep: int,
                 rank: Optional[Dict[str, torch.Tensor]] = None) -> Dict[str, torch.Tensor]:
    """Gate values with all but the ``keep`` largest (over every module; by ``rank`` where
    given, else by value) set to 0, as the DSP fork's ``generate_voita.py --num-of-heads K``;
    ties go to the earlier module and head."""
    rank = rank or values
    flat = [(float(v), i, key, h) for i, (key, t) in enumerate(rank.items())
            for h, v in enumerate(t.tolist())]
    if not 0 <= keep <= len(flat):
        raise HeadPruneError(f"cannot keep {keep} heads: the model has {len(flat)} gated heads.")
    chosen = {(key, h) for _, _, key, h in sorted(flat, key=lambda x: (-x[0], x[1], x[3]))[:keep]}
    return {key: torch.tensor([v if (key, h) in chosen else 0.0 for h, v in enumerate(t.tolist())])
            for key, t in values.items()}


def expected_open(gates) -> int:
    """CoFi's deterministic mask size (Xia et al. 2022, ``l0_module.py``, ``deterministic_z``):
    the expected number of open gates, rounded; for gates that have a P(open) (Hard Concrete)."""
    if not hasattr(gates, "p_open"):
        raise HeadPruneError(f"--keep-expected needs gates with a probability of being open "
                             f"(hard_concrete), not '{gates.kind}' gates.")
    with torch.no_grad():
        return int(round(float(sum(p.sum() for p in gates.p_open().values()))))


def fold_state(state: dict, path: str = "the checkpoint", keep: Optional[int] = None,
               keep_expected: bool = False) -> Dict[str, int]:
    """Fold the gates of a loaded gated checkpoint in place (see the module docstring); with
    ``keep``, only the ``keep`` largest evaluation gates stay open (:func:`keep_largest`); with
    ``keep_expected``, the rounded expected number of open gates, largest P(open) first (CoFi's
    deterministic mask, the end of ``--l0-target-heads`` training).

    Returns:
        ``heads_before``, ``heads_after``, ``removed``, ``scaled`` (heads whose gate was neither
        0 nor 1), ``params_before``, ``params_after``.
    """
    gates = checkpoint_gates(state)
    if gates is None:
        raise HeadPruneError(f"{path} has no head gates to fold (its model has no --head-gates).")
    args, sd = model_args(state), state["model"]
    layout = checkpoint_layout(state)
    report = {"heads_before": layout.count(), "params_before": count_parameters(sd), "scaled": 0}
    closed: HeadSpec = {}
    values = gates.eval_values()
    if keep_expected:
        keep = report["expected_open"] = expected_open(gates)
        with torch.no_grad():
            values = keep_largest(values, keep, {k: p.float().cpu()
                                                 for k, p in gates.p_open().items()})
    elif keep is not None:
        values = keep_largest(values, keep)
    for key, value in values.items():
        if value.dim() != 1:
            raise HeadPruneError(f"the {gates.kind} gates of {key} are per sentence "
                                 f"(shape {tuple(value.shape)}) and cannot be folded.")
        kind, layer = split_key(key)
        prefix = module_prefix(kind, layer)
        kept = sd[prefix + "kept_heads"].tolist()
        weight = sd[prefix + "out_proj.weight"]  # C x (H*d)
        if len(kept):
            scale = value.to(weight.dtype).repeat_interleave(weight.size(1) // len(kept))
            sd[prefix + "out_proj.weight"] = weight * scale  # column h*d+i scaled by g_h
        report["scaled"] += int(((value != 0) & (value != 1)).sum())
        shut = [kept[i] for i, g in enumerate(value.tolist()) if g == 0.0]
        if shut:
            closed.setdefault(kind, {})[layer] = shut
    for key in [k for k in sd if k.startswith("head_gates.")]:
        del sd[key]
    report["removed"] = remove_heads(sd, layout, closed)
    args.head_gates = None
    args.head_gates_only = False
    args.head_layout = checkpoint_layout(state).to_json()
    strip_training_state(state)
    report.update(heads_after=checkpoint_layout(state).count(), params_after=count_parameters(sd))
    return report


def fold_checkpoint(path: str, output: str, keep: Optional[int] = None,
                    keep_expected: bool = False) -> Dict[str, int]:
    """Fold the gates of checkpoint ``path`` and write the plain pruned checkpoint ``output``."""
    state = load_checkpoint(path)
    require_headprune(state, path, gates_ok=True)
    report = fold_state(state, path, keep, keep_expected)
    save_checkpoint(state, output)
    return report

