"""gpt_loop.py with trainopt doing its gradient accumulation, bf16 autocast, warmup + cosine LR
schedule and gradient clipping. Same losses, bit for bit (tests/test_examples.py).

    python examples/gpt_loop_trainopt.py [--max-iters 60] [--out losses.json]
"""
import torch
import torch.nn.functional as F

from common import batches, gpt, parse_args, report
from trainopt_core import OptimizationConfig, prepare

args = parse_args()
model = gpt(args)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
config = OptimizationConfig(precision="bf16", k=args.accumulation_steps, schedule="cosine", clip_norm=args.grad_clip)
get_batch = batches(args)
engine = prepare(model, optimizer, config, micro_batch_size=args.micro_batch_size,
                 total_steps=args.max_iters, warmup_steps=args.warmup_iters, min_lr=args.min_lr)

losses = []
for it in range(args.max_iters):
    for micro_step in range(args.accumulation_steps):
        x, y = get_batch(args.micro_batch_size)
        with engine.autocast():
            logits = model(x).logits
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        engine.backward(loss, num_items=y.numel())
    engine.step()
    losses.append(loss.item())  # the last micro-batch's loss
report(args, losses)
