"""The ``transformer_headprune`` model: fairseq's ``transformer`` with a gate on every head.

Registered architectures mirror the stock ones: ``transformer_headprune`` (base),
``transformer_headprune_iwslt_de_en``, ``transformer_headprune_wmt_en_de``,
``transformer_headprune_vaswani_wmt_en_de_big`` and ``transformer_headprune_vaswani_wmt_en_fr_big``.
With all gates open its outputs equal the stock model with the same weights.
"""

from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerModel,
    base_architecture,
    transformer_iwslt_de_en,
    transformer_vaswani_wmt_en_de_big,
    transformer_vaswani_wmt_en_fr_big,
    transformer_wmt_en_de,
)

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.heads.layout import HeadLayout
from fairseq_headprune.model.gates import (
    GATE_REGISTRY, attach_gates, build_gates, gate_types_arg, gated_heads, parse_gate_types)
from fairseq_headprune.model.collaborative import collaborative_types, make_collaborative
from fairseq_headprune.model.layers import HeadPruneDecoder, HeadPruneEncoder

ARCH = "transformer_headprune"


@register_model(ARCH)
class HeadPruneTransformerModel(TransformerModel):
    """Transformer (Vaswani et al. 2017) whose encoder self, decoder self and encoder-decoder
    attention heads can each be gated and physically removed (see ``MaskedMultiheadAttention``).

    The head layout is saved twice: as the ``--head-layout`` model option and, authoritatively, as
    each attention module's ``kept_heads`` buffer. Loading a state dict reshapes the modules to the
    buffers' layout, so ``fairseq-train --restore-file pruned.pt`` needs no layout on the command
    line.

    ``--head-gates KIND`` gives the model one gate module of a registered kind (``mask``, and the
    kinds the methods register: ``hard_concrete``, ``subset``) over the attention types of
    ``--head-gates-types``; see :mod:`fairseq_headprune.model.gates`.
    """

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument(
            "--head-layout", type=str, metavar="JSON",
            help="kept heads per attention type and layer, as written by 'fairseq-headprune "
                 "prune' (default: all heads)",
        )
        parser.add_argument(
            "--head-gates", type=str, metavar="KIND", choices=sorted(GATE_REGISTRY),
            help="give the model a gate module of this kind, one gate per head of the types in "
                 "--head-gates-types (choices: " + ", ".join(sorted(GATE_REGISTRY)) + "; "
                 "default: no gates)",
        )
        parser.add_argument(
            "--head-gates-types", type=gate_types_arg, metavar="TYPES", default="E,D,A",
            help="attention types that get gates: E encoder self, D decoder self, A "
                 "encoder-decoder (default: E,D,A)",
        )
        parser.add_argument(
            "--head-gates-lr", type=float, metavar="LR",
            help="learning rate of the gate parameters, kept whatever the lr scheduler does to "
                 "the model's (default: the model's rate, as the papers); exact for adam, sgd, "
                 "nag and adagrad")
        parser.add_argument(
            "--head-gates-only", action="store_true",
            help="train the gate parameters alone, every other parameter frozen (DSP's "
                 "pipelined schedule: learn which heads to keep on a converged model)")
        parser.add_argument(
            "--collab-key-dim", type=int, metavar="N",
            help="collaborative attention (Cordonnier et al. 2020) on the types of "
                 "--collab-types: heads share query/key projections of N dimensions, mixed per "
                 "head (default: standard attention; 'fairseq-headprune collab' sets it when it "
                 "re-parametrises a trained model)")
        parser.add_argument(
            "--collab-types", type=gate_types_arg, metavar="TYPES", default="E,D,A",
            help="attention types made collaborative by --collab-key-dim: E encoder self, D "
                 "decoder self, A encoder-decoder (default: E,D,A)")
        for kind in sorted(GATE_REGISTRY):
            GATE_REGISTRY[kind].add_args(parser)

    @classmethod
    def build_model(cls, args, task):
        model = super().build_model(args, task)
        key_dim = getattr(args, "collab_key_dim", None)
        if key_dim is not None:
            make_collaborative(model, parse_gate_types(getattr(args, "collab_types", None)
                                                       or "E,D,A", "--collab-types"), key_dim)
        if getattr(args, "head_layout", None):
            HeadLayout.from_json(args.head_layout).apply(model)
        model.head_gates = None
        kind = getattr(args, "head_gates", None)
        if kind:
            types = parse_gate_types(getattr(args, "head_gates_types", None) or "E,D,A")
            gates = build_gates(kind, gated_heads(model, types), args)
            flag = ("--offload-activations" if getattr(args, "offload_activations", False)
                    else "--checkpoint-activations"
                    if getattr(args, "checkpoint_activations", False) else None)  # as passed
            if flag and any(p.requires_grad for p in gates.parameters()):
                raise HeadPruneError(
                    f"{kind} gates cannot be trained with {flag}: their sample is drawn once "
                    f"per batch inside the first layer, which activation checkpointing runs "
                    f"without gradients and recomputes; drop {flag}.")
            if gates.own_lr() is not None and getattr(args, "fp16", False) and not (
                    getattr(args, "memory_efficient_fp16", False)
                    or getattr(args, "fp16_no_flatten_grads", False)):
                raise HeadPruneError(
                    f"{kind} gates with their own learning rate (--head-gates-lr"
                    f"{', --subset-lr' if kind == 'subset' else ''}) under --fp16 need "
                    f"--fp16-no-flatten-grads or --memory-efficient-fp16 (flat fp32 copies hide "
                    f"the gates).")
            attach_gates(model, gates)
            if getattr(args, "head_gates_only", False):
                for name, param in model.named_parameters():
                    if not name.startswith("head_gates."):
                        param.requires_grad_(False)
        elif getattr(args, "head_gates_only", False):
            raise HeadPruneError("--head-gates-only trains the gates alone, but the model has "
                                 "none: add --head-gates KIND.")
        return model

    def upgrade_state_dict_named(self, state_dict, name):
        """Make the attention modules that are collaborative in ``state_dict`` collaborative here
        too (a fine-tuned collaborative checkpoint need not carry ``--collab-key-dim``: fairseq
        saves the command line's options), then let each module adopt its head layout."""
        for key_dim, types in collaborative_types(state_dict, name).items():
            make_collaborative(self, types, key_dim)
        super().upgrade_state_dict_named(state_dict, name)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return HeadPruneEncoder(TransformerConfig.from_namespace(args), src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        return HeadPruneDecoder(cfg, tgt_dict, embed_tokens,
                                no_encoder_attn=cfg.no_cross_attention)


def _register(name, stock_arch):
    register_model_architecture(ARCH, name)(stock_arch)


_register(ARCH, base_architecture)
_register(ARCH + "_iwslt_de_en", transformer_iwslt_de_en)
_register(ARCH + "_wmt_en_de", transformer_wmt_en_de)
_register(ARCH + "_vaswani_wmt_en_de_big", transformer_vaswani_wmt_en_de_big)
_register(ARCH + "_vaswani_wmt_en_fr_big", transformer_vaswani_wmt_en_fr_big)
