"""plain_loop.py with mixed precision: the forward in bf16 autocast (weights and optimizer stay
fp32); fp16, on a GPU, adds dynamic loss scaling with the same lines.

    python examples/feature_precision.py [--max-iters 60] [--out losses.json]
"""
import torch
import torch.nn.functional as F

from common import batches, gpt, parse_args, report
from trainopt_core import OptimizationConfig, prepare

args = parse_args()
model = gpt(args)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
get_batch = batches(args)
config = OptimizationConfig(precision="bf16")  # or "fp16" on a GPU: autocast + dynamic loss scaling
engine = prepare(model, optimizer, config, micro_batch_size=args.batch_size)

losses = []
for it in range(args.max_iters):
    x, y = get_batch(args.batch_size)
    with engine.autocast():
        logits = model(x).logits
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    engine.backward(loss, num_items=y.numel())
    engine.step()
    losses.append(loss.item())
report(args, losses)
