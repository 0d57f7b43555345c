"""Draft (issue 11): train the quick ResNet baseline on the image stand-in with a given STANDIN_STYLE
and print its test-accuracy curve. Usage: python scripts/try_standin.py '{"pixel_noise": 0.3}' [train_n] [epochs] [lr] [seed]"""
import json, sys, time, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from trainopt_core.reproduction.data import images
from trainopt_core.reproduction.models import CifarResNet
style = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
train_n = int(sys.argv[2]) if len(sys.argv) > 2 else 8000
epochs = float(sys.argv[3]) if len(sys.argv) > 3 else 2
lr = float(sys.argv[4]) if len(sys.argv) > 4 else 2e-3
seed = int(sys.argv[5]) if len(sys.argv) > 5 else 0
images.STANDIN_STYLE.update(style)
torch.set_num_threads(2)
t = time.time()
data = images.make_standin_images(train_n, 1000, seed=0)
print("gen", round(time.time() - t, 1), "s", flush=True)
x = data.train_x.float() / 255; mean = x.mean((0, 2, 3), keepdim=True); std = x.std((0, 2, 3), keepdim=True)
norm = lambda a: (a.float() / 255 - mean) / std
torch.manual_seed(seed)
model = CifarResNet((3, 4, 6, 3), 8)
opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
total = int(epochs * train_n); seen = 0; evals = []
g = torch.Generator().manual_seed(seed)
def evaluate():
    model.eval()
    with torch.no_grad():
        acc = (model(norm(data.test_x)).argmax(1) == data.test_y).float().mean().item()
    model.train(); return acc
t = time.time()
every = total // 12
nxt = every
while seen < total:
    perm = torch.randperm(train_n, generator=g)
    for i in range(0, train_n - 127, 128):
        idx = perm[i:i + 128]
        loss = torch.nn.functional.cross_entropy(model(norm(data.train_x[idx])), data.train_y[idx])
        opt.zero_grad(); loss.backward(); opt.step(); seen += 128
        if seen >= nxt:
            evals.append((seen, round(evaluate(), 3), round(loss.item(), 3))); nxt += every
            print(evals[-1], round(time.time() - t), flush=True)
        if seen >= total: break
print("train acc (1000):", end=" ")
model.eval()
with torch.no_grad():
    print((model(norm(data.train_x[:1000])).argmax(1) == data.train_y[:1000]).float().mean().item())
