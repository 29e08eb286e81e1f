"""Turn a stock fairseq ``transformer*`` checkpoint into a ``transformer_headprune`` one."""

import torch
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.models.transformer import TransformerModel

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.heads.layout import ATTENTION_TYPES, module_prefix
from fairseq_headprune.model.transformer import ARCH
from fairseq_headprune.pruning.checkpoint import (
    load_checkpoint,
    model_args,
    model_class,
    strip_training_state,
)


def headprune_arch(stock_arch: str) -> str:
    """``transformer_iwslt_de_en`` -> ``transformer_headprune_iwslt_de_en`` where mirrored, else the
    base ``transformer_headprune`` (every option is saved in the checkpoint, so nothing is lost)."""
    mirrored = ARCH + stock_arch[len("transformer"):]
    return mirrored if mirrored in ARCH_MODEL_REGISTRY else ARCH


def convert_state(state: dict, path: str) -> dict:
    """Convert a loaded stock Transformer checkpoint in place; outputs stay identical.

    The weights are untouched; the architecture name changes and every attention module gets its
    ``kept_heads`` buffer (all heads). The optimizer state is dropped.
    """
    arch, cls = model_class(state)
    if cls is not TransformerModel:
        raise HeadPruneError(
            f"{path} holds a '{arch}' model; convert takes a stock fairseq transformer checkpoint.")
    args = model_args(state)
    args.arch = args._name = headprune_arch(arch)
    sd = state["model"]
    heads = {"E": args.encoder_attention_heads, "D": args.decoder_attention_heads,
             "A": args.decoder_attention_heads}
    for kind in ATTENTION_TYPES:
        layer = 0
        while module_prefix(kind, layer) + "q_proj.weight" in sd:
            sd[module_prefix(kind, layer) + "kept_heads"] = torch.arange(heads[kind])
            layer += 1
    strip_training_state(state)
    return state


def convert_checkpoint(path: str) -> dict:
    return convert_state(load_checkpoint(path), path)
