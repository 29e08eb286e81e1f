"""Ni, Mao, Yang, Lei & Cambria (2023), "Finding the Pillars of Strength for Multi-Head Attention"
(ACL, 2023.acl-long.812): Grouped Head Attention (GHA) and Voting-to-Stay (V2S).

Here: the criterion ``group_constraint_label_smoothed_cross_entropy``
(:class:`GroupConstraintCriterion`) and the scorer ``votes`` (:class:`VoteImportance`), which
``fairseq-headprune vote`` runs through the ``head_importance`` task; ``choose --per-module C``
keeps each module's C most voted heads and ``prune`` removes the others. Facts are from the
authors' code, the ``HeadCollaboration*`` user dirs of their fairseq fork (METHODS_NOTES.md
section 4): features and k-means from ``Attention_variant_scripts/
multihead_attention_headcluster_ajusted.py`` (l.147-212, 564-606), the loss from
``criterions/head_cluster_loss_prune.py`` l.123-209.

Where this port differs from the authors' code, by design: heads are removed (they mask them);
voting is a separate no-grad pass over a data subset after constraint training (they vote
during training epoch P - 1, attention frozen, then keep training); k-means draws its initial
centres from a private ``RandomState(seed)`` (theirs re-seeds numpy's global generator on every
call: the same rows, without touching the caller's random state).
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from fairseq import metrics
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion, LabelSmoothedCrossEntropyCriterionConfig)
from fairseq.dataclass import ChoiceEnum
from torch import Tensor

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.heads.layout import HeadLayout, attention_modules
from fairseq_headprune.heads.scores import HeadImportance, empty_scores, register_scorer
from fairseq_headprune.model.collaborative import CollaborativeAttention
from fairseq_headprune.model.gates import module_key, parse_gate_types

FEATURES = ("headout", "V", "attn_matrix", "Q", "K")
ALPHA, BETA, GROUPS, SEED = 0.5, 0.7, 2, 0  # IWSLT14 de-en GHT-PS sweep (notes 4.4)
TOL = 1e-4  # kmeans_pytorch's default: stop when (sum of centre shifts)^2 < tol
MAX_ITER = 300  # a guard only; Lloyd's iterations stop long before on real features
COUNT = "head_importance_count_"  # the importance task's per-type unit count (batches here)


def initial_rows(heads: int, groups: int, seed: int) -> np.ndarray:
    """The C distinct rows kmeans_pytorch starts from: ``np.random.seed(seed)`` then
    ``np.random.choice(heads, groups, replace=False)``, drawn from a private generator with
    the same sequence (seed 0, 4 heads, 2 groups: rows 2 and 3)."""
    return np.random.RandomState(seed).choice(heads, groups, replace=False)


def kmeans(x: Tensor, groups: int, seed: int = SEED, tol: float = TOL
           ) -> Tuple[Tensor, Tensor]:
    """Lloyd's k-means as ``kmeans_pytorch.kmeans(X, C, seed=seed)`` (euclidean), batched over
    modules of one shape.

    Args:
        x: features ``[modules, heads, F]`` (each module clustered on its own).
        groups: C, 1 <= C <= heads.
        seed: picks the initial centres (:func:`initial_rows`), the same rows for every module,
            as the authors' per-call re-seeding does; an empty cluster is refilled with a row
            drawn by a ``torch.Generator`` seeded with ``seed`` (theirs: ``torch.randint``).
        tol: a module stops when the squared sum over centres of their shift is below ``tol``.

    Returns:
        ``labels [modules, heads]`` (the assignment to the centres before their last update,
        as kmeans_pytorch returns it) and ``centres [modules, C, F]``, the means of their member
        rows, differentiable with respect to ``x`` (as in kmeans_pytorch).

    Why not a library: ``kmeans_pytorch`` (the authors' base) clusters one problem per call,
    re-seeds numpy's global generator and returns its results on the CPU; fast-pytorch-kmeans
    and faiss cluster one problem per call without a gradient through the centres; scikit-learn
    is CPU-only and not differentiable. Here the problem is a handful of points (H heads) of
    large dimension per module, dozens of modules per forward, and the loss needs the centres'
    gradient, which none of them gives batched.
    """
    m, h, f = x.shape
    if not 1 <= groups <= h:
        raise HeadPruneError(f"cannot cluster {h} heads into {groups} groups.")
    centres = x[:, torch.as_tensor(initial_rows(h, groups, seed), device=x.device)]
    done = torch.zeros(m, dtype=torch.bool, device=x.device)
    labels = torch.zeros(m, h, dtype=torch.long, device=x.device)
    generator = None
    for _ in range(MAX_ITER):
        with torch.no_grad():
            dist = torch.cdist(x.detach().float(), centres.detach().float(),
                               compute_mode="donot_use_mm_for_euclid_dist")
            labels = torch.where(done[:, None], labels, dist.argmin(-1))
        onehot = torch.nn.functional.one_hot(labels, groups).to(x.dtype)  # [m, h, C]
        counts = onehot.sum(1)  # [m, C]
        new = onehot.transpose(1, 2) @ x / counts.clamp(min=1).unsqueeze(-1)
        empty = (counts == 0) & ~done[:, None]
        if bool(empty.any()):
            generator = generator or torch.Generator().manual_seed(seed)
            for mod, c in empty.nonzero().tolist():
                row = int(torch.randint(h, (1,), generator=generator))
                new = new.clone()
                new[mod, c] = x[mod, row]
        new = torch.where(done[:, None, None], centres, new)
        shift = (new.detach() - centres.detach()).pow(2).sum(-1).sqrt().sum(-1)
        centres = new
        done = done | (shift.pow(2) < tol)
        if bool(done.all()):
            break
    return labels, centres


def cosine(a: Tensor, b: Tensor) -> Tensor:
    """dot / (norm * norm) over the last dimension, with no epsilon (as the authors)."""
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))


def group_loss(x: Tensor, labels: Tensor, centres: Tensor, alpha: float, beta: float) -> Tensor:
    """Each module's group constraint (``head_cluster_loss_prune.py`` l.123-186):
    -alpha * mean_i cos(x_i, z_c(i)) + beta * mean_{j<k} cos(z_j, z_k), shape ``[modules]``.

    The paper's Eq. 4(B) writes the same terms with the opposite signs and phi called a
    similarity; the code's signs (heads pulled towards their centre, centres pushed apart) are
    the ones that do what the paper describes, and are used here. With one group the second term
    averages over no pair (NaN in the authors' code): the criterion refuses C = 1.
    """
    own = centres.gather(1, labels.unsqueeze(-1).expand(-1, -1, x.size(-1)))
    homogenise = -alpha * cosine(x, own).mean(-1)
    j, k = torch.triu_indices(centres.size(1), centres.size(1), 1, device=x.device)
    diversify = beta * cosine(centres[:, j], centres[:, k]).mean(-1)
    return homogenise + diversify


def nearest_votes(x: Tensor, labels: Tensor, centres: Tensor) -> Tensor:
    """One vote per group for its member nearest its centre (euclidean; ties to the lower head),
    ``[modules, heads]`` of 0/1 (``computeandsort_distances_fromcenter`` l.147-186)."""
    own = centres.gather(1, labels.unsqueeze(-1).expand(-1, -1, x.size(-1)))
    dist = (x - own).norm(dim=-1)  # [m, h]
    votes = torch.zeros_like(dist)
    for c in range(centres.size(1)):
        d = torch.where(labels == c, dist, torch.full_like(dist, float("inf")))
        best = d.argmin(-1)  # first minimum: the lower head index
        member = (labels == c).any(-1)
        votes[torch.arange(x.size(0), device=x.device)[member], best[member]] = 1
    return votes


def keep_top_votes(votes: Tensor, keep: int) -> Tensor:
    """0/1 over heads: the ``keep`` heads with the most votes (``voting_on_pruneindicators``
    l.188-212: stable sort descending, ties to the lower head index)."""
    order = torch.sort(votes, descending=True, stable=True).indices
    mask = torch.zeros_like(votes)
    mask[order[:keep]] = 1
    return mask


class FeatureTap:
    """Collects, during one forward, each attention module's per-head feature map ``[heads, F]``.

    Features (``cluster_matrix`` of the authors' attention, notes 4.1): ``headout`` each head's
    context before ``out_proj`` (F = batch * query length * d_h; the authors' default),
    ``V``/``K`` the value/key projections (F = batch * key length * d_h), ``Q`` the query
    projection after fairseq's scaling, ``attn_matrix`` the attention probabilities after dropout
    (F = batch * query length * key length). Padding positions are included, as theirs.

    While tapping, the modules compute their attention probabilities explicitly (through
    ``dropout_module``, where the attn_matrix hook reads them) instead of with
    ``scaled_dot_product_attention``; their outputs are the same.
    """

    def __init__(self, model, types: str = "EDA", feature: str = "headout"):
        if feature not in FEATURES:
            raise HeadPruneError(f"unknown group feature '{feature}': expected one of "
                                 f"{', '.join(FEATURES)}.")
        self.model, self.types, self.feature = model, parse_gate_types(types, "types"), feature
        self.features: Dict[str, Tensor] = {}
        self._hooks: list = []
        self._saved: list = []

    def _store(self, key: str, module, per_head: Tensor):
        self.features[key] = per_head

    def _hook_for(self, key: str, module):
        heads = module.num_heads

        def by_time(t: Tensor) -> Tensor:  # [time, batch, heads * d] -> [heads, batch*time*d]
            time, bsz, _ = t.shape
            return t.view(time, bsz, heads, -1).permute(2, 1, 0, 3).reshape(heads, -1)

        if self.feature == "headout":
            def pre(mod, args):
                self.features[key] = by_time(args[0])
            return module.out_proj.register_forward_pre_hook(pre)
        if self.feature == "attn_matrix":
            def probs(mod, args, out):  # [batch * heads, tgt, src]
                self.features[key] = out.view(-1, heads, *out.shape[1:]).transpose(0, 1).reshape(
                    heads, -1)
            return module.dropout_module.register_forward_hook(probs)
        if self.feature in ("Q", "K") and isinstance(module, CollaborativeAttention):
            raise HeadPruneError(
                f"group feature {self.feature} has no per-head value in the collaborative "
                f"attention of {key} (its queries and keys are shared by the heads): use "
                f"headout, V or attn_matrix.")
        proj = {"V": module.v_proj, "K": module.k_proj, "Q": module.q_proj}[self.feature]

        def projected(mod, args, out):
            self.features[key] = by_time(out)
        return proj.register_forward_hook(projected)

    def __enter__(self) -> "FeatureTap":
        self.features = {}
        for kind, layer, module in attention_modules(self.model):
            if kind not in self.types or module.num_heads == 0:
                continue
            key = module_key(kind, layer)
            self._saved.append((module, module.explicit_path))
            module.explicit_path = True  # probabilities computed where the hooks see them
            self._hooks.append(self._hook_for(key, module))
        return self

    def __exit__(self, *exc):
        for hook in self._hooks:
            hook.remove()
        for module, flag in self._saved:
            module.explicit_path = flag
        self._hooks, self._saved = [], []
        return False

    def batches(self) -> List[Tuple[List[str], Tensor]]:
        """The collected features stacked by shape: ``[(keys, [modules, heads, F])]``."""
        by_shape: Dict[tuple, List[str]] = {}
        for key, feat in self.features.items():
            by_shape.setdefault(tuple(feat.shape), []).append(key)
        return [(keys, torch.stack([self.features[k] for k in keys]))
                for keys in by_shape.values()]


def check_groups(layout: Optional[HeadLayout], types: str, groups: int, minimum: int,
                 option: str):
    """One sentence unless ``groups`` >= ``minimum`` and every module of ``types`` in
    ``layout`` (a model's or a checkpoint's) holds at least ``groups`` heads."""
    if groups < minimum:
        raise HeadPruneError(
            f"{option} must be at least {minimum}, got {groups}"
            + (": the diversification term averages over pairs of group centres." if minimum == 2
               else "."))
    for kind, layers in (layout.kept.items() if layout is not None else []):
        for layer, kept in enumerate(layers):
            if kind in types and len(kept) < groups:
                original = layout.num_heads[kind]
                pruned = "" if len(kept) == original else f" left of its {original} after pruning"
                raise HeadPruneError(f"{option} {groups} is more than the {len(kept)} heads"
                                     f"{pruned} of {kind}:{layer + 1}.")


def constraint_loss(tap: FeatureTap, groups: int, alpha: float = ALPHA, beta: float = BETA,
                    seed: int = SEED) -> Optional[Tensor]:
    """The group constraint of one forward: :func:`group_loss` of every tapped module, summed
    (None when no module was tapped). Computed in float32 whatever the activations' dtype, as
    kmeans_pytorch casts its input (``X.float()``); under ``--fp16`` a half-precision dot product
    over batch * length * d_h entries would overflow."""
    total = None
    for _, x in tap.batches():
        x = x.float()
        labels, centres = kmeans(x, groups, seed)
        part = group_loss(x, labels, centres, alpha, beta).sum()
        total = part if total is None else total + part
    return total


@dataclass
class GroupConstraintConfig(LabelSmoothedCrossEntropyCriterionConfig):
    gha_groups: int = field(
        default=GROUPS, metadata={"help": "C, the groups the heads of each attention module are "
                                          "clustered into (the authors' N_head_clusters)"})
    gha_alpha: float = field(
        default=ALPHA, metadata={"help": "weight of the homogenisation term, heads towards their "
                                         "group centre (default: 0.5, the authors' IWSLT14 "
                                         "de-en GHT-PS run)"})
    gha_beta: float = field(
        default=BETA, metadata={"help": "weight of the diversification term, group centres "
                                        "apart (default: 0.7, the same run)"})
    gha_feature: ChoiceEnum(list(FEATURES)) = field(
        default="headout", metadata={"help": "feature map clustered: headout (each head's "
                                             "context, the authors' default), V, attn_matrix, "
                                             "Q or K"})
    gha_types: str = field(
        default="E,D,A", metadata={"help": "attention types constrained: letters among E, D, A"})
    gha_seed: int = field(default=SEED, metadata={"help": "k-means seed (the authors': 0)"})


@register_criterion("group_constraint_label_smoothed_cross_entropy",
                    dataclass=GroupConstraintConfig)
class GroupConstraintCriterion(LabelSmoothedCrossEntropyCriterion):
    """Label-smoothed cross-entropy plus Ni et al. (2023)'s group constraint (Sec. 3.1, Eq. 4;
    ``head_cluster_loss_prune.py`` l.123-209): in every forward, each constrained attention
    module's heads are clustered into C groups on their feature maps (:func:`kmeans`) and
    :func:`group_loss` is added, summed over modules (no division by their number) to the
    token-SUMMED label-smoothed loss, as the authors' code: fairseq divides both by the number of
    tokens, so the constraint's weight per token shrinks as batches grow. It is added in
    validation too (the authors' criterion runs there as well) and logged as ``group``.
    """

    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0,
                 report_accuracy=False, gha_groups=GROUPS, gha_alpha=ALPHA, gha_beta=BETA,
                 gha_feature="headout", gha_types="E,D,A", gha_seed=SEED):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        self.groups, self.alpha, self.beta = int(gha_groups), float(gha_alpha), float(gha_beta)
        self.feature, self.types = str(gha_feature), parse_gate_types(gha_types, "--gha-types")
        self.seed = int(gha_seed)
        check_groups(None, self.types, self.groups, 2, "--gha-groups")
        self._checked: Optional[int] = None

    def forward(self, model, sample, reduce=True):
        if self._checked != id(model):
            check_groups(HeadLayout.from_model(model), self.types, self.groups, 2,
                         "--gha-groups")
            self._checked = id(model)
        with FeatureTap(model, self.types, self.feature) as tap:
            loss, sample_size, logging_output = super().forward(model, sample, reduce=reduce)
        group = constraint_loss(tap, self.groups, self.alpha, self.beta, self.seed)
        if group is None:
            return loss, sample_size, logging_output
        logging_output["group_loss"] = float(group.detach())
        return loss + group.to(loss.dtype), sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        if not logging_outputs or "group_loss" not in logging_outputs[0]:
            return
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        group = sum(log.get("group_loss", 0) for log in logging_outputs)
        metrics.log_scalar("group", group / max(sample_size, 1), sample_size, round=5)


@register_scorer("votes")
class VoteImportance(HeadImportance):
    """Voting-to-Stay (Ni et al. 2023, Sec. 3.2, Algorithm 1) as a head scorer: per batch and
    module, cluster the heads' feature maps into C groups and give one vote to each group's
    member nearest its centre (:func:`nearest_votes`). A head's score is the fraction of batches
    that voted for it, so ``choose --per-module C`` keeps the authors' top-C per module.

    No gradient is taken; the batch loss is the checkpoint criterion's, reported as usual.
    """

    method = "Ni et al. 2023, Voting-to-Stay votes"

    def __init__(self, groups: int = GROUPS, feature: str = "headout", types: str = "EDA",
                 seed: int = SEED, option: str = "--groups"):
        self.groups, self.feature, self.seed = int(groups), str(feature), int(seed)
        self.types = parse_gate_types(types, "vote_types" if option == "vote_groups" else "--types")
        self.option = option  # how the user named C, for the error messages
        check_groups(None, self.types, self.groups, 1, option)

    @classmethod
    def from_config(cls, cfg) -> "VoteImportance":
        return cls(groups=cfg.vote_groups, feature=str(cfg.vote_feature),
                   types=str(cfg.vote_types), seed=cfg.vote_seed, option="vote_groups")

    def options(self) -> dict:
        return {"groups": self.groups, "feature": self.feature, "types": self.types,
                "seed": self.seed}

    def batch_scores(self, model, sample, criterion):
        layout = HeadLayout.from_model(model)
        check_groups(layout, self.types, self.groups, 1, self.option)
        with torch.no_grad():
            with FeatureTap(model, self.types, self.feature) as tap:
                loss, sample_size, logging_output = criterion(model, sample)
            scores = empty_scores(layout)
            modules = {module_key(k, layer): (k, layer, module)
                       for k, layer, module in attention_modules(model)}
            for keys, x in tap.batches():
                labels, centres = kmeans(x.float(), self.groups, self.seed)
                votes = nearest_votes(x.float(), labels, centres)
                for key, row in zip(keys, votes):
                    kind, layer, module = modules[key]
                    scores[kind][layer, module.kept_heads] = row.double().cpu()
        for kind in scores:
            if kind not in self.types:
                del scores[kind]
                continue
            logging_output[COUNT + kind] = 1  # scores sum over batches
        return scores, loss.detach(), sample_size, logging_output
