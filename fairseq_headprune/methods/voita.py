"""Voita, Talbot, Moiseev, Sennrich & Titov (2019), "Analyzing Multi-Head Self-Attention:
Specialized Heads Do the Heavy Lifting, the Rest Can Be Pruned" (ACL, P19-1580): Hard Concrete
head gates trained with a relaxed L0 penalty.

Here: the gate kind ``hard_concrete`` (:class:`HardConcreteGates`) and the criterion
``l0_label_smoothed_cross_entropy`` (:class:`L0LabelSmoothedCrossEntropy`). Trained gates become
a pruned checkpoint with ``fairseq-headprune fold`` (or ``prune --from-gates``). Facts are from the
authors' TensorFlow code, lena-voita/the-story-of-heads @ efaa0dd: ``lib/layers/concrete_gate.py``
(gate, penalty), ``lib/ops/basic.py`` (initialisation), ``lib/task/seq2seq/problems/concrete.py``
(loss assembly); see METHODS_NOTES.md section 2.
"""

import math
from dataclasses import dataclass, field
from typing import Dict, Optional

import torch
import torch.nn as nn
from fairseq import metrics
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion, LabelSmoothedCrossEntropyCriterionConfig)
from fairseq.dataclass import ChoiceEnum

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.heads.layout import ATTENTION_TYPES
from fairseq_headprune.model.gates import HeadGates, gates_of, register_gate

BETA, LIMIT_L, LIMIT_R, EPS = 0.33, -0.1, 1.1, 1e-6  # concrete_gate.py l.28


def concrete_sample(log_a, u, beta=BETA, limit_l=LIMIT_L, limit_r=LIMIT_R):
    """Training gate for noise ``u`` in (0, 1) (concrete_gate.py l.50-55)."""
    s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + log_a) / beta)
    return (s * (limit_r - limit_l) + limit_l).clamp(0.0, 1.0)


def concrete_eval(log_a, limit_l=LIMIT_L, limit_r=LIMIT_R):
    """Deterministic evaluation gate (concrete_gate.py l.56-59)."""
    return (torch.sigmoid(log_a) * (limit_r - limit_l) + limit_l).clamp(0.0, 1.0)


def concrete_p_open(log_a, beta=BETA, limit_l=LIMIT_L, limit_r=LIMIT_R):
    """P(gate > 0), clipped to [eps, 1 - eps] (concrete_gate.py l.66-90)."""
    return torch.sigmoid(log_a - beta * math.log(-limit_l / limit_r)).clamp(EPS, 1 - EPS)


