"""``fairseq-headprune evaluate``: BLEU, heads and size of any set of checkpoints on one subset.

Each checkpoint (unpruned, pruned by any method, folded from gates) is decoded with fairseq's
generator on the same sentences and scored with sacrebleu; one row per checkpoint with its label,
heads kept per attention type, parameters, BLEU and the sacrebleu signature, and the time the
decoding took (free lengths, batches of ``max_tokens``: a rough speed; ``bench`` measures it). Rows are written
atomically as they finish; a rerun with the same settings skips checkpoints already scored (a
checkpoint rewritten since is scored again).
"""

import os
from typing import Dict, List, Optional, Sequence, Tuple

from tqdm import tqdm

from fairseq_headprune.errors import HeadPruneError
from fairseq_headprune.evaluation.decode import Translation, check_inputs, load_model, translate
from fairseq_headprune.heads.layout import HeadLayout
from fairseq_headprune.io import data_fingerprint, load_rows, write_json


def file_stamp(path: str) -> List[int]:
    stat = os.stat(path)
    return [stat.st_size, int(stat.st_mtime)]


def decoding_config(lenpen: float) -> Dict:
    """The decoding settings a results file records beyond beam and subset: ``lenpen`` only
    when it is not fairseq's default 1, so that files written before the option still resume."""
    return {} if lenpen == 1.0 else {"lenpen": lenpen}


def score_checkpoint(path: str, data: str, subset: str = "test", beam: int = 5,
                     max_tokens: int = 4000, max_sentences: Optional[int] = None,
                     device: str = "cpu", lenpen: float = 1.0) -> Tuple[Dict, Translation]:
    """Decode ``subset`` with one (already checked) checkpoint; return its row (heads kept and
    in all per type, parameters, BLEU with the sacrebleu signature, decoding time) and the
    :class:`Translation` itself (hypotheses and references, for further metrics)."""
    model, task = load_model(path, data, device, subset, checked=True)
    layout = HeadLayout.from_model(model)
    result = translate(model, task, subset, beam, max_tokens, max_sentences=max_sentences,
                       device=device, lenpen=lenpen)
    bleu, signature = result.bleu()
    row = {"heads": {k: layout.count(k) for k in layout.kept},
           "heads_total": {k: layout.num_heads[k] * layout.num_layers(k) for k in layout.kept},
           "params": sum(p.numel() for p in model.parameters()),
           "bleu": round(bleu, 2), "signature": signature,
           "sentences": len(result.references),
           "decode_seconds": round(result.seconds, 2),
           "sentences_per_s": round(len(result.references) / result.seconds, 2)}
    return row, result


def evaluate_checkpoints(data: str, paths: Sequence[str], output: str,
                         labels: Optional[Sequence[str]] = None, subset: str = "test",
                         beam: int = 5, max_tokens: int = 4000,
                         max_sentences: Optional[int] = None, device: str = "cpu",
                         lenpen: float = 1.0) -> List[Dict]:
    """Score every checkpoint of ``paths`` (see the module docstring); returns all rows."""
    labels = list(labels) if labels else [os.path.basename(p) for p in paths]
    if len(labels) != len(paths):
        raise HeadPruneError(f"--labels names {len(labels)} checkpoints, --paths {len(paths)}.")
    for path in paths:  # every input checked before the first decode
        check_inputs(path, data, subset)
    config = {"data": os.path.abspath(data), "subset": subset, "beam": beam,
              "max_sentences": max_sentences,
              "data_sha256": os.path.isdir(data) and data_fingerprint(data, subset),
              **decoding_config(lenpen)}
    rows = load_rows(output, config, "an evaluation")
    for label, path in tqdm(list(zip(labels, paths)), desc="evaluate", unit="checkpoint"):
        key = {"label": label, "path": os.path.abspath(path), "stamp": file_stamp(path)}
        if any(all(r.get(k) == v for k, v in key.items()) for r in rows):
            continue
        row, _ = score_checkpoint(path, data, subset, beam, max_tokens, max_sentences, device,
                                  lenpen)
        rows = [r for r in rows if r.get("label") != label]
        rows.append({**key, **row})
        write_json(output, {"config": config, "rows": rows})
    return rows
