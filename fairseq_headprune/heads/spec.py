"""The head spec: one parser and one formatter for "which heads" in every command.

Text form (Michel et al. 2019's descriptor): items ``TYPE:LAYER:HEADS`` separated by spaces or
``;``, with TYPE ``E`` (encoder self-attention), ``D`` (decoder self-attention) or ``A``
(encoder-decoder attention), and LAYER and HEADS **1-based**, HEADS a comma list of numbers or
ranges: ``E:1:1,3-4 A:6:2``. Head numbers always name the original model's heads.

JSON form, as the other commands write it: ``{"E": {"1": [1, 3, 4]}, "A": {"6": [2]}}`` (same
1-based numbers), optionally wrapped as ``{"heads": {...}}``.

In memory a spec is ``{type: {layer: sorted list of heads}}`` with 0-based layers and heads.
"""

import json
import os
import re
from typing import Dict, List

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.heads.layout import ATTENTION_TYPES, TYPE_NAMES, HeadLayout

HeadSpec = Dict[str, Dict[int, List[int]]]

_ITEM = re.compile(r"^([EDA]):(\d+):(\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*)$")


def _malformed(item: str) -> HeadPruneError:
    return HeadPruneError(
        f"malformed head spec item '{item}': expected TYPE:LAYER:HEADS with TYPE one of E, D, A "
        f"and 1-based LAYER and HEADS, e.g. E:1:1,3-4."
    )


MAX_INDEX = 4096  # above any layer count or heads per module; ranges are checked before expanding


def _too_large(item: str, value: int) -> HeadPruneError:
    return HeadPruneError(f"head spec item '{item}' names {value}, more layers or heads than any "
                          f"model has (at most {MAX_INDEX}).")


def _add(spec: HeadSpec, kind: str, layer: int, head: int, item: str):
    if layer < 1 or head < 1:
        raise _malformed(item)
    if max(layer, head) > MAX_INDEX:
        raise _too_large(item, max(layer, head))
    spec.setdefault(kind, {}).setdefault(layer - 1, set()).add(head - 1)


def _parse_text(text: str) -> HeadSpec:
    spec: HeadSpec = {}
    for item in re.split(r"[\s;]+", text.strip()):
        if not item:
            continue
        match = _ITEM.match(item)
        if not match:
            raise _malformed(item)
        kind, layer, heads = match.group(1), int(match.group(2)), match.group(3)
        for part in heads.split(","):
            first, _, last = part.partition("-")
            if last and int(last) < int(first):
                raise _malformed(item)
            if max(layer, int(last or first)) > MAX_INDEX:
                raise _too_large(item, max(layer, int(last or first)))
            for head in range(int(first), int(last or first) + 1):
                _add(spec, kind, layer, head, item)
    return spec


def normalized(spec) -> HeadSpec:
    """A spec with types, layers and heads in sorted order and heads as lists."""
    return {k: {layer: sorted(heads) for layer, heads in sorted(v.items())}
            for k, v in sorted(spec.items())}


def spec_from_json(data) -> HeadSpec:
    """The 0-based spec of the JSON form (already decoded), e.g. a results row's ``heads``."""
    return normalized(_parse_json(data))


def _parse_json(data) -> HeadSpec:
    if isinstance(data, dict) and "heads" in data:
        data = data["heads"]
    if not isinstance(data, dict):
        raise HeadPruneError("a JSON head spec must be an object such as {\"E\": {\"1\": [1, 2]}}.")
    spec: HeadSpec = {}
    for kind, layers in data.items():
        if kind not in ATTENTION_TYPES or not isinstance(layers, dict):
            raise HeadPruneError(
                f"malformed JSON head spec entry '{kind}': expected E, D or A mapping 1-based "
                f"layers to lists of 1-based heads.")
        for layer, heads in layers.items():
            item = f"{kind}:{layer}:{heads}"
            if not str(layer).isdigit() or not isinstance(heads, list) or not all(
                    isinstance(h, int) and not isinstance(h, bool) for h in heads):
                raise _malformed(item)
            for head in heads:
                _add(spec, kind, int(layer), head, item)
    return spec


def parse_head_spec(text: str) -> HeadSpec:
    """Parse a head spec given as text, JSON, or the path of a file holding either.

    Args:
        text: the spec (see the module docstring), or a path to a file with it.

    Returns:
        ``{type: {layer: [heads]}}``, 0-based, sorted.
    """
    if not text.lstrip().startswith("{") and os.path.isfile(text):
        with open(text, encoding="utf-8") as f:
            text = f.read()
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except ValueError as err:
            raise HeadPruneError(f"the head spec is not valid JSON ({err}).") from err
        return spec_from_json(data)
    return normalized(_parse_text(text))


def format_head_spec(spec: HeadSpec) -> str:
    """Format a 0-based spec as 1-based text, e.g. ``E:1:1,2 A:6:3``; "" for no heads."""
    items = []
    for kind in ATTENTION_TYPES:
        for layer, heads in sorted(spec.get(kind, {}).items()):
            if heads:
                items.append(f"{kind}:{layer + 1}:{','.join(str(h + 1) for h in sorted(heads))}")
    return " ".join(items)


def spec_to_json(spec: HeadSpec) -> Dict[str, Dict[str, List[int]]]:
    """The JSON form (1-based) of a 0-based spec."""
    return {kind: {str(layer + 1): [h + 1 for h in sorted(heads)]
                   for layer, heads in sorted(spec[kind].items()) if heads}
            for kind in ATTENTION_TYPES if any(spec.get(kind, {}).values())}


def check_spec(spec: HeadSpec, layout: HeadLayout):
    """Raise a one-sentence error if the spec names a layer or head the model never had."""
    for kind, layers in spec.items():
        n_layers, n_heads = layout.num_layers(kind), layout.num_heads.get(kind, 0)
        for layer, heads in layers.items():
            if layer >= n_layers:
                raise HeadPruneError(
                    f"layer {layer + 1} is out of range for {kind} ({TYPE_NAMES[kind]}): "
                    f"the model has {n_layers} layers (1-{n_layers}).")
            for head in heads:
                if head >= n_heads:
                    raise HeadPruneError(
                        f"head {head + 1} is out of range for {kind}:{layer + 1}: "
                        f"the model has {n_heads} heads per layer (1-{n_heads}).")
