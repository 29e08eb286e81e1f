"""Turn a stock fairseq ``transformer*`` checkpoint into a ``transformer_headprune`` one."""

import copy
from argparse import Namespace

import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_MODEL_REGISTRY, build_model
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


OLD_NAMES = ("in_proj_weight", ".layer_norms.", "decoder.embed_out")


def sized_dictionary(size: int) -> Dictionary:
    d = Dictionary()
    while len(d) < size:
        d.add_symbol(f"w{len(d)}")
    return d


def upgrade_weights(state: dict, args):
    """Rename an old stock checkpoint's weights as today's fairseq names them, with fairseq's own
    ``upgrade_state_dict`` (which its loader applies on every load): one ``in_proj_weight`` per
    attention split into q/k/v, the layers' ``layer_norms.N`` lists, ``decoder.embed_out``. Such
    are the published models of 2018-2019 (wmt14.en-fr.joined-dict.transformer, Michel et al.'s);
    the stock model that upgrades them is built on the meta device, so no memory is used."""
    sd = state["model"]
    if not any(name in k for k in sd for name in OLD_NAMES):
        return
    task = Namespace(source_dictionary=sized_dictionary(sd["encoder.embed_tokens.weight"].shape[0]),
                     target_dictionary=sized_dictionary(sd["decoder.embed_tokens.weight"].shape[0]))
    with torch.device("meta"):
        model = build_model(copy.deepcopy(args), task)
    model.upgrade_state_dict(sd)


def convert_state(state: dict, path: str) -> dict:
    """Convert a loaded stock Transformer checkpoint in place; outputs stay identical.

    The weights keep their values: an old checkpoint's names are upgraded first
    (:func:`upgrade_weights`), the architecture name changes and every attention module gets its
    ``kept_heads`` buffer (all heads). The optimizer state is dropped.
    """
    arch, cls = model_class(state)
    if cls is not TransformerModel:
        raise HeadPruneError(
            f"{path} holds a '{arch}' model; convert takes a stock fairseq transformer checkpoint.")
    args = model_args(state)
    upgrade_weights(state, args)
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
