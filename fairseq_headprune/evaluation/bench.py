"""``fairseq-headprune bench``: unpruned versus physically pruned decoding, side by side.

Two sources of models: two checkpoints and their data (``run_bench``), or random-weight models
of the standard sizes with half of every module's heads removed (``synthetic_bench``, no data
needed), so that speed can be measured on a GPU machine without a trained model and does not
depend on what an untrained model emits: every hypothesis is forced to the same length.
"""

import copy
import logging
import statistics
from argparse import Namespace
from typing import Dict, List, Optional, Sequence

import torch
from fairseq.data import Dictionary, LanguagePairDataset
from fairseq.models.transformer import base_architecture, transformer_vaswani_wmt_en_de_big
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from tqdm import tqdm

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.evaluation.cost import decode_macs, kv_cache_bytes
from fairseq_headprune.evaluation.decode import load_model, translate
from fairseq_headprune.heads.layout import HeadLayout, attention_modules
from fairseq_headprune.model.collaborative import key_dims
from fairseq_headprune.pruning.masking import remove_heads_from_model

logger = logging.getLogger(__name__)

# the standard sizes: fairseq's transformer (base) and transformer_vaswani_wmt_en_de_big
SYNTHETIC = {"base": base_architecture, "big": transformer_vaswani_wmt_en_de_big}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def run_bench(data: str, full_path: str, pruned_path: str, subset: str = "test", beam: int = 5,
              batch_sizes: Sequence[int] = (1, 64), max_sentences: int = 200,
              repeats: int = 3, device: str = "cpu", fixed_length: Optional[int] = 0,
              dtype: str = "fp32") -> Dict:
    """Decode the same sentences of DATA with both checkpoints at each batch size (see
    :func:`bench_models`).

    A pruned model that translates worse may stop later (or never, up to the length limit),
    which says nothing about the cost of its attention; so by default (``fixed_length=0``) every
    hypothesis of both models is forced to the mean reference length, and both do exactly the
    same decoding steps. ``None`` decodes freely; a positive number fixes that length.
    """
    check_dtype(dtype, device)
    loaded = {name: load_model(p, data, device, subset) for name, p in
              (("full", full_path), ("pruned", pruned_path))}
    models = {name: model for name, (model, _) in loaded.items()}
    task = loaded["full"][1]
    task.load_dataset(subset)
    dataset = task.dataset(subset)
    n = min(max_sentences, len(dataset))
    src_len = float(sum(dataset.src_sizes[:n])) / n
    tgt_len = float(sum(dataset.tgt_sizes[:n])) / n
    if fixed_length == 0:
        fixed_length = max(round(tgt_len) - 1, 1)  # tokens before the end of sentence
    return bench_models(models, task, subset, beam, batch_sizes, max_sentences, repeats, device,
                        fixed_length, src_len, tgt_len, dtype)


def check_dtype(dtype: str, device: str):
    if dtype not in DTYPES:
        raise HeadPruneError(f"unknown --dtype '{dtype}': expected one of {', '.join(DTYPES)}.")
    if dtype != "fp32" and not str(device).startswith("cuda"):
        raise HeadPruneError(f"--dtype {dtype} is for GPU decoding: use --device cuda, or fp32 "
                             f"on {device}.")


def synthetic_task(vocab: int, sentences: int, src_len: int, seed: int = 0) -> TranslationTask:
    """A translation task over a joined dictionary of ``vocab`` symbols whose ``test`` split
    holds ``sentences`` random sentences of ``src_len`` tokens (plus end of sentence)."""
    dictionary = Dictionary()
    for i in range(vocab - len(dictionary)):
        dictionary.add_symbol(f"w{i}")
    generator = torch.Generator().manual_seed(seed)
    low = dictionary.nspecial
    tokens = [torch.cat([torch.randint(low, len(dictionary), (src_len,), generator=generator),
                         torch.tensor([dictionary.eos()])]) for _ in range(sentences)]
    sizes = [len(t) for t in tokens]
    task = TranslationTask(TranslationConfig(), dictionary, dictionary)
    task.datasets["test"] = LanguagePairDataset(tokens, sizes, dictionary, tokens, sizes,
                                                dictionary, left_pad_source=True)
    return task


