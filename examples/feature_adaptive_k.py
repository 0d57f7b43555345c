"""plain_loop.py with variance-aware adaptive accumulation (eqs. 5-7): k micro-batches per step,
k chosen in [2, 8] from the measured gradient noise. The number of steps is not known in advance,
so the loop runs to a number of samples and evaluates every so many samples.

    python examples/feature_adaptive_k.py [--max-iters 60] [--out losses.json]
"""
import torch
import torch.nn.functional as F

from common import batches, gpt, parse_args, report
from trainopt_core import OptimizationConfig, prepare

args = parse_args()
model = gpt(args)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
get_batch = batches(args)
config = OptimizationConfig(adaptive=True, k=2, k_min=2, k_max=8, noise_window=4)
engine = prepare(model, optimizer, config, micro_batch_size=args.micro_batch_size,
                 total_samples=args.max_iters * args.batch_size)

losses = []
while not engine.done():  # --max-iters x --batch-size samples, however many steps that takes
    for micro_step in engine.micro_steps():  # k of them, chosen at the last step
        x, y = get_batch(args.micro_batch_size)
        logits = model(x).logits
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        engine.backward(loss, num_items=y.numel())
    engine.step()
    losses.append(loss.item())
    if engine.every(samples=10 * args.batch_size):
        print({key: engine.stats()[key] for key in ("samples_consumed", "next_k_micro_batches", "b_simple_items")})
report(args, losses)
