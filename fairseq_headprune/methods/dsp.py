"""Li, Cotterell & Sachan (2021), "Differentiable Subset Pruning of Transformer Heads" (TACL 9,
1442-1459): one importance logit per head and a Gumbel soft top-K mask, so that exactly K heads
survive.

Here: the gate kind ``subset`` (:class:`SubsetGates`). Facts are from the authors' fairseq fork,
rycolab/differentiable-subset-pruning @ 78457a2: ``fairseq/fairseq/models/transformer.py``
(logits l.136-138, ``gumbel_soft_top_k`` l.39-56, ``STEFunction`` l.58-66, module order l.357-370),
``fairseq/examples/pruning/run_dsp.py`` l.250-262 (temperature), ``generate_dsp.py`` l.59-69
(evaluation mask), ``fairseq/fairseq/trainer.py`` l.206-232 and ``optim/adam.py`` l.67-76 (the
logits' own learning rate); see METHODS_NOTES.md section 3.

Where this port differs from the fork, by design (each difference is documented on the option):
the temperature follows fairseq's update count (the fork counts ``train_step`` calls and restarts
at 0 when relaunched), evaluation and validation use the hard top-K (the fork validates with a
noisy soft mask), and budgets may be per attention type or per module (the fork has one global K).
"""

import math
import re
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from fairseq import metrics
from torch import Tensor

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.heads.layout import TYPE_NAMES
from fairseq_headprune.model.gates import HeadGates, register_gate, split_key

TINY = torch.finfo(torch.float64).tiny  # 2.2250738585072014e-308, as the fork's ``tiny``
FORK_ORDER = "EAD"  # rows of the fork's ``w``: encoder self, cross, decoder self (l.357-370)
TAU0, TAU_FINAL, PRUNING_LR = 0.1, 1e-8, 0.2  # PruningConfig defaults, README's IWSLT runs
JOINT_UPDATES, PIPELINED_UPDATES = 15000, 250  # cooldown steps of the README's IWSLT runs


def gumbel(shape, dtype=torch.float64, device=None) -> Tensor:
    """One Gumbel(0, 1) draw per entry: -log(-log u), u = rand * (1 - tiny) + tiny (l.41-43)."""
    u = torch.rand(shape, dtype=dtype, device=device) * (1 - TINY) + TINY
    return -torch.log(-torch.log(u))


def relaxed_top_k(scores: Tensor, k: int, tau: float) -> Tensor:
    """The relaxed top-K of Xie & Ermon (2019) as ``gumbel_soft_top_k`` (l.44-56), on noisy or
    noiseless ``scores`` (1-D): p_1 = softmax(r / tau); for j = 2..K, r += log(max(1 - p_{j-1},
    tiny)) and p_j = softmax(r / tau); returns sum_j p_j (sums to K; an entry may exceed 1)."""
    r = scores
    p = torch.softmax(r / tau, dim=-1)
    mask = p
    for _ in range(1, k):
        r = r + torch.log(torch.clamp(1 - p, min=TINY))
        p = torch.softmax(r / tau, dim=-1)
        mask = mask + p
    return mask


def hard_top_k(scores: Tensor, k: int) -> Tensor:
    """1 on the ``k`` largest entries of ``scores`` (1-D), 0 elsewhere; ties go to the earlier
    entry (``generate_dsp.py`` sorts descending and keeps the first K)."""
    order = torch.sort(scores.detach(), descending=True, stable=True).indices
    mask = torch.zeros_like(scores)
    mask[order[:k]] = 1
    return mask


class StraightThroughTopK(torch.autograd.Function):
    """``STEFunction`` (l.58-66): forward the hard top-K, backward the gradient unchanged."""

    @staticmethod
    def forward(ctx, scores, k):
        return hard_top_k(scores, k)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def temperature(update: int, tau0: float, tau_final: float, updates: int) -> float:
    """tau0 * (tau_final / tau0) ** (update / updates) before ``updates``, then tau_final
    (``run_dsp.py`` l.250-262: exp(log tau0 - step / T * (log tau0 - log tau_final)))."""
    if updates <= 0 or update >= updates:
        return tau_final
    return math.exp(math.log(tau0) - update / updates * (math.log(tau0) - math.log(tau_final)))


def _count(text: str, budget: str) -> int:
    if not re.fullmatch(r"\d+", text.strip()):
        raise HeadPruneError(f"--subset-heads '{budget}': '{text}' is not a number of heads.")
    return int(text)