def synthetic_models(size: str, task: TranslationTask, share: float = 0.5, seed: int = 0,
                     device: str = "cpu", dtype: str = "fp32") -> Dict[str, torch.nn.Module]:
    """Random-weight ``transformer_headprune`` models of a standard size (``base``: 6+6 layers,
    512 dimensions, 8 heads; ``big``: 1024, 16 heads), shared embeddings as fairseq's WMT
    models, and a copy with ``share`` of every attention module's heads removed (a seeded
    random choice per module)."""
    from fairseq_headprune.model.transformer import HeadPruneTransformerModel

    if size not in SYNTHETIC:
        raise HeadPruneError(f"unknown synthetic size '{size}': expected one of "
                             f"{', '.join(SYNTHETIC)}.")
    if not 0 < share < 1:
        raise HeadPruneError(f"--prune-share must be between 0 and 1 (exclusive), not {share}.")
    args = Namespace(share_all_embeddings=True, max_source_positions=1024,
                     max_target_positions=1024, encoder_layers_to_keep=None,
                     decoder_layers_to_keep=None)
    SYNTHETIC[size](args)
    torch.manual_seed(seed)
    full = HeadPruneTransformerModel.build_model(args, task)
    generator = torch.Generator().manual_seed(seed)
    spec: Dict[str, Dict[int, List[int]]] = {}
    for kind, layer, module in attention_modules(full):
        n = module.num_heads
        order = torch.randperm(n, generator=generator).tolist()
        spec.setdefault(kind, {})[layer] = sorted(order[: round(n * share)])
    pruned = copy.deepcopy(full)
    remove_heads_from_model(pruned, spec)
    return {name: m.to(device=device, dtype=DTYPES[dtype]).eval()
            for name, m in (("full", full), ("pruned", pruned))}


def synthetic_bench(size: str = "base", beam: int = 5, batch_sizes: Sequence[int] = (1, 64),
                    sentences: int = 64, repeats: int = 3, device: str = "cpu",
                    steps: int = 25, src_len: int = 25, vocab: int = 32000, share: float = 0.5,
                    seed: int = 0, dtype: str = "fp32") -> Dict:
    """:func:`bench_models` on :func:`synthetic_models`: ``sentences`` random source sentences
    of ``src_len`` tokens, every hypothesis forced to exactly ``steps`` tokens."""
    check_dtype(dtype, device)
    task = synthetic_task(vocab, sentences, src_len, seed)
    models = synthetic_models(size, task, share, seed, device, dtype)
    report = bench_models(models, task, "test", beam, batch_sizes, sentences, repeats, device,
                          steps, float(src_len + 1), float(steps + 1), dtype, bleu=False)
    report["synthetic"] = {"size": size, "vocab": vocab, "prune_share": share, "seed": seed}
    return report


def spread(values: List[float], digits: int = 3) -> Dict[str, float]:
    """Median and range of repeated measurements."""
    return {"median": round(statistics.median(values), digits),
            "min": round(min(values), digits), "max": round(max(values), digits)}


