"""The gate seam: a registry of gate kinds and the one gate module a model owns.

A *gate kind* is a subclass of :class:`HeadGates` registered with :func:`register_gate` (a plain
dict filled by a decorator, as fairseq registers criterions). ``transformer_headprune`` builds the
kind named by ``--head-gates KIND`` over the attention types of ``--head-gates-types`` (E encoder
self, D decoder self, A encoder-decoder) as ``model.head_gates``, so its parameters train and save
with the model (state-dict keys ``head_gates.*``). Each gated attention module's ``out_proj`` holds
a :class:`GateHandle` that asks the gate module for that module's gate in the current forward:
``[heads]`` or ``[batch, heads]``, one entry per kept head (see ``HeadGatedLinear``).

The gate module computes every module's gate at once (:meth:`HeadGates.compute`), the first time
one is asked for after :meth:`HeadGates.reset`; the model resets it at each ``forward``, so a
training batch draws one sample for all modules (a global budget such as DSP's needs this), and
incremental decoding reuses the eval gates of the first step. Gate parameters and buffers stay
in their own dtype (float32; float64 for DSP's logits) when the model is cast with ``.half()`` /
``.to(bfloat16)`` (``--fp16``, ``--bf16``, ``--memory-efficient-fp16``); the gate is cast to the activations' dtype where it is applied.

Modules are named by keys ``E0``, ``D11``, ``A3``: type letter and 0-based layer.
"""

import argparse
import weakref
from typing import Callable, Dict, Optional, Type

import torch
import torch.nn as nn
from torch import Tensor
from torch.optim.optimizer import (
    register_optimizer_step_post_hook, register_optimizer_step_pre_hook)

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.heads.layout import (
    ATTENTION_TYPES, HeadLayout, attention_modules, module_prefix)

GATE_REGISTRY: Dict[str, Type["HeadGates"]] = {}


def register_gate(name: str) -> Callable[[type], type]:
    """Class decorator: make a :class:`HeadGates` subclass available as ``--head-gates name``."""
    def wrap(cls):
        if name in GATE_REGISTRY:
            raise ValueError(f"gate kind {name!r} is registered twice")
        if not issubclass(cls, HeadGates):
            raise ValueError(f"gate kind {name!r} must subclass HeadGates")
        cls.kind = name
        GATE_REGISTRY[name] = cls
        return cls
    return wrap


def module_key(kind: str, layer: int) -> str:
    """The gate key of one attention module: ``E0`` is encoder self-attention of layer 1."""
    return f"{kind}{layer}"


def split_key(key: str):
    """``"A3"`` -> ``("A", 3)``."""
    return key[0], int(key[1:])


def parse_gate_types(text: str, option: str = "--head-gates-types") -> str:
    """``"E,D,A"`` (or ``"EDA"``) -> ``"EDA"``; one sentence naming the valid letters otherwise."""
    letters = [c for c in str(text) if c not in ", "]
    for c in letters:
        if c not in ATTENTION_TYPES:
            raise HeadPruneError(
                f"unknown attention type '{c}' in {option} '{text}': expected letters "
                f"among E (encoder self), D (decoder self), A (encoder-decoder), e.g. E,D,A.")
    if not letters:
        raise HeadPruneError(f"{option} is empty: expected letters among E, D, A.")
    return "".join(k for k in ATTENTION_TYPES if k in letters)


def gate_types_arg(text: str) -> str:
    """argparse ``type=`` for ``--head-gates-types``."""
    try:
        return ",".join(parse_gate_types(text))
    except HeadPruneError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


_OWN_LR: "weakref.WeakSet[nn.Parameter]" = weakref.WeakSet()  # gate parameters with their own lr
_PENDING: list = []  # (group, its parameters, the gate parameters taken out, their lr)
_INNER = [False]


def _own_lr_pre_step(optimizer, args, kwargs):
    """Before any optimizer step: take the gate parameters that have their own learning rate out
    of their groups, so that the step leaves them alone. Matched by storage, so fairseq's fp32
    copies of the float32 gates (``--fp16-no-flatten-grads``, ``--bf16``) are found too."""
    if _INNER[0]:
        return
    _PENDING.clear()
    own = {p.data_ptr(): p.headprune_lr for p in list(_OWN_LR)}
    if not own:
        return
    for group in optimizer.param_groups:
        mine = [p for p in group["params"] if p.data_ptr() in own]
        if mine:
            _PENDING.append((group, group["params"], mine, own[mine[0].data_ptr()]))
            group["params"] = [p for p in group["params"] if p.data_ptr() not in own]


