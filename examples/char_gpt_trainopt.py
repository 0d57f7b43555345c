"""char_gpt.py after adopting trainopt: the engine does its gradient accumulation, precision,
warmup + cosine LR and clipping, and its checkpoint carries the engine's state, the random
generators and the prefetched batch, so a resumed run continues bit for bit
(tests/test_examples.py checks both against char_gpt.py and an uninterrupted run).

    python examples/char_gpt_trainopt.py [--max-iters 200] [--out-dir out-char-gpt] [--init-from resume]
"""
import argparse
import json
import os

import torch

import trainopt_core
from char_gpt_model import CharGPT, count_parameters, load_text

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--out-dir", default="out-char-gpt")
parser.add_argument("--init-from", default="scratch", choices=("scratch", "resume"))
parser.add_argument("--max-iters", type=int, default=200)
parser.add_argument("--eval-interval", type=int, default=50)
parser.add_argument("--eval-iters", type=int, default=10)
parser.add_argument("--batch-size", type=int, default=8, help="sequences per micro-batch")
parser.add_argument("--block-size", type=int, default=64)
parser.add_argument("--gradient-accumulation-steps", type=int, default=4)
parser.add_argument("--learning-rate", type=float, default=1e-3)
parser.add_argument("--min-lr", type=float, default=1e-4)
parser.add_argument("--warmup-iters", type=int, default=20)
parser.add_argument("--lr-decay-iters", type=int, default=200)
parser.add_argument("--grad-clip", type=float, default=1.0, help="0 turns clipping off")
parser.add_argument("--dtype", default="auto", choices=("float32", "bfloat16", "float16", "auto"))
parser.add_argument("--seed", type=int, default=1337)
parser.add_argument("--log", default=None, help="write each iteration's loss here (JSON)")
args = parser.parse_args()

torch.manual_seed(args.seed)
device = "cuda" if torch.cuda.is_available() else "cpu"
precision = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "auto": "auto"}[args.dtype]
train_data, val_data, vocab_size = load_text()


def get_batch(split):
    data = train_data if split == "train" else val_data
    ix = torch.randint(len(data) - args.block_size, (args.batch_size,))
    x = torch.stack([data[i:i + args.block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + args.block_size] for i in ix])
    return x.to(device), y.to(device)


iter_num, best_val_loss = 0, 1e9
model = CharGPT(vocab_size, args.block_size).to(device)
optimizer = model.configure_optimizers(weight_decay=0.1, learning_rate=args.learning_rate, betas=(0.9, 0.95))
checkpoint_path = os.path.join(args.out_dir, "ckpt.pt")
if args.init_from == "resume":
    checkpoint = torch.load(checkpoint_path, map_location=device)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    iter_num, best_val_loss = checkpoint["iter_num"], checkpoint["best_val_loss"]
print(count_parameters(model))
config = trainopt_core.OptimizationConfig(precision=precision, k=args.gradient_accumulation_steps, schedule="cosine",
                                          clip_norm=args.grad_clip)
engine = trainopt_core.prepare(model, optimizer, config, micro_batch_size=args.batch_size,
                               total_steps=args.lr_decay_iters, warmup_steps=args.warmup_iters, min_lr=args.min_lr)
if args.init_from == "resume":
    engine.load_state_dict(checkpoint["engine"])
    trainopt_core.set_rng_state(checkpoint["rng"])


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ("train", "val"):
        losses = torch.zeros(args.eval_iters)
        for k in range(args.eval_iters):
            X, Y = get_batch(split)
            with engine.autocast():
                _, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean().item()
    model.train()
    return out


log = {"iters": [], "losses": [], "evals": []}
X, Y = checkpoint["batch"] if args.init_from == "resume" else get_batch("train")
while True:
    rng = trainopt_core.rng_state()  # before the evaluation draws its batches
    if iter_num % args.eval_interval == 0:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        log["evals"].append([iter_num, losses["val"]])
        best_val_loss = min(best_val_loss, losses["val"])
        if iter_num > 0:
            os.makedirs(args.out_dir, exist_ok=True)
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": iter_num,
                        "best_val_loss": best_val_loss, "engine": engine.state_dict(), "rng": rng,
                        "batch": (X, Y)}, checkpoint_path)
    for micro_step in range(args.gradient_accumulation_steps):
        with engine.autocast():
            logits, loss = model(X, Y)
        X, Y = get_batch("train")  # the next micro-batch, drawn while this one is in flight
        engine.backward(loss)  # the mean over the micro-batch: no "/ k"
        engine.step()
    lossf = loss.item()
    log["iters"].append(iter_num)
    log["losses"].append(lossf)
    iter_num += 1
    if iter_num > args.max_iters:
        break
print(f"iter {iter_num - 1}: loss {lossf:.4f}")
if args.log:
    with open(args.log, "w") as handle:
        json.dump(log, handle)
