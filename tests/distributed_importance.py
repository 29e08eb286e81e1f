"""One data-parallel worker of fairseq-validate's importance loop, for test_importance.py.

fairseq-validate cannot run distributed on CPU (it spawns one process per CUDA device and
gathers logging outputs through a CUDA buffer), so this mirrors its loop (fairseq_cli/validate.py
l.90-139) with a gloo process group: the sharded batch iterator, valid_step per batch, the
logging outputs gathered (here with all_gather_object), reduce_metrics on every worker.

    python distributed_importance.py RANK WORLD INIT_FILE DATA CHECKPOINT OUTPUT BATCH_SIZE
"""

import sys

import torch.distributed as dist
from fairseq import checkpoint_utils, metrics

import fairseq_headprune.register  # noqa: F401


def main(rank, world, init_file, data, checkpoint, output, batch_size):
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=world)
    overrides = {"task": {"_name": "head_importance", "data": data,
                          "importance_output": output}}
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [checkpoint], arg_overrides=overrides)
    model = models[0]
    criterion = task.build_criterion(cfg.criterion)
    task.load_dataset("valid")
    itr = task.get_batch_iterator(
        dataset=task.dataset("valid"), max_sentences=batch_size,
        max_positions=model.max_positions(), required_batch_size_multiple=1,
        num_shards=world, shard_id=rank).next_epoch_itr(shuffle=False)
    logs = [task.valid_step(sample, model, criterion)[2] for sample in itr]
    if world > 1:
        gathered = [None] * world
        dist.all_gather_object(gathered, logs)
        logs = [log for worker in gathered for log in worker]
    with metrics.aggregate():
        task.reduce_metrics(logs, criterion)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    a = sys.argv[1:]
    main(int(a[0]), int(a[1]), a[2], a[3], a[4], a[5], int(a[6]))
