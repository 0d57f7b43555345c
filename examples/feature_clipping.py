"""plain_loop.py with gradient clipping (eq. 12): the global L2 norm of the gradient clipped to
--grad-clip before every optimizer step (after unscaling, in fp16); engine.last_grad_norm is the
norm before clipping.

    python examples/feature_clipping.py [--max-iters 60] [--out losses.json]
"""
import torch
import torch.nn.functional as F

from common import batches, gpt, parse_args, report
from trainopt_core import OptimizationConfig, prepare

args = parse_args()
model = gpt(args)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
get_batch = batches(args)
config = OptimizationConfig(clip_norm=args.grad_clip)
engine = prepare(model, optimizer, config, micro_batch_size=args.batch_size)

losses = []
for it in range(args.max_iters):
    x, y = get_batch(args.batch_size)
    logits = model(x).logits
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    engine.backward(loss, num_items=y.numel())
    engine.step()
    losses.append(loss.item())
report(args, losses)
