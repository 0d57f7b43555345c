"""A plain per-step PyTorch training loop (fp32, one batch per step, constant LR): the loop every
feature_*.py example changes, each by the few lines one trainopt component needs.

    python examples/plain_loop.py [--max-iters 60] [--out losses.json]
"""
import torch
import torch.nn.functional as F

from common import batches, gpt, parse_args, report

args = parse_args()
model = gpt(args)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
get_batch = batches(args)

losses = []
for it in range(args.max_iters):
    x, y = get_batch(args.batch_size)
    logits = model(x).logits
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    losses.append(loss.item())
report(args, losses)