def parse_budget(budget: str, heads: Dict[str, int]) -> List[Tuple[List[str], int]]:
    """The groups a budget splits the gated modules into, each with the heads it keeps.

    ``budget`` is one of: ``K`` (the fork's global budget over every gated head), ``P%`` (K =
    round(P / 100 * gated heads)), ``E:12,D:20,A:16`` (per attention type, every gated type
    named), ``E0:2,E1:3,...,A5:2`` (per module, every gated module named). Every group keeps at
    least one head and at most the heads it has; anything else is one sentence.
    """
    text = str(budget).strip()
    total = sum(heads.values())
    every = list(heads)
    if re.fullmatch(r"\d+(\.\d+)?%", text):
        k = round(float(text[:-1]) / 100 * total)
        groups = [(every, k)]
    elif ":" not in text:
        groups = [(every, _count(text, budget))]
    else:
        pairs = [p.split(":", 1) for p in text.split(",") if p.strip()]
        names = [p[0].strip() for p in pairs]
        if any(len(p) != 2 for p in pairs) or len(set(names)) != len(names):
            raise HeadPruneError(f"--subset-heads '{budget}' is not a budget such as 36, 50%, "
                                 f"E:12,D:20,A:16 or E0:2,E1:2,...")
        per_type = all(re.fullmatch(r"[A-Z]", n) for n in names)
        if not per_type and not all(re.fullmatch(r"[A-Z]\d+", n) for n in names):
            raise HeadPruneError(f"--subset-heads '{budget}' mixes attention types and modules: "
                                 f"name only types (E:12,D:20,A:16) or only modules (E0:2,...).")
        types = sorted({key[0] for key in heads}, key="EDA".index)
        if per_type:
            for n in names:
                if n not in types:
                    what = TYPE_NAMES.get(n, f"attention type '{n}'")
                    raise HeadPruneError(
                        f"--subset-heads '{budget}' names {n}, but {what} has no gates here "
                        f"(gated types: {','.join(types)}).")
            missing = [t for t in types if t not in names]
            groups = [([k for k in every if k[0] == n], _count(c, budget)) for n, c in pairs]
        else:
            for n in names:
                if n not in heads:
                    layers = [split_key(k)[1] for k in heads if k[0] == n[0]]
                    have = (f"{n[0]} has layers 0-{max(layers)}" if layers else
                            f"{n[0]} has no gates here")
                    raise HeadPruneError(f"--subset-heads '{budget}' names module {n}, which "
                                         f"this model does not gate ({have}).")
            missing = [k for k in every if k not in names]
            groups = [([n], _count(c, budget)) for n, c in pairs]
        if missing:
            raise HeadPruneError(f"--subset-heads '{budget}' gives no budget for "
                                 f"{','.join(missing)}: name every gated "
                                 f"{'type' if per_type else 'module'}.")
    for keys, k in groups:
        have = sum(heads[key] for key in keys)
        where = "the model" if len(groups) == 1 and len(keys) == len(every) else ",".join(
            keys) if len(keys) == 1 else keys[0][0]
        if not 1 <= k <= have:
            raise HeadPruneError(f"--subset-heads '{budget}' keeps {k} heads of {where}, which "
                                 f"has {have} gated heads: keep between 1 and {have}.")
    return groups