def _own_lr_post_step(optimizer, args, kwargs):
    """After the step: step the gate parameters alone, at their own rate, with the same
    optimizer (its state for them, e.g. Adam's moments, is kept); then restore the groups."""
    if _INNER[0] or not _PENDING:
        return
    pending, _PENDING[:] = list(_PENDING), []
    saved = [(g, g["params"], g["lr"]) for g in optimizer.param_groups]
    _INNER[0] = True
    try:
        for g in optimizer.param_groups:
            g["params"] = []
        for group, _, mine, lr in pending:
            group["params"], group["lr"] = mine, lr
            optimizer.step(*args[1:], **kwargs)  # args[0] is the optimizer itself
            group["params"] = []
    finally:
        _INNER[0] = False
        for g, params, lr in saved:
            g["params"], g["lr"] = params, lr
        for group, params, _, _ in pending:
            group["params"] = params


register_optimizer_step_pre_hook(_own_lr_pre_step)
register_optimizer_step_post_hook(_own_lr_post_step)


class HeadGates(nn.Module):
    """Base class of every gate kind: one module, owned by the model, gating many attention modules.

    Args:
        heads: gated module key (``E0``...) -> number of heads that module holds now.
        args: the model options (kind-specific hyperparameters are read from them).

    Subclasses implement :meth:`build` (create parameters and buffers for ``self.heads``) and
    :meth:`compute` (every module's gate for the current forward; training may sample), and may
    add options in :meth:`add_args` and override :meth:`active`.
    """

    kind = ""

    def __init__(self, heads: Dict[str, int], args: Optional[argparse.Namespace] = None):
        super().__init__()
        self.heads = dict(heads)
        self.args = args
        self._cache: Optional[Dict[str, Tensor]] = None
        self.build()
        self._mark_lr()

    def own_lr(self) -> Optional[float]:
        """The gate parameters' own learning rate: ``--head-gates-lr`` (None: the model's)."""
        return getattr(self.args, "head_gates_lr", None)

    def _mark_lr(self):
        """Give every gate parameter the rate of :meth:`own_lr` (none: the model's rate)."""
        lr = self.own_lr()
        for p in self.parameters():
            if lr is not None:
                p.headprune_lr = float(lr)
                _OWN_LR.add(p)

    @classmethod
    def add_args(cls, parser):
        """Add this kind's model options (``--KIND-...``) to fairseq's model argument group."""

    def build(self):
        """Create this kind's parameters and buffers for ``self.heads`` (called again on resize)."""

    def compute(self) -> Dict[str, Tensor]:
        """Every gated module's gate for this forward, ``{key: [heads] or [batch, heads]}``."""
        raise NotImplementedError

    def active(self, key: str) -> bool:
        """False where the gate is known to be all ones, so the module may take the fused path."""
        return True

    def gate(self, key: str) -> Tensor:
        """The gate of one module for the current forward (computed once for all modules)."""
        if self._cache is None:
            self._cache = self.compute()
        return self._cache[key]

    def reset(self):
        """Forget the current gates: the next :meth:`gate` computes (and in training samples) anew."""
        self._cache = None

    @torch.no_grad()
    def eval_values(self) -> Dict[str, Tensor]:
        """The deterministic evaluation gates, float32 on the CPU, without changing the mode."""
        was_training = self.training
        self.eval()
        try:
            return {k: v.detach().float().cpu() for k, v in self.compute().items()}
        finally:
            self.train(was_training)

    def resize(self, heads: Dict[str, int]):
        """Rebuild (fresh values) for other head counts, e.g. a pruned checkpoint's layout."""
        if dict(heads) != self.heads:
            self.heads = dict(heads)
            self.build()
            self._mark_lr()
        self.reset()

    def train(self, mode: bool = True):
        self.reset()
        return super().train(mode)

    def _apply(self, fn, recurse=True):
        """Move with the model, but keep floating tensors in their own dtype (float32, or
        float64 for DSP's logits) when the model is cast (``.half()``, ``--bf16``)."""
        self.reset()

        def move(t):  # only to fn's device: a cast and back would round the values
            return t.to(fn(t.new_empty(0)).device) if t.is_floating_point() else fn(t)
        return super()._apply(move, recurse)

    def _load_from_state_dict(self, *args, **kwargs):
        self.reset()
        super()._load_from_state_dict(*args, **kwargs)

    def upgrade_state_dict_named(self, state_dict, name):
        """Adopt the head counts of the checkpoint being loaded (its ``kept_heads`` buffers) and
        add fresh values for missing gate entries, so ``--restore-file`` of an ungated or pruned
        checkpoint starts gate training from this kind's initialisation."""
        root = name[: -len("head_gates")] if name.endswith("head_gates") else ""
        heads = {}
        for key, count in self.heads.items():
            kept = state_dict.get(root + module_prefix(*split_key(key)) + "kept_heads")
            heads[key] = len(kept) if kept is not None else count
        self.resize(heads)
        prefix = name + "." if name else ""
        for key, value in self.state_dict().items():
            state_dict.setdefault(prefix + key, value)

    def extra_repr(self) -> str:
        return f"kind={self.kind}, modules={','.join(self.heads)}"


