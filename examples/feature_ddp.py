"""plain_loop.py on several data-parallel processes: DistributedDataParallel (gloo on CPUs, nccl
on GPUs), each process taking its share of every batch. The engine weights each share by its
token count, so N processes take the same steps as plain_loop.py on one.

    python -m torch.distributed.run --nproc-per-node 2 examples/feature_ddp.py [--out losses.json]
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
config = OptimizationConfig()
dist = init_distributed()  # the launcher's environment; one process without it
model = torch.nn.parallel.DistributedDataParallel(model) if dist.world_size > 1 else model
engine = prepare(model, optimizer, config, micro_batch_size=args.batch_size // dist.world_size)

losses = []
for it in range(args.max_iters):
    x, y = get_batch(args.batch_size)
    x, y = x[dist.rank::dist.world_size], y[dist.rank::dist.world_size]  # this process's share
    logits = model(x).logits
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    engine.backward(loss, num_items=y.numel())
    engine.step()
    losses.append(loss.item())
if dist.rank == 0:
    report(args, losses, model)
