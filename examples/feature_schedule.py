"""plain_loop.py with the LR schedule stated in optimizer steps: linear warmup for --warmup-iters
steps, then cosine to --min-lr at step --max-iters (prepare(..., total_samples=N) states it in
samples instead, which stays right when adaptive accumulation changes the number of steps).

    python examples/feature_schedule.py [--max-iters 60] [--out losses.json]
"""
import torch
import torch.nn.functional as F

from common import batches, gpt, parse_args, report
from trainopt_core import OptimizationConfig, prepare

args = parse_args()
model = gpt(args)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
get_batch = batches(args)
config = OptimizationConfig(schedule="cosine")
engine = prepare(model, optimizer, config, micro_batch_size=args.batch_size,
                 total_steps=args.max_iters, warmup_steps=args.warmup_iters, min_lr=args.min_lr)

losses = []
for it in range(args.max_iters):
    x, y = get_batch(args.batch_size)
    logits = model(x).logits
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    engine.backward(loss, num_items=y.numel())
    engine.step()
    losses.append(loss.item())
report(args, losses)