@register_gate("hard_concrete")
class HardConcreteGates(HeadGates):
    """Hard Concrete gates (Louizos et al. 2018) as Voita et al. (2019), Sec. 4.1, eq. 4-6.

    One learned ``log_a`` per head of each gated module (``head_gates.log_a.E0`` ...).

    - Training (concrete_gate.py l.50-59): one draw u ~ U(eps, 1 - eps) per head per forward,
      shared by every sentence and position of the batch; s = sigmoid((log u - log(1 - u) +
      log_a) / beta); g = clamp(s * (r - l) + l, 0, 1).
    - Evaluation (l.56-59): g = clamp(sigmoid(log_a) * (r - l) + l, 0, 1): exactly 0 for
      log_a <= -ln 11 and exactly 1 for log_a >= ln 11 with the default stretch.
    - P(open) = P(g > 0) = clamp(sigmoid(log_a - beta * ln(-l / r)), eps, 1 - eps) (l.66-90);
      the L0 penalty sums it over a module's heads.
    - Initialisation (lib/ops/basic.py l.9-34): TF Glorot-uniform on a [1, H, 1, 1] variable,
      log_a ~ U(-sqrt(3 / H), sqrt(3 / H)); ``--hard-concrete-init torch_xavier`` gives the DSP
      fork's PyTorch port instead, U(-sqrt(6 / (H + 1)), +).

    Hyperparameters (model options): ``--hard-concrete-beta`` the temperature beta (0.33; lower
    is closer to a hard 0/1 sample), ``--hard-concrete-stretch`` the interval (l, r) the
    sigmoid is stretched to before clamping ((-0.1, 1.1); l < 0 < 1 < r is what lets a gate be
    exactly 0 or 1), ``--hard-concrete-hard`` the authors' off-by-default straight-through mode
    (forward 1[g > 0.5], backward through g).
    """

    @classmethod
    def add_args(cls, parser):
        parser.add_argument("--hard-concrete-beta", type=float, default=BETA, metavar="B",
                            help="Hard Concrete temperature beta (default: 0.33, the authors')")
        parser.add_argument("--hard-concrete-stretch", type=str, default="-0.1,1.1",
                            metavar="L,R",
                            help="stretch interval (l, r) of the Hard Concrete sample "
                                 "(default: -0.1,1.1, the authors')")
        parser.add_argument("--hard-concrete-init", choices=["tf_glorot", "torch_xavier"],
                            default="tf_glorot",
                            help="log_a initialisation: tf_glorot U(+-sqrt(3/H)) as the "
                                 "authors' TensorFlow code, torch_xavier U(+-sqrt(6/(H+1))) as "
                                 "the DSP fork's port (default: tf_glorot)")
        parser.add_argument("--hard-concrete-hard", action="store_true",
                            help="straight-through: forward 1[g > 0.5], backward through g "
                                 "(the authors' hard=True; off by default)")

    def build(self):
        args = self.args
        self.beta = float(getattr(args, "hard_concrete_beta", BETA))
        stretch = str(getattr(args, "hard_concrete_stretch", "-0.1,1.1"))
        try:
            self.limit_l, self.limit_r = (float(x) for x in stretch.split(","))
        except ValueError as err:
            raise HeadPruneError(f"--hard-concrete-stretch '{stretch}' is not two numbers "
                                 f"L,R such as -0.1,1.1.") from err
        if not (self.limit_l < 0 < 1 < self.limit_r) or self.beta <= 0:
            raise HeadPruneError(
                f"Hard Concrete needs beta > 0 and l < 0 < 1 < r, got beta {self.beta} and "
                f"stretch ({self.limit_l}, {self.limit_r}).")
        self.hard = bool(getattr(args, "hard_concrete_hard", False))
        init = getattr(args, "hard_concrete_init", "tf_glorot")
        params = {}
        for key, n in self.heads.items():
            bound = math.sqrt(3.0 / n) if init == "tf_glorot" else math.sqrt(6.0 / (n + 1))
            params[key] = nn.Parameter(torch.empty(n).uniform_(-bound, bound) if n else
                                       torch.empty(0))
        self.log_a = nn.ParameterDict(params)

    def compute(self):
        gates = {}
        for key in self.heads:
            log_a = self.log_a[key]  # [heads]
            if self.training:  # one draw per head, shared by the whole batch
                u = torch.empty_like(log_a).uniform_(EPS, 1 - EPS)
                g = concrete_sample(log_a, u, self.beta, self.limit_l, self.limit_r)
            else:
                g = concrete_eval(log_a, self.limit_l, self.limit_r)
            if self.hard:
                g = (g > 0.5).to(g.dtype) + g - g.detach()
            gates[key] = g
        return gates

    def p_open(self) -> Dict[str, torch.Tensor]:
        """P(gate > 0) per head of each module, differentiable in ``log_a`` (l.66-90)."""
        return {key: concrete_p_open(self.log_a[key], self.beta, self.limit_l, self.limit_r)
                for key in self.heads}


L0_NORMALIZE = ChoiceEnum(["module_mean", "module_sum"])
L0_MULTIPLIER_OPTIMIZER = ChoiceEnum(["adam", "sgd"])
ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8  # CoFi: HF TrainingArguments defaults