@register_gate("subset")
class SubsetGates(HeadGates):
    """Differentiable subset pruning (Li et al. 2021, Sec. 3-4, eq. 9-11) as the gate kind
    ``subset``.

    - Logits: all gated heads' importance logits in one parameter ``head_gates.w`` (the
      fork's ``w``, l.136-138), flattened in the fork's module order (encoder self layers, then
      cross attention, then decoder self) and initialised as torch ``xavier_uniform_`` on the
      fork's [modules, H] matrix: U(+-sqrt(6 / (H + modules))). The fork stores ``w`` in float64;
      here it is stored in float32 and the mask is computed in float64 as the fork's, because
      fairseq's gradient norm (taken every update, even with ``--clip-norm 0``) refuses float64
      gradients (``torch.norm(g, dtype=torch.float32)`` in ``fairseq.utils.clip_grad_norm_``).
    - Training: one Gumbel draw per head per forward, shared by the batch; the relaxed top-K of
      (w + g) at temperature tau in each budget group (:func:`relaxed_top_k`); the K soft
      weights sum to K and scale each head's context (the fork multiplies the attention
      probabilities after dropout, l.367-369: the same thing).
    - Evaluation (also validation here; the fork validates with the noisy soft mask): the hard
      top-K of w in each group, exactly K ones (``generate_dsp.py`` l.59-69). It is model state:
      ``fairseq-generate`` decodes a subset-gated checkpoint with the K heads.
    - ``--subset-ste``: hard top-K of w forward, the gradient passed to w unchanged (l.58-66).
    - tau: geometric from ``--subset-tau0`` to ``--subset-tau-final`` over
      ``--subset-anneal-updates`` updates of fairseq's count (so ``--restore-file`` resumes the
      schedule), then constant; logged as ``tau``.
    - The logits learn at ``--subset-lr`` whatever the lr scheduler does (the fork's Adam
      exempts their group from ``set_lr``); weight decay applies to them as to the model.
    """

    @classmethod
    def add_args(cls, parser):
        parser.add_argument("--subset-heads", type=str, metavar="BUDGET",
                            help="subset gates: heads kept, K over every gated head (the "
                                 "authors' --num-of-heads), P%% of them, per attention type "
                                 "E:12,D:20,A:16 or per module E0:2,E1:2,...")
        parser.add_argument("--subset-tau0", type=float, default=TAU0, metavar="T",
                            help="subset gates: initial temperature (default: 0.1, the authors')")
        parser.add_argument("--subset-tau-final", type=float, default=TAU_FINAL, metavar="T",
                            help="subset gates: final temperature (default: 1e-8, the authors')")
        parser.add_argument("--subset-anneal-updates", type=int, metavar="N",
                            help="subset gates: updates over which tau falls geometrically "
                                 "from --subset-tau0 to --subset-tau-final (default: 15000, the "
                                 "authors' joint runs; 250, their pipelined runs, with "
                                 "--head-gates-only; 0: tau-final throughout, the fork's "
                                 "default without --annealing)")
        parser.add_argument("--subset-ste", action="store_true",
                            help="subset gates: straight-through variant, hard top-K forward "
                                 "and the gradient passed to the logits unchanged")
        parser.add_argument("--subset-lr", type=float, default=PRUNING_LR, metavar="LR",
                            help="subset gates: learning rate of the logits, kept whatever the "
                                 "lr scheduler does (default: 0.2, the authors' --pruning-lr)")

    def own_lr(self) -> Optional[float]:
        return float(getattr(self.args, "subset_lr", PRUNING_LR))

    def build(self):
        args = self.args
        budget = getattr(args, "subset_heads", None)
        if budget is None:
            raise HeadPruneError("--head-gates subset needs --subset-heads: the number of heads "
                                 "to keep, e.g. --subset-heads 36 or --subset-heads 50%.")
        self.tau0 = float(getattr(args, "subset_tau0", TAU0))
        self.tau_final = float(getattr(args, "subset_tau_final", TAU_FINAL))
        if not 0 < self.tau_final <= self.tau0:
            raise HeadPruneError(f"subset gates need 0 < --subset-tau-final <= --subset-tau0, "
                                 f"got tau0 {self.tau0} and tau-final {self.tau_final}.")
        updates = getattr(args, "subset_anneal_updates", None)
        if updates is None:
            frozen = getattr(args, "head_gates_only", False)
            updates = PIPELINED_UPDATES if frozen else JOINT_UPDATES
        if updates < 0:
            raise HeadPruneError(f"--subset-anneal-updates must be >= 0, got {updates}.")
        self.anneal_updates = int(updates)
        self.ste = bool(getattr(args, "subset_ste", False))
        self.order = sorted(self.heads, key=lambda k: (FORK_ORDER.index(k[0]), split_key(k)[1]))
        self.groups = parse_budget(budget, self.heads)
        offsets, start = {}, 0
        for key in self.order:
            offsets[key] = (start, start + self.heads[key])
            start += self.heads[key]
        self.offsets = offsets
        width = sum(self.heads.values()) / max(len(self.heads), 1)  # H of the fork's [rows, H]
        bound = math.sqrt(6.0 / (width + len(self.heads))) if self.heads else 0.0
        self.w = nn.Parameter(torch.empty(start).uniform_(-bound, bound))
        self.index = [torch.tensor([i for key in keys for i in range(*offsets[key])])
                      for keys, _ in self.groups]
        self.num_updates = 0

    @property
    def tau(self) -> float:
        return temperature(self.num_updates, self.tau0, self.tau_final, self.anneal_updates)

    def set_num_updates(self, num_updates: int):
        """Called by fairseq before every training step (and on checkpoint load)."""
        self.num_updates = int(num_updates)
        if self.training and not self.ste:
            metrics.log_scalar("tau", self.tau, weight=0, round=8)

    def mask(self) -> Tensor:
        """The flat mask over ``w`` for this forward (soft in training, hard top-K in eval)."""
        w = self.w.double()  # the fork's float64 arithmetic (tiny, log(1 - p))
        if self.training and not self.ste:
            w = w + gumbel(w.shape, w.dtype, w.device)
        mask = torch.zeros_like(w)
        for index, (_, k) in zip(self.index, self.groups):
            index = index.to(w.device)
            scores = w[index]
            if not self.training:
                part = hard_top_k(scores, k)
            elif self.ste:
                part = StraightThroughTopK.apply(scores, k)
            else:
                part = relaxed_top_k(scores, k, self.tau)
            mask = mask.index_put((index,), part)
        return mask

    def compute(self):
        mask = self.mask().float()
        return {key: mask[slice(*self.offsets[key])] for key in self.heads}

    def active(self, key):
        return self.training or not bool((self.gate(key) == 1).all())

    def values(self) -> Dict[str, Tensor]:
        """The logits per module (detached), for inspection."""
        return {key: self.w.detach()[slice(*self.offsets[key])] for key in self.heads}
