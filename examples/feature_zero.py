"""plain_loop.py with DeepSpeed ZeRO-2 over several data-parallel processes: each process takes
its share of every batch and holds its part of the optimizer state and of the gradients. The
forward runs through `engine.model` (the DeepSpeed engine). The engine weights each share by its
token count, so N processes take the same steps as plain_loop.py on one.

    python -m torch.distributed.run --nproc-per-node 2 examples/feature_zero.py [--out losses.json]

On CPUs DeepSpeed runs over gloo (DS_ACCELERATOR=cpu); its first use compiles a small op.
"""
import torch
import torch.nn.functional as F

from common import batches, gpt, parse_args, report
from trainopt_core import OptimizationConfig, prepare
from trainopt_core.distributed import init_distributed

args = parse_args()
model = gpt(args)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
get_batch = batches(args)
config = OptimizationConfig(zero_stage=2)
dist = init_distributed()  # the launcher's environment; one process without it
engine = prepare(model, optimizer, config, micro_batch_size=args.batch_size // dist.world_size, backend="deepspeed")

losses = []
for it in range(args.max_iters):
    x, y = get_batch(args.batch_size)
    x, y = x[dist.rank::dist.world_size], y[dist.rank::dist.world_size]  # this process's share
    logits = engine.model(x).logits
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    engine.backward(loss, num_items=y.numel())
    engine.step()
    losses.append(loss.item())
if dist.rank == 0:
    print(engine.zero_partitioning)
    report(args, losses, model)
engine.close()
