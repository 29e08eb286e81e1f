"""Michel, Levy & Neubig (2019), "Are Sixteen Heads Really Better than One?": gradient head
importance. The fairseq task that runs it over a subset is :mod:`.importance_task`."""

from typing import List, Tuple

import torch
import torch.nn as nn

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.heads.layout import HeadLayout, attention_modules
from fairseq_headprune.heads.scores import HeadImportance, empty_scores, register_scorer


@register_scorer("gradient")
class GradientImportance(HeadImportance):
    """Michel, Levy & Neubig (2019), "Are Sixteen Heads Really Better than One?", eq. 3:
    I_h = E_x |d L(x) / d xi_h| at xi = 1, where xi_h gates head h's context.

    Args:
        absolute: ``"sentence"`` takes the absolute value of each sentence's gradient, as in the
            paper's equation, so the scores do not depend on how sentences are batched (one gate
            per sentence and head: a ``[batch, heads]`` gate whose gradient row b is
            d L(x_b) / d xi, since L sums over sentences); ``"batch"`` takes it of the whole
            batch's gradient, as the authors' code does.
    """

    def __init__(self, absolute: str = "sentence"):
        if absolute not in ("sentence", "batch"):
            raise ValueError(f"absolute must be 'sentence' or 'batch', got {absolute!r}")
        self.absolute = absolute

    def batch_scores(self, model, sample, criterion):
        layout = HeadLayout.from_model(model)
        bsz = sample["net_input"]["src_tokens"].size(0)
        device = sample["net_input"]["src_tokens"].device
        gates: List[Tuple[str, int, nn.Module, torch.Tensor]] = []
        for kind, layer, module in attention_modules(model):
            if module.num_heads == 0:
                continue
            if module.head_gate is not None:
                raise HeadPruneError(f"{kind}:{layer + 1} already has a head gate; gradient "
                                     f"importance scores ungated models (fold gates first).")
            shape = (bsz, module.num_heads) if self.absolute == "sentence" else (module.num_heads,)
            gate = torch.ones(shape, device=device, requires_grad=True)  # a probe in the slot
            module.head_gate = gate
            gates.append((kind, layer, module, gate))
        try:
            with torch.enable_grad():
                loss, sample_size, logging_output = criterion(model, sample)
                grads = torch.autograd.grad(loss, [g for *_, g in gates], allow_unused=True)
        finally:
            for _, _, module, _ in gates:
                module.head_gate = None
        scores = empty_scores(layout)
        for (kind, layer, module, gate), grad in zip(gates, grads):
            grad = torch.zeros_like(gate) if grad is None else grad
            per_head = grad.abs().sum(0) if grad.dim() == 2 else grad.abs()  # [kept heads]
            scores[kind][layer, module.kept_heads] = per_head.double().cpu()
        return scores, loss.detach(), sample_size, logging_output