class GateHandle:
    """The value of an attention module's gate slot: asks the owner for that module's gate.

    A plain object, not a module, so the owner's parameters are registered once (on the model).
    """

    __slots__ = ("owner", "key")

    def __init__(self, owner: HeadGates, key: str):
        self.owner = owner
        self.key = key

    def __call__(self) -> Tensor:
        return self.owner.gate(self.key)

    @property
    def active(self) -> bool:
        return self.owner.active(self.key)


@register_gate("mask")
class FixedGates(HeadGates):
    """Fixed per-head values, kept as buffers (not trained): 1 keeps a head, 0 closes it, a value
    in between scales its context. Michel et al. (2019)'s masking is this kind with 0/1 values;
    ``fairseq-headprune fold`` removes the 0 heads and folds the other values into ``out_proj``.
    A module whose values are all 1 is inactive and keeps fairseq's fused attention path."""

    def build(self):
        for name in [n for n, _ in self.named_buffers(recurse=False) if n.startswith("value_")]:
            delattr(self, name)
        for key, n in self.heads.items():
            self.register_buffer("value_" + key, torch.ones(n))

    def set_values(self, values: Dict[str, Tensor]):
        """Set the gate of some modules, ``{key: [heads]}`` (others keep theirs)."""
        for key, value in values.items():
            buf = getattr(self, "value_" + key)
            if tuple(value.shape) != tuple(buf.shape):
                raise HeadPruneError(f"gate values for {key} have shape {tuple(value.shape)}, "
                                     f"expected {tuple(buf.shape)}.")
            buf.copy_(value)
        self.reset()

    def compute(self):
        return {key: getattr(self, "value_" + key) for key in self.heads}

    def active(self, key):
        return not bool((getattr(self, "value_" + key) == 1).all())


def gated_heads(model: nn.Module, types: str) -> Dict[str, int]:
    """``{key: heads held now}`` of every attention module of ``types`` (letters of E, D, A)."""
    return {module_key(kind, layer): module.num_heads
            for kind, layer, module in attention_modules(model) if kind in types}


def build_gates(kind: str, heads: Dict[str, int], args=None) -> HeadGates:
    """Instantiate gate kind ``kind``, or fail in one sentence naming the valid kinds."""
    if kind not in GATE_REGISTRY:
        raise HeadPruneError(f"unknown gate kind '{kind}': valid kinds are "
                             f"{', '.join(sorted(GATE_REGISTRY))}.")
    return GATE_REGISTRY[kind](heads, args)


def gates_of(model: nn.Module) -> Optional[HeadGates]:
    """The model's gate module, or None."""
    return getattr(model, "head_gates", None)


def reset_gates(model: nn.Module, args):
    """Forward pre-hook of a gated model: its gate module forgets the previous batch's gates, so a
    training batch draws one fresh sample for every gated module (the model's ``forward`` stays
    fairseq's own, which TorchScript compiles)."""
    gates = gates_of(model)
    if gates is not None:
        gates.reset()


def attach_gates(model: nn.Module, gates: HeadGates) -> HeadGates:
    """Make ``gates`` the model's gate module and point each of its modules' gate slots at it."""
    detach_gates(model)
    param = next(model.parameters(), None)
    if param is not None:
        gates.to(param.device)
    model.head_gates = gates
    model.__dict__["_reset_gates_hook"] = model.register_forward_pre_hook(reset_gates)
    for kind, layer, module in attention_modules(model):
        key = module_key(kind, layer)
        if key in gates.heads:
            module.head_gate = GateHandle(gates, key)
    return gates


def detach_gates(model: nn.Module):
    """Remove the model's gate module (if any) and clear the gate slots pointing at it."""
    for _, _, module in attention_modules(model):
        if isinstance(module.head_gate, GateHandle):
            module.head_gate = None
    if "head_gates" in model._modules:
        del model._modules["head_gates"]
    model.__dict__["head_gates"] = None
    hook = model.__dict__.pop("_reset_gates_hook", None)
    if hook is not None:
        hook.remove()


def gates_from_state_dict(kind: str, types: str, state_dict: Dict[str, Tensor], args=None
                          ) -> HeadGates:
    """Rebuild a checkpoint's gate module from its state dict alone (no task, no model)."""
    kept = HeadLayout.from_state_dict(state_dict, {k: 0 for k in ATTENTION_TYPES}).kept
    heads = {module_key(t, layer): len(held) for t in parse_gate_types(types)
             for layer, held in enumerate(kept.get(t, []))}
    gates = build_gates(kind, heads, args)
    own = {k[len("head_gates."):]: v for k, v in state_dict.items() if k.startswith("head_gates.")}
    gates.load_state_dict(own, strict=True)
    return gates
