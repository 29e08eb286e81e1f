"""Which original heads each attention module keeps: the layout of a (pruned) model.

Attention types, as in Michel et al. (2019): ``E`` encoder self-attention, ``D`` decoder
self-attention, ``A`` decoder encoder-decoder (cross) attention. Internally layers and heads are
0-based; only the human-readable head spec (:mod:`fairseq_headprune.heads.spec`) is 1-based.
"""

import json
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Tuple

import torch.nn as nn

from fairseq_headprune.errors import HeadPruneError

# attention type -> (stack, attribute of a layer of that stack)
ATTENTION_TYPES: Dict[str, Tuple[str, str]] = {
    "E": ("encoder", "self_attn"),
    "D": ("decoder", "self_attn"),
    "A": ("decoder", "encoder_attn"),
}
TYPE_NAMES = {"E": "encoder self-attention", "D": "decoder self-attention",
              "A": "encoder-decoder attention"}


def module_prefix(kind: str, layer: int) -> str:
    """State-dict prefix of one attention module, e.g. ``decoder.layers.3.encoder_attn.``."""
    stack, attr = ATTENTION_TYPES[kind]
    return f"{stack}.layers.{layer}.{attr}."


def attention_modules(model: nn.Module) -> Iterator[Tuple[str, int, nn.Module]]:
    """Yield ``(type, layer, module)`` for every attention module of a fairseq Transformer."""
    for kind, (stack, attr) in ATTENTION_TYPES.items():
        for layer, block in enumerate(getattr(model, stack).layers):
            module = getattr(block, attr, None)
            if module is not None:
                yield kind, layer, module


def check_kept(kept: List[int], heads: int, rows: int, head_dim: int, where: str):
    """One sentence unless ``kept`` (a ``kept_heads`` buffer) lists distinct original heads in
    ascending order, each in ``range(heads)``, one per ``head_dim`` rows of ``v_proj``."""
    problem = None
    if any(h < 0 or h >= heads for h in kept):
        problem = f"it names head {max(kept) + 1} of {heads}"
    elif len(set(kept)) != len(kept):
        problem = "it names a head twice"
    elif kept != sorted(kept):
        problem = "its heads are not in ascending order"
    elif head_dim and rows != len(kept) * head_dim:
        problem = (f"it lists {len(kept)} heads but v_proj holds {rows} rows "
                   f"({rows / head_dim:g} heads of {head_dim})")
    if problem:
        raise HeadPruneError(f"{where}: the kept_heads buffer is corrupt: {problem}.")


@dataclass
class HeadLayout:
    """Original head count per type and, per type and layer, the kept original heads (0-based)."""

    num_heads: Dict[str, int]
    kept: Dict[str, List[List[int]]] = field(default_factory=dict)

    @classmethod
    def full(cls, num_heads: Dict[str, int], num_layers: Dict[str, int]) -> "HeadLayout":
        return cls(dict(num_heads),
                   {k: [list(range(num_heads[k])) for _ in range(num_layers[k])] for k in num_heads})

    @classmethod
    def from_model(cls, model: nn.Module) -> "HeadLayout":
        layout = cls({}, {})
        for kind, _, module in attention_modules(model):
            layout.num_heads[kind] = module.original_num_heads
            layout.kept.setdefault(kind, []).append(module.kept_heads.tolist())
        return layout

    @classmethod
    def from_state_dict(cls, state_dict, num_heads: Dict[str, int]) -> "HeadLayout":
        """Read the layout from the ``kept_heads`` buffers of a ``transformer_headprune`` state dict."""
        layout = cls({}, {})
        for kind in ATTENTION_TYPES:
            layer = 0
            while module_prefix(kind, layer) + "kept_heads" in state_dict:
                layout.kept.setdefault(kind, []).append(
                    state_dict[module_prefix(kind, layer) + "kept_heads"].tolist())
                layer += 1
            if kind in layout.kept:
                layout.num_heads[kind] = num_heads[kind]
        return layout

    def to_json(self) -> str:
        return json.dumps({"num_heads": self.num_heads, "kept": self.kept}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "HeadLayout":
        try:
            data = json.loads(text)
            return cls({k: int(v) for k, v in data["num_heads"].items()},
                       {k: [[int(h) for h in layer] for layer in v] for k, v in data["kept"].items()})
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise HeadPruneError(f"--head-layout is not a valid layout JSON ({err}).") from err

    def num_layers(self, kind: str) -> int:
        return len(self.kept.get(kind, []))

    def count(self, kind: str = None) -> int:
        """Number of kept heads of one type, or of all types."""
        kinds = [kind] if kind else list(self.kept)
        return sum(len(layer) for k in kinds for layer in self.kept[k])

    def apply(self, model: nn.Module):
        """Reshape every attention module of ``model`` to this layout."""
        for kind, layer, module in attention_modules(model):
            if kind in self.kept and layer < self.num_layers(kind):
                module.set_kept_heads(self.kept[kind][layer])
