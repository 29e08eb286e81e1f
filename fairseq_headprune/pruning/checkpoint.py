"""Reading, checking and writing fairseq checkpoints without building a model or a task."""

import logging
import os
from argparse import Namespace
from typing import Dict

import torch
from fairseq import checkpoint_utils
from fairseq.models import ARCH_MODEL_REGISTRY
from omegaconf import OmegaConf

from fairseq_headprune.compat import allow_fairseq_checkpoint_globals
from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.heads.layout import (
    ATTENTION_TYPES, HeadLayout, check_kept, module_prefix)
from fairseq_headprune.io import atomic_path
from fairseq_headprune.model.transformer import HeadPruneTransformerModel

logger = logging.getLogger(__name__)

allow_fairseq_checkpoint_globals()

_BUFFER_SUFFIXES = ("version", "_float_tensor", "kept_heads")


def load_checkpoint(path: str) -> dict:
    """Load a fairseq checkpoint to CPU with fairseq's own upgrades, or fail in one sentence.

    A checkpoint of fairseq before 0.10 keeps its options as ``args`` (a Namespace); fairseq's
    loader converts them to ``cfg`` and leaves ``args`` beside it. ``args`` is dropped here, as
    fairseq's own saving does: otherwise every later load would rebuild ``cfg`` from it, and
    the changes a command makes to the options (convert's architecture name) would be lost.
    """
    if os.path.isdir(path):
        raise HeadPruneError(f"checkpoint {path} is a directory, not a checkpoint file.")
    if not os.path.isfile(path):
        raise HeadPruneError(f"checkpoint {path} does not exist.")
    if os.path.getsize(path) == 0:
        raise HeadPruneError(f"checkpoint {path} is empty (0 bytes).")
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(path)
    except Exception as err:  # torch raises many types for a bad file
        raise HeadPruneError(
            f"{path} is not a readable fairseq checkpoint (truncated or corrupt?): "
            f"{str(err).splitlines()[0] if str(err) else type(err).__name__}.") from err
    if not isinstance(state, dict) or "model" not in state or model_args(state) is None:
        raise HeadPruneError(f"{path} is not a fairseq checkpoint: it has no model and model options.")
    if state.get("cfg") is not None:
        state["args"] = None
    check_layout(state, path)
    return state


def check_layout(state: dict, path: str):
    """One sentence unless every ``kept_heads`` buffer of the checkpoint lists valid original
    heads matching its weights (:func:`check_kept`); a stock checkpoint has none to check."""
    args = model_args(state)
    sd = state["model"]
    for kind in ATTENTION_TYPES:
        heads = getattr(args, "encoder_attention_heads" if kind == "E" else
                        "decoder_attention_heads", None)
        dim = getattr(args, "encoder_embed_dim" if kind == "E" else "decoder_embed_dim", None)
        layer = 0
        while module_prefix(kind, layer) + "kept_heads" in sd:
            prefix = module_prefix(kind, layer)
            weight = sd.get(prefix + "v_proj.weight")
            if heads and dim and weight is not None:
                check_kept([int(h) for h in sd[prefix + "kept_heads"].reshape(-1).tolist()],
                           heads, weight.size(0), dim // heads, f"{path}, {kind}:{layer + 1}")
            layer += 1


def model_args(state: dict):
    """The model options (an ``argparse.Namespace`` for legacy models) of a loaded checkpoint."""
    cfg = state.get("cfg")
    if cfg is not None and cfg.get("model") is not None:
        return cfg["model"]
    return state.get("args")


def model_class(state: dict):
    args = model_args(state)
    arch = getattr(args, "arch", None) or getattr(args, "_name", None)
    return arch, ARCH_MODEL_REGISTRY.get(arch)


def require_headprune(state: dict, path: str, gates_ok: bool = False) -> Namespace:
    """Check that ``state`` holds a ``transformer_headprune`` model; return its options.

    Unless ``gates_ok``, a model with a gate module (``--head-gates``) is refused with the command
    that folds its gates.
    """
    arch, cls = model_class(state)
    if cls is not HeadPruneTransformerModel:
        hint = (" Convert it first with 'fairseq-headprune convert'."
                if cls is not None and issubclass(cls, HeadPruneTransformerModel.__mro__[1]) else "")
        raise HeadPruneError(
            f"{path} holds a '{arch}' model, not a transformer_headprune model.{hint}")
    if not gates_ok:
        refuse_gates(state, path)
    return model_args(state)


def refuse_gates(state: dict, path: str):
    """One sentence naming the command that folds a gated checkpoint's gates."""
    kind = getattr(model_args(state), "head_gates", None)
    if kind:
        raise HeadPruneError(
            f"{path} has '{kind}' head gates, which this command does not handle; fold them into "
            f"a plain pruned checkpoint first with 'fairseq-headprune fold --path {path} -o "
            f"FOLDED.pt'.")


def original_heads(args) -> Dict[str, int]:
    return {"E": args.encoder_attention_heads, "D": args.decoder_attention_heads,
            "A": args.decoder_attention_heads}


def checkpoint_layout(state: dict) -> HeadLayout:
    """The head layout recorded in a ``transformer_headprune`` checkpoint's ``kept_heads`` buffers."""
    return HeadLayout.from_state_dict(state["model"], original_heads(model_args(state)))


def _parameters(state_dict: Dict[str, torch.Tensor]):
    """The parameter tensors of a state dict, shared tensors once, buffers excluded."""
    seen = set()
    for key, tensor in state_dict.items():
        if key.endswith(_BUFFER_SUFFIXES) or not tensor.is_floating_point():
            continue
        ptr = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if ptr not in seen:
            seen.add(ptr)
            yield tensor


def count_parameters(state_dict: Dict[str, torch.Tensor]) -> int:
    """Number of model parameters in a state dict (shared tensors once, buffers excluded)."""
    return sum(t.numel() for t in _parameters(state_dict))


def parameter_bytes(state_dict: Dict[str, torch.Tensor]) -> int:
    """Bytes the model parameters take, in their stored dtype."""
    return sum(t.numel() * t.element_size() for t in _parameters(state_dict))


def save_checkpoint(state: dict, path: str):
    """Write a checkpoint atomically in the form fairseq itself writes (``cfg`` as a container)."""
    state = dict(state)
    if OmegaConf.is_config(state.get("cfg")):
        state["cfg"] = OmegaConf.to_container(state["cfg"], resolve=True, enum_to_str=True)
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def strip_training_state(state: dict):
    """Drop the optimizer state, which no longer matches the parameters' shapes.

    ``optimizer_history`` (names, lr-scheduler state, update count) stays: fairseq's loader needs it.
    """
    state["last_optimizer_state"] = None