@dataclass
class L0LabelSmoothedCrossEntropyConfig(LabelSmoothedCrossEntropyCriterionConfig):
    l0_lambda: float = field(
        default=0.1,
        metadata={"help": "lambda of the L0 penalty. With the default module_mean it means what "
                          "the authors' concrete_coef means: per-token loss = label-smoothed "
                          "cross-entropy per target token + lambda * (mean over gated modules "
                          "of the expected number of open heads); it is scaled by the batch's "
                          "sample size, so it means the same at any batch size (default 0.1, "
                          "the authors' script; they tune it per dataset)"})
    l0_normalize: L0_NORMALIZE = field(
        default="module_mean",
        metadata={"help": "module_mean: mean over gated modules of the sum of P(open) (the "
                          "authors' TensorFlow code); module_sum: sum over modules (a lambda "
                          "M times stronger, M = number of gated modules)"})
    l0_target_heads: Optional[float] = field(
        default=None,
        metadata={"help": "instead of a fixed lambda, drive the expected number of open heads "
                          "(all gated modules) to this target with a Lagrangian (CoFi pruning, "
                          "Xia et al. 2022): a count N >= 1 or a fraction < 1 of the gated heads"})
    l0_multiplier_lr: float = field(
        default=0.01,
        metadata={"help": "learning rate of the multipliers' gradient ascent in target mode, "
                          "one step per training batch (default 0.01, CoFi's reg_learning_rate "
                          "in scripts/run_CoFi.sh)"})
    l0_multiplier_optimizer: L0_MULTIPLIER_OPTIMIZER = field(
        default="adam",
        metadata={"help": "adam: Adam-normalised ascent, CoFi's AdamW with a negative learning "
                          "rate (betas 0.9, 0.999, eps 1e-8); sgd: plain ascent, lambda += lr * "
                          "gradient (default adam)"})
    l0_target_warmup: int = field(
        default=0,
        metadata={"help": "target warm-up in training batches: the target falls linearly from "
                          "every gated head to --l0-target-heads over this many batches "
                          "(CoFi's lagrangian_warmup; default 0: the target from the start)"})
    l0_damping: float = field(
        default=0.0,
        metadata={"help": "beyond CoFi: a fixed quadratic term rho * c**2 added to the "
                          "Lagrangian (the augmented Lagrangian's penalty; a restoring force "
                          "proportional to the miss that damps the multipliers' oscillation); "
                          "default 0: CoFi's form"})