def bench_models(models: Dict[str, torch.nn.Module], task, subset: str, beam: int,
                 batch_sizes: Sequence[int], max_sentences: int, repeats: int, device: str,
                 fixed_length: Optional[int], src_len: float, tgt_len: float,
                 dtype: str = "fp32", bleu: bool = True) -> Dict:
    """Decode the same sentences with the ``full`` and the ``pruned`` model at each batch size;
    report speeds, sizes, the key/value cache and the ideal speedup from the removed
    multiply-adds.

    After one warm-up decode per model (allocator, kernels, first-call costs), ``repeats``
    rounds alternate between the two models, so that drift of the machine affects both alike.
    Each figure is reported as the median with its min-max range over the rounds; the speedup
    is the median of the per-round ratios full/pruned, with their range.
    """
    rows: List[Dict] = []
    rounds = tqdm(total=len(batch_sizes) * (repeats + 1), desc="bench", unit="round",
                  leave=False)
    for bs in batch_sizes:
        def decode(model, n):
            return translate(model, task, subset, beam, max_tokens=None, batch_size=bs,
                             max_sentences=n, device=device, fixed_length=fixed_length)

        for model in models.values():  # warm-up
            decode(model, bs)
        rounds.update()
        runs: Dict[str, list] = {name: [] for name in models}
        for _ in range(repeats):
            for name, model in models.items():
                runs[name].append(decode(model, max_sentences))
            rounds.update()
        row = {"batch_size": bs, "sentences": len(runs["full"][0].hypotheses)}
        for name, outs in runs.items():
            row[name] = {
                "seconds": spread([o.seconds for o in outs]),
                "sentences_per_s": spread([len(o.hypotheses) / o.seconds for o in outs], 2),
                "tokens_per_s": spread([o.hypothesis_tokens / o.seconds for o in outs], 1),
                "bleu": round(outs[0].bleu()[0], 2) if bleu else None}
        row["speedup"] = spread([f.seconds / p.seconds
                                 for f, p in zip(runs["full"], runs["pruned"])])
        rows.append(row)
    rounds.close()
    report = {"subset": subset, "beam": beam, "device": device, "device_name": device_name(device),
              "dtype": dtype, "repeats": repeats, "src_len": round(src_len, 2),
              "tgt_len": round(tgt_len, 2), "fixed_length": fixed_length, "rows": rows}
    vocab = len(task.target_dictionary)
    for name, model in models.items():
        layout, collab = HeadLayout.from_model(model), key_dims(model)
        report[name] = {
            "parameters": sum(p.numel() for p in model.parameters()),
            "heads": layout.count(),
            "collab_key_dims": collab,
            "kv_cache_bytes_per_sentence": round(kv_cache_bytes(
                layout, model.args, src_len, tgt_len, beam, key_dims=collab)),
            "macs_per_sentence": round(decode_macs(
                layout, model.args, vocab, src_len, tgt_len, beam, key_dims=collab))}
    report["ideal_speedup"] = round(report["full"]["macs_per_sentence"]
                                    / report["pruned"]["macs_per_sentence"], 3)
    report["parameter_ratio"] = round(report["pruned"]["parameters"] / report["full"]["parameters"], 3)
    report["kv_cache_ratio"] = round(report["pruned"]["kv_cache_bytes_per_sentence"]
                                     / report["full"]["kv_cache_bytes_per_sentence"], 3)
    for row in rows:
        row["measured_over_ideal"] = round(row["speedup"]["median"] / report["ideal_speedup"], 3)
        row["share_of_ideal_gain"] = share_of_ideal_gain(row["speedup"]["median"],
                                                         report["ideal_speedup"])
    return report


def share_of_ideal_gain(speedup: float, ideal: float) -> Optional[float]:
    """(1 - t_pruned / t_full) / (1 - 1 / ideal): the share of the time the removed
    multiply-adds could save that the pruned model does save (issue 14's definition)."""
    if ideal <= 1:
        return None
    return round((1 - 1 / speedup) / (1 - 1 / ideal), 3)


def figure(value):
    """A bench figure as one number: the median of a report's ``{median, min, max}`` (reports
    written before the spread was recorded hold the number itself: the fastest round)."""
    return value["median"] if isinstance(value, dict) else value


def rounds_note(report: Dict) -> str:
    """How a report's figures were taken from its rounds, for the tables built from it."""
    if "repeats" in report:
        return f"median of {report['repeats']} interleaved rounds"
    return "fastest of interleaved rounds"


