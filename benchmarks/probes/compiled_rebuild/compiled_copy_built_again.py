"""Does a compiled candidate built again (after being released for room) compile again?

Run from the repository root: python benchmarks/probes/compiled_rebuild/compiled_copy_built_again.py
The plan builds a released copy again with `Search._built`, as below: a new deep copy, prepared
(compiled) and stepped once; this prints that warm-up step's seconds for the first build and two more. Inductor's on-disk
cache is pointed at a new empty folder, so the first build compiles from nothing, as on a fresh
machine (left at its default, a second run of this script finds the first run's kernels there)."""
import copy, gc, os, tempfile, time, warnings

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor_cold_")
import torch
warnings.simplefilter("ignore")
from trainopt_core.reproduction.profiles import get_profile
from trainopt_core.reproduction.tasks import build_task
from trainopt_core.planner.search import Search
from trainopt_core.planner.space import Candidate

for task in ("wikitext2", "cifar10"):
    prof = get_profile(task, "quick")
    torch.manual_seed(0)
    bundle = build_task(prof, data_policy="auto", data_dir=None, device=torch.device("cpu"), seed=0)
    batch = tuple(t for t in next(bundle.train_batches(prof.baseline_batch_size, seed=0)) if t is not None)
    opt = lambda p: torch.optim.AdamW(p, lr=prof.lr)
    loss = lambda model, x, y=None: bundle.loss(model, x, y)
    search = Search(copy.deepcopy(bundle.model), opt, batch, loss, torch.device("cpu"), None, 3, 2, False, True)
    plain = Candidate(precision="bf16")
    compiled = Candidate(precision="bf16", compile=True)
    times = {}
    for label, cand in (("plain", plain), ("compiled, first build", compiled), ("compiled, built again", compiled),
                        ("compiled, built a third time", compiled)):
        trial, warm = search._built(cand)
        t0 = time.perf_counter(); trial.step(); step = time.perf_counter() - t0
        print(f"{task:9s} {label:30s} warm-up step {warm:7.2f} s, next step {step:6.3f} s", flush=True)
        del trial; gc.collect()
