"""plain_loop.py with gradient accumulation: each step's --batch-size sequences as
--accumulation-steps micro-batches, weighted by their token counts (eq. 4): the gradient of the
whole batch, at a micro-batch's activation memory. No `loss / k` in the loop.

    python examples/feature_accumulation.py [--max-iters 60] [--out losses.json]
"""
import torch
import torch.nn.functional as F

from common import batches, gpt, parse_args, report
from trainopt_core import OptimizationConfig, prepare

args = parse_args()
model = gpt(args)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
get_batch = batches(args)
config = OptimizationConfig(k=args.accumulation_steps)
engine = prepare(model, optimizer, config, micro_batch_size=args.micro_batch_size)

losses = []
for it in range(args.max_iters):
    for micro_step in engine.micro_steps():  # k micro-batches
        x, y = get_batch(args.micro_batch_size)
        logits = model(x).logits
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        engine.backward(loss, num_items=y.numel())
    engine.step()
    losses.append(loss.item())
report(args, losses)
