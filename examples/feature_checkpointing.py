"""plain_loop.py with activation checkpointing: the model's 4 GPT-2 blocks in ceil(sqrt(4)) = 2
checkpointed segments, recomputed in the backward. Same losses, less activation memory; the
state_dict is unchanged.

    python examples/feature_checkpointing.py [--max-iters 60] [--out losses.json]
"""
import torch
import torch.nn.functional as F

from common import batches, gpt, parse_args, report
from trainopt_core import OptimizationConfig, prepare

args = parse_args()
model = gpt(args)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
get_batch = batches(args)
config = OptimizationConfig(checkpointing="sqrt")
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
