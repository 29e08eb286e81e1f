"""Michel, Levy & Neubig (2019), "Are Sixteen Heads Really Better than One?": gradient head
importance. The fairseq task that runs it over a subset is :mod:`.importance_task`."""

from typing import List, Tuple

import torch
import torch.nn as nn

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.heads.layout import HeadLayout, attention_modules
from fairseq_headprune.heads.scores import HeadImportance, empty_scores, register_scorer

COUNT = "head_importance_count_"  # + attention type: units the batch's scores sum over


@register_scorer("gradient")
class GradientImportance(HeadImportance):
    """Michel, Levy & Neubig (2019), "Are Sixteen Heads Really Better than One?", eq. 3:
    I_h = E_x |d L(x) / d xi_h| at xi = 1, where xi_h gates head h's context.

    Args:
        absolute: where the absolute value is taken.

            - ``"token"`` (default): as the authors' code (michel-fairseq ``prune.py``
              ``batch_head_importance`` l.258-280): |<ctx_h,t, dL/dctx_h,t>| per target (or,
              for encoder self-attention, source) token, summed over non-padding tokens and
              divided by their number. A ``[time, batch, heads]`` gate probe reads
              <ctx_h,t, dL/dctx_h,t> as its gradient at xi = 1.
            - ``"sentence"``: the paper's equation read per example, |dL(x_b)/dxi_h| per
              sentence (a ``[batch, heads]`` probe; row b is d L(x_b) / d xi, since L sums over
              sentences), averaged over sentences. Neither mode depends on batching.
            - ``"batch"``: |dL(batch)/dxi_h| per batch, averaged over sentences (depends on
              how sentences are batched).

    ``batch_scores`` also reports, per attention type, how many units (tokens or sentences) the
    scores sum over (logging-output keys ``head_importance_count_E`` ...), so the task divides
    the totals of all batches and workers by the right number. The authors' denominator for
    decoder types also counts padding positions (a constant per type, which the per-layer
    normalisation cancels); here only real tokens are counted.
    """

    MODES = ("token", "sentence", "batch")
    method = "Michel et al. 2019, gradient importance"

    @classmethod
    def from_config(cls, cfg) -> "GradientImportance":
        return cls(absolute=str(cfg.importance_abs))

    def options(self) -> dict:
        return {"absolute": self.absolute}

    def __init__(self, absolute: str = "token"):
        if absolute not in self.MODES:
            raise ValueError(f"absolute must be one of {', '.join(self.MODES)}, got {absolute!r}")
        self.absolute = absolute

    def batch_scores(self, model, sample, criterion):
        layout = HeadLayout.from_model(model)
        src = sample["net_input"]["src_tokens"]
        bsz, device = src.size(0), src.device
        pad = model.encoder.padding_idx
        tokens = {"E": src.ne(pad).t(), "D": sample["target"].ne(pad).t()}  # [time, batch]
        tokens["A"] = tokens["D"]
        gates: List[Tuple[str, int, nn.Module, torch.Tensor]] = []
        for kind, layer, module in attention_modules(model):
            if module.num_heads == 0:
                continue
            if module.head_gate is not None:
                raise HeadPruneError(f"{kind}:{layer + 1} already has a head gate; gradient "
                                     f"importance scores ungated models (fold gates first).")
            shape = {"token": (tokens[kind].size(0), bsz, module.num_heads),
                     "sentence": (bsz, module.num_heads), "batch": (module.num_heads,)}[
                self.absolute]
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
            if grad.dim() == 3:  # per token: real tokens only
                per_head = (grad.abs() * tokens[kind].unsqueeze(-1).to(grad.dtype)).sum((0, 1))
            else:
                per_head = grad.abs().sum(0) if grad.dim() == 2 else grad.abs()  # [kept heads]
            scores[kind][layer, module.kept_heads] = per_head.double().cpu()
        for kind in scores:
            count = int(tokens[kind].sum()) if self.absolute == "token" else bsz
            logging_output[COUNT + kind] = count
        return scores, loss.detach(), sample_size, logging_output
