"""Cordonnier, Loukas & Jaggi (2020): re-parametrise a trained model's attention as collaborative
attention (shared query/key projections of size D~k) by a CP decomposition of its query-key
products, without retraining.

As the authors' ``src/collaborative_attention/swap.py`` (METHODS_NOTES 5.2):

1. Per head h, ``WQ_h``, ``WK_h`` (``[head_dim, D_in]``) are the head's rows of ``q_proj``/``k_proj``.
2. Below the full size (``D~k < heads x head_dim``) the tensor
   ``T[q, h, k] = sum_d WQ_h[d, q] WK_h[d, k]`` (``[D_in, heads, kdim]``) is decomposed with
   tensorly's ``parafac`` on its PyTorch backend, rank D~k, ``init="random"``, ``tol=1e-6``, every
   other argument tensorly's default (100 ALS iterations, no normalisation). Factors
   ``A [D_in, D~k]``, ``B [heads, D~k]``, ``C [kdim, D~k]`` become ``q_proj = A^T``,
   ``mixing = B`` (times the CP weights, all ones here) and ``k_proj = C^T``.
3. At the full size no decomposition: the stacked original weights and the CONCATENATE mixing,
   exact by construction.
4. The query bias becomes the content bias ``c_h = b_Q,h^T WK_h``; the key bias and every
   query-only term are constant along the keys and cancel in the softmax, so they are dropped.

Beyond the authors: the collaborative layer keeps the original ``head_dim ** -0.5`` scaling, so
there is no sqrt(D / D~k) mismatch (METHODS_NOTES 5.3); the decomposition runs in float64 and is
seeded (``random_state``; the authors' is numpy's unseeded global generator); the relative
reconstruction error of T is reported per module. Encoders only in the authors' code; here any of
E, D, A, pruned models included (the full size of a module is its kept heads x head_dim).
"""

import logging
from typing import Dict, List

import torch
from tqdm import tqdm

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.heads.layout import TYPE_NAMES, module_prefix
from fairseq_headprune.model.collaborative import collaborative_types, concatenate_mixing
from fairseq_headprune.model.gates import parse_gate_types
from fairseq_headprune.pruning.checkpoint import (
    checkpoint_layout, count_parameters, load_checkpoint, require_headprune, save_checkpoint,
    strip_training_state)

logger = logging.getLogger(__name__)

CP_TOL = 1e-6  # swap.py's parafac(..., tol=1e-6)
CP_ITERS = 100  # tensorly's default n_iter_max, which swap.py keeps


def qk_tensor(wq: torch.Tensor, wk: torch.Tensor, heads: int) -> torch.Tensor:
    """``T[q, h, k] = sum_d WQ_h[d, q] WK_h[d, k]`` from ``q_proj``/``k_proj`` weights
    (``[heads*head_dim, D_in]``, ``[heads*head_dim, kdim]``); shape ``[D_in, heads, kdim]``."""
    return torch.einsum("hdq,hdk->qhk", wq.reshape(heads, -1, wq.size(1)),
                        wk.reshape(heads, -1, wk.size(1)))


def cp_factors(tensor: torch.Tensor, rank: int, seed: int, iters: int = CP_ITERS,
               init: str = "random"):
    """Rank-``rank`` CP decomposition of ``tensor`` ``[I, H, K]`` with tensorly (PyTorch backend).

    Returns:
        ``(A [I, rank], B [H, rank], C [K, rank])`` with ``tensor ~ sum_r A[:, r] B[:, r] C[:, r]``
        (the CP weights multiplied into ``B``).
    """
    import tensorly
    from tensorly.decomposition import parafac

    with tensorly.backend_context("pytorch"):
        cp = parafac(tensor, rank=rank, n_iter_max=iters, init=init, tol=CP_TOL,
                     random_state=seed)
    a, b, c = cp.factors
    return a, b * cp.weights, c


def relative_error(tensor: torch.Tensor, a, b, c) -> float:
    """``||T - [[A, B, C]]||_F / ||T||_F``."""
    approx = torch.einsum("qr,hr,kr->qhk", a, b, c)
    norm = tensor.norm()
    return float((tensor - approx).norm() / norm) if norm > 0 else 0.0