@register_criterion("l0_label_smoothed_cross_entropy", dataclass=L0LabelSmoothedCrossEntropyConfig)
class L0LabelSmoothedCrossEntropy(LabelSmoothedCrossEntropyCriterion):
    """Label-smoothed cross-entropy plus Voita et al. (2019)'s L0 penalty, eq. 7:
    L = L_xent + lambda * L_C, L_C = sum over heads of P(gate open).

    Normalisation as the authors' code (concrete.py l.61, l.92-107): the token-averaged
    cross-entropy plus lambda times the MEAN over gated modules of each module's sum of P(open).
    fairseq sums token losses and divides the gradient by the sample size, so the penalty is
    added as ``lambda * sample_size * R`` with R that mean: the per-token objective is the
    authors' at every batch size (and on every number of workers, since fairseq sums sample
    sizes across them).

    Target mode (``--l0-target-heads``; not in the paper), CoFi pruning's Lagrangian (Xia, Zhong &
    Chen 2022, eq. 6; princeton-nlp/CoFiPruning @ da855a8): with c = (E[open heads] - t) / gated
    heads, the penalty is ``lambda_1 * c + lambda_2 * c**2`` (``models/l0_module.py``
    l.261-274; CoFi's c is expected minus target *sparsity*, i.e. minus ours, which flips the
    sign of lambda_1 and nothing else). The multipliers start at 0 (l.72-73) and, after each
    training batch, take one step of gradient *ascent* on their gradients (c, c**2):

    - ``adam`` (default, CoFi's): ``trainer/trainer.py`` l.157-166 trains them with
      ``torch.optim.AdamW`` at learning rate ``-reg_learning_rate`` (weight decay 0, HF's
      default betas (0.9, 0.999) and eps 1e-8), stepped with the gates after every update
      (l.303-305): lambda += lr * m_hat / (sqrt(v_hat) + eps), so each step moves a multiplier
      by about lr whatever the size of c. ``--l0-multiplier-lr`` is reg_learning_rate (0.01 in
      ``scripts/run_CoFi.sh`` l.33).
    - ``sgd``: plain ascent lambda += lr * (c, c**2) (this package's first form).

    The target t warms up linearly (``l0_module.py`` l.256-258, l.268-269, start_sparsity 0):
    from every gated head to ``--l0-target-heads`` over ``--l0-target-warmup`` training batches
    (CoFi: ``lagrangian_warmup_epochs``, 2 of 20 epochs in run_CoFi.sh l.66-69; 0 here turns it
    off). ``--l0-damping rho`` (beyond CoFi) adds a fixed ``rho * c**2``: with the integrating
    multiplier alone, E[L0] swings around the target; the fixed quadratic term pulls back in
    proportion to the miss (a proportional term beside the multiplier's integral), which damps
    the swing. The multipliers, their Adam moments and the step count are criterion state,
    saved and restored with the checkpoint; fairseq's optimizer and lr scheduler never see them.
    One step per training forward: with ``--update-freq k`` they step k times per update.
    """

    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0,
                 report_accuracy=False, l0_lambda=0.1, l0_normalize="module_mean",
                 l0_target_heads=None, l0_multiplier_lr=0.01, l0_multiplier_optimizer="adam",
                 l0_target_warmup=0, l0_damping=0.0):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        if l0_lambda < 0:
            raise HeadPruneError(f"--l0-lambda must be >= 0, got {l0_lambda}.")
        if l0_target_heads is not None and l0_target_heads < 0:
            raise HeadPruneError(f"--l0-target-heads must be >= 0, got {l0_target_heads}.")
        for flag, value in (("--l0-multiplier-lr", l0_multiplier_lr),
                            ("--l0-target-warmup", l0_target_warmup),
                            ("--l0-damping", l0_damping)):
            if value < 0:
                raise HeadPruneError(f"{flag} must be >= 0, got {value}.")
        self.l0_lambda = float(l0_lambda)
        self.l0_normalize = str(l0_normalize)
        self.l0_target_heads = l0_target_heads
        self.l0_multiplier_lr = float(l0_multiplier_lr)
        self.l0_multiplier_optimizer = str(l0_multiplier_optimizer)
        self.l0_target_warmup = int(l0_target_warmup)
        self.l0_damping = float(l0_damping)
        self.multipliers = nn.Parameter(torch.zeros(2), requires_grad=False)
        # Adam's first and second moments of (c, c**2), and the number of steps taken
        self.register_buffer("multiplier_moments", torch.zeros(2, 2))
        self.register_buffer("multiplier_steps", torch.zeros((), dtype=torch.long))

    def load_state_dict(self, state_dict, strict=True):
        """fairseq restores a criterion that has parameters from the checkpoint; one written by
        another criterion (a plain model to fine-tune from) has none: multipliers start at 0.
        One from before the Adam form has no moments: they start at 0."""
        if state_dict is None:
            return None
        state_dict = dict(state_dict)
        for key, value in (("multiplier_moments", torch.zeros(2, 2)),
                           ("multiplier_steps", torch.zeros((), dtype=torch.long))):
            state_dict.setdefault(key, value)
        return super().load_state_dict(state_dict, strict=strict)

    def _gates(self, model) -> HardConcreteGates:
        gates = gates_of(model)
        if not isinstance(gates, HardConcreteGates):
            raise HeadPruneError(
                "l0_label_smoothed_cross_entropy needs a model with Hard Concrete gates: add "
                "--head-gates hard_concrete (and --head-gates-types, default E,D,A).")
        return gates

    def target(self, total: int, step: Optional[int] = None) -> float:
        """The target number of open heads, checked against the number of gated heads; at
        training batch ``step`` (0-based) during the warm-up, the linear warm-up from ``total``
        (CoFi's get_target_sparsity, l0_module.py l.256-258)."""
        t = float(self.l0_target_heads)
        heads = t * total if 0 < t < 1 else t
        if heads > total:
            raise HeadPruneError(f"--l0-target-heads {self.l0_target_heads} is above the "
                                 f"{total} gated heads of this model.")
        if step is not None and self.l0_target_warmup > 0:
            heads = total + (heads - total) * min(1.0, step / self.l0_target_warmup)
        return heads

    @torch.no_grad()
    def ascend(self, grad: torch.Tensor) -> None:
        """One ascent step of the multipliers on their gradient (c, c**2): torch.optim.AdamW's
        update with a negative learning rate and no weight decay (CoFi), or plain ascent."""
        lr = self.l0_multiplier_lr
        grad = grad.to(self.multipliers)
        self.multiplier_steps += 1
        if self.l0_multiplier_optimizer == "sgd":
            self.multipliers += lr * grad
            return
        (b1, b2), t = ADAM_BETAS, int(self.multiplier_steps)
        m, v = self.multiplier_moments
        m.mul_(b1).add_((1 - b1) * grad)
        v.mul_(b2).add_((1 - b2) * grad * grad)
        denom = (v / (1 - b2 ** t)).sqrt() + ADAM_EPS
        self.multipliers += lr * (m / (1 - b1 ** t)) / denom

    def penalty(self, model):
        """(term added per unit of sample size, expected open heads per type, total heads)."""
        p_open = self._gates(model).p_open()
        sums = [p.sum() for p in p_open.values()]
        expected = torch.stack(sums).sum()
        per_type = {k: float(sum(s.detach() for key, s in zip(p_open, sums) if key[0] == k))
                    for k in ATTENTION_TYPES if any(key[0] == k for key in p_open)}
        total = sum(p.numel() for p in p_open.values())
        if self.l0_target_heads is None:
            reg = expected / len(sums) if self.l0_normalize == "module_mean" else expected
            return self.l0_lambda * reg, expected, per_type, total
        step = int(self.multiplier_steps)
        c = (expected - self.target(total, step)) / max(total, 1)
        lam1, lam2 = self.multipliers.detach().clone().to(c)  # this batch's; then ascend
        if model.training:
            self.ascend(torch.stack([c.detach(), c.detach() ** 2]))
        return lam1 * c + (lam2 + self.l0_damping) * c * c, expected, per_type, total

    def forward(self, model, sample, reduce=True):
        loss, sample_size, logging_output = super().forward(model, sample, reduce=reduce)
        term, expected, per_type, total = self.penalty(model)
        l0 = term.to(loss.dtype) * sample_size
        logging_output["l0_loss"] = float(l0.detach())
        logging_output["l0_expected_heads"] = float(expected.detach())
        logging_output["l0_gated_heads"] = total
        for kind, value in per_type.items():
            logging_output[f"l0_open_{kind}"] = value
        logging_output["l0_lambda"] = self.l0_lambda
        if self.l0_target_heads is not None:
            logging_output["l0_lambda1"] = float(self.multipliers[0])
            logging_output["l0_lambda2"] = float(self.multipliers[1])
            logging_output["l0_target"] = self.target(total, int(self.multiplier_steps) - 1
                                                      if model.training else None)
        return loss + l0, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        if not logging_outputs or "l0_loss" not in logging_outputs[0]:
            return
        n = len(logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        l0 = sum(log.get("l0_loss", 0) for log in logging_outputs)
        metrics.log_scalar("l0", l0 / max(sample_size, 1), sample_size, round=4)
        for key in sorted(logging_outputs[0]):
            if key.startswith(("l0_open_", "l0_expected", "l0_lambda", "l0_target")):
                value = sum(log.get(key, 0) for log in logging_outputs) / n
                metrics.log_scalar(key[3:] if key.startswith("l0_open") else key, value, round=3)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return False
