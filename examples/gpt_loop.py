"""A per-step GPT training loop that does everything by hand: gradient accumulation, bf16
autocast (fp16 with a GradScaler), linear warmup then cosine to a minimum LR per iteration, and
gradient clipping. gpt_loop_trainopt.py is the same loop with trainopt doing those four.

    python examples/gpt_loop.py [--max-iters 60] [--out losses.json]
"""
import math

import torch
import torch.nn.functional as F

from common import batches, gpt, parse_args, report

args = parse_args()
dtype = "bfloat16"  # "float32", "bfloat16" or "float16"
model = gpt(args)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
ctx = torch.autocast(device_type="cpu", dtype=getattr(torch, dtype), enabled=dtype != "float32")
scaler = torch.amp.GradScaler("cpu", enabled=dtype == "float16")
get_batch = batches(args)


def get_lr(it):
    if it < args.warmup_iters:  # linear warmup
        return args.lr * (it + 1) / (args.warmup_iters + 1)
    if it > args.max_iters:
        return args.min_lr
    decay_ratio = (it - args.warmup_iters) / (args.max_iters - args.warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # cosine from 1 to 0
    return args.min_lr + coeff * (args.lr - args.min_lr)


losses = []
for it in range(args.max_iters):
    lr = get_lr(it)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    for micro_step in range(args.accumulation_steps):
        x, y = get_batch(args.micro_batch_size)
        with ctx:
            logits = model(x).logits
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
            loss = loss / args.accumulation_steps  # the gradient of the mean over the whole batch
        scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    losses.append(loss.item() * args.accumulation_steps)  # the last micro-batch's loss
report(args, losses)