def device_name(device: str) -> str:
    if str(device).startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    import platform
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def format_bench(report: Dict) -> str:
    fixed = report.get("fixed_length")
    synthetic = report.get("synthetic")
    lines = [(f"synthetic {synthetic['size']} (random weights, vocabulary {synthetic['vocab']}, "
              f"{synthetic['prune_share']:.0%} of every module's heads removed), "
              if synthetic else f"subset {report['subset']}, ")
             + f"beam {report['beam']}, {report['device']} ({report['device_name']}), "
             f"{report['dtype']}, median [min-max] of {report['repeats']} rounds, "
             f"mean lengths src {report['src_len']} / tgt {report['tgt_len']} tokens, "
             + (f"every hypothesis forced to {fixed} tokens" if fixed else "free lengths"),
             f"{'':10s} {'params':>12s} {'heads':>6s} {'KV cache/sent':>14s} {'MACs/sent':>14s}"]
    for name in ("full", "pruned"):
        r = report[name]
        lines.append(f"{name:10s} {r['parameters']:>12,} {r['heads']:>6d} "
                     f"{r['kv_cache_bytes_per_sentence']:>12,} B {r['macs_per_sentence']:>14,}")
    lines.append(f"ratios pruned/full: parameters {report['parameter_ratio']}, KV cache "
                 f"{report['kv_cache_ratio']}; ideal speedup from removed MACs "
                 f"{report['ideal_speedup']}x")

    def fig(s):
        return f"{s['median']:.2f} [{s['min']:.2f}-{s['max']:.2f}]"

    for row in report["rows"]:
        f, p, s = row["full"], row["pruned"], row["speedup"]
        lines.append(f"batch {row['batch_size']:>4d}: full {fig(f['sentences_per_s'])} sent/s | "
                     f"pruned {fig(p['sentences_per_s'])} sent/s | speedup {fig(s)}x = "
                     f"{row['measured_over_ideal']} of ideal ({row['share_of_ideal_gain']} of "
                     f"the ideal gain)")
    return "\n".join(lines)


def speed_table(reports: List[Dict]) -> str:
    """Markdown table of benchmark reports (one line per report and batch size), with issue 14's
    goals: at batch 64 at least 0.8 of the ideal gain; at batch 1 never slower than unpruned
    beyond the measured spread (the per-round speedups reach 1)."""
    lines = ["| model | device | dtype | batch | rounds | unpruned sent/s | pruned sent/s | "
             "speedup [min-max] | ideal | share of ideal gain | goal |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in reports:
        syn = r.get("synthetic")
        model = (f"synthetic {syn['size']}, {syn['prune_share']:.0%} of heads removed" if syn
                 else f"{r['full']['heads']} -> {r['pruned']['heads']} heads")
        for row in r["rows"]:
            s = row["speedup"]
            goal = ""
            if row["batch_size"] >= 64:
                share = row["share_of_ideal_gain"]
                goal = "met (>= 0.8)" if share is not None and share >= 0.8 else "not met (< 0.8)"
            elif row["batch_size"] == 1:
                goal = "met (not slower)" if s["max"] >= 1 else "not met (slower)"
            lines.append(
                f"| {model} | {r['device_name']} | {r['dtype']} | {row['batch_size']} | "
                f"{r['repeats']} | "
                f"{figure(row['full']['sentences_per_s']):.2f} | "
                f"{figure(row['pruned']['sentences_per_s']):.2f} | {s['median']:.3f} "
                f"[{s['min']:.3f}-{s['max']:.3f}] | {r['ideal_speedup']:.3f} | "
                f"{row['share_of_ideal_gain']} | {goal} |")
    first = reports[0] if reports else {}
    lines.append(f"\nBeam {first.get('beam')}, every hypothesis forced to "
                 f"{first.get('fixed_length')} tokens, medians of the interleaved rounds after a "
                 f"warm-up; share of ideal gain = (1 - t_pruned / "
                 f"t_unpruned) / (1 - 1 / ideal), ideal from the multiply-adds of whole decoding "
                 f"steps.")
    return "\n".join(lines) + "\n"