def reparametrise_module(sd: Dict[str, torch.Tensor], prefix: str, key_dim: int, head_dim: int,
                         seed: int, iters: int = CP_ITERS, init: str = "random") -> float:
    """Turn one attention module of state dict ``sd`` into a collaborative one, in place.

    Returns:
        the relative reconstruction error of its query-key tensor (0 at the full size).
    """
    wq, wk = sd.pop(prefix + "q_proj.weight"), sd.pop(prefix + "k_proj.weight")
    bq = sd.pop(prefix + "q_proj.bias", None)
    sd.pop(prefix + "k_proj.bias", None)
    dtype, heads = wq.dtype, len(sd[prefix + "kept_heads"])
    wq, wk = wq.double(), wk.double()
    error = 0.0
    if heads == 0:
        new_q, new_k = wq.new_zeros(key_dim, wq.size(1)), wk.new_zeros(key_dim, wk.size(1))
        mixing = wq.new_zeros(0, key_dim)
    elif key_dim == heads * head_dim:
        new_q, new_k = wq, wk
        mixing = concatenate_mixing(heads, key_dim).double()
    else:
        tensor = qk_tensor(wq, wk, heads)
        a, b, c = cp_factors(tensor, key_dim, seed, iters, init)
        error = relative_error(tensor, a, b, c)
        new_q, mixing, new_k = a.t(), b, c.t()
    if bq is None:
        bias = wk.new_zeros(heads, wk.size(1))
    else:
        bias = torch.einsum("hd,hdk->hk", bq.double().reshape(heads, head_dim),
                            wk.reshape(heads, head_dim, -1))
    sd[prefix + "q_proj.weight"] = new_q.to(dtype).contiguous()
    sd[prefix + "k_proj.weight"] = new_k.to(dtype).contiguous()
    sd[prefix + "mixing"] = mixing.to(dtype).contiguous()
    sd[prefix + "content_bias.weight"] = bias.to(dtype).contiguous()
    return error


def collab_checkpoint(path: str, output: str, key_dim: int, types: str = "E,D,A", seed: int = 0,
                      iters: int = CP_ITERS, init: str = "random") -> Dict:
    """Re-parametrise the attention modules of ``types`` of checkpoint ``path`` with shared key
    size ``key_dim`` and write ``output`` atomically (optimizer state dropped).

    Returns:
        a report: ``key_dim``, ``types``, ``seed``, ``params_before``/``params_after`` and
        ``modules``, one ``{"module": "E:1", "heads", "full", "error"}`` per module.
    """
    state = load_checkpoint(path)
    args = require_headprune(state, path)
    done = collaborative_types(state["model"])
    if done:
        what = "; ".join(f"key size {k} on {','.join(t)}" for k, t in done.items())
        raise HeadPruneError(f"{path} is already collaborative ({what}): re-parametrise the "
                             f"original checkpoint instead.")
    types = parse_gate_types(types, "--types")
    layout = checkpoint_layout(state)
    missing = [k for k in types if not layout.num_layers(k)]
    if missing:
        raise HeadPruneError(
            f"--types names {TYPE_NAMES[missing[0]]} ({missing[0]}), which {path} does not have.")
    if key_dim < 1:
        raise HeadPruneError(f"--key-dim must be at least 1, not {key_dim}.")
    dims = {"E": args.encoder_embed_dim // args.encoder_attention_heads,
            "D": args.decoder_embed_dim // args.decoder_attention_heads}
    dims["A"] = dims["D"]
    modules: List[Dict] = []
    for kind in types:
        for layer, kept in enumerate(layout.kept[kind]):
            full = len(kept) * dims[kind]
            if key_dim > full and kept:
                raise HeadPruneError(
                    f"--key-dim {key_dim} is above the full key size of {kind}:{layer + 1} "
                    f"({full} = {len(kept)} heads x {dims[kind]}); the largest useful value is "
                    f"{min(len(k) * dims[kind] for k in layout.kept[kind] if k)}.")
            modules.append({"module": f"{kind}:{layer + 1}", "heads": len(kept), "full": full})
    report = {"key_dim": key_dim, "types": ",".join(types), "seed": seed, "iters": iters,
              "init": init, "params_before": count_parameters(state["model"])}
    for entry in tqdm(modules, desc="CP decomposition", unit="module", leave=False):
        kind, layer = entry["module"].split(":")
        entry["error"] = reparametrise_module(
            state["model"], module_prefix(kind, int(layer) - 1), key_dim, dims[kind], seed,
            iters, init)
        logger.debug("%s: relative reconstruction error %.6f", entry["module"], entry["error"])
    args.collab_key_dim = key_dim
    args.collab_types = ",".join(types)
    report.update(params_after=count_parameters(state["model"]), modules=modules)
    state["headprune_collab"] = report
    strip_training_state(state)
    save_checkpoint(state, output)
    return report
