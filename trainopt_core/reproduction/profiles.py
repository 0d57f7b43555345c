"""Profiles (SPEC §5): how big and how long each task runs, as data.

`paper` is the paper's setup (§IV). `quick` and `smoke` keep the same model families and the
same structure (16 bottleneck blocks; GPT-2 blocks; micro-batch = baseline batch ÷ 4, k ∈ [4, 8])
at sizes a 2-core CPU trains in about a minute / a few seconds. The quick and smoke targets come
from `targets.json`, written by `python -m trainopt_core.reproduction.calibrate` from measured
baseline curves (the quality the baseline reaches at 80 % of its run); the values below are used
only where that file has none. The paper profile keeps the paper's targets.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from .models import MODEL_SIZES

PROFILES = ("smoke", "quick", "paper", "gpu")
TASKS = ("cifar10", "wikitext2")
# plan()'s time budget for a task's `auto` plan, by profile (seconds): a smoke run lasts seconds and
# a quick one about a minute, so planning keeps within ~20 s / ~60 s on a busy 2-core CPU; the GPU
# profiles leave room for compiling the finalist. Not a TaskProfile field: a plan made under another
# budget stays reusable, and no run record's conditions change.
PLAN_TIME_BUDGET_S = {"smoke": 20.0, "quick": 60.0, "gpu": 120.0, "paper": 300.0}
# The paper's training sets (§IV): CIFAR-10's 50,000 training images; WikiText-2's 2.1 M tokens,
# in sequences of the paper's length (MODEL_SIZES["paper"]).
PAPER_TRAIN_IMAGES = 50_000
PAPER_TRAIN_TOKENS = 2_100_000
PAPER_EPOCHS = {"cifar10": 30, "wikitext2": 20}  # §IV
PAPER_EPOCH_SAMPLES = {"cifar10": PAPER_TRAIN_IMAGES,
                       "wikitext2": PAPER_TRAIN_TOKENS // MODEL_SIZES["paper"]["gpt2"]["seq_len"]}
# the paper's run, in samples: what a plan at the paper's sizes is told, whatever its own run's length
PAPER_RUN_SAMPLES = {task: PAPER_EPOCHS[task] * PAPER_EPOCH_SAMPLES[task] for task in PAPER_EPOCHS}


def epochs_text(epochs: float) -> str:
    """'1 epoch', '2.5 epochs'."""
    return f"{epochs:g} epoch{'' if epochs == 1 else 's'}"


def table_configs() -> tuple[str, ...]:
    """The configurations Tables I-III train, in order: the ablation ladder (baseline first),
    optimized, auto, then the leave-one-out steps."""
    from ..config import ABLATION_LADDER, leave_one_out

    return (*[c.name for c in ABLATION_LADDER], "optimized", "auto", *[c.name for c in leave_one_out()])


@dataclass(frozen=True, kw_only=True)
class TaskProfile:
    task: str
    profile: str
    model: dict                     # size of the model (trainopt_core.reproduction.models.MODEL_SIZES)
    baseline_batch_size: int        # paper: 128 images / 32 sequences
    train_samples: int | None       # samples per epoch (None: the whole training split)
    epochs: float
    eval_every_samples: int
    eval_samples: int               # test images / validation sequences per evaluation
    lr: float
    target: float                   # accuracy >= target, or perplexity <= target
    seq_len: int | None = None
    weight_decay: float = 0.01
    betas: tuple = (0.9, 0.999)
    throughput_warmup_steps: int = 2
    # Throughput (reproduction.throughput): every configuration a table compares is timed in
    # windows of `timing_steps_per_window` optimizer steps, interleaved in one process, after
    # `throughput_warmup_steps` untimed steps each. The number of windows grows with the seeds
    # asked for (`timing_windows_per_seed` x seeds, at least 2): `--seeds` is the one knob for how
    # much repetition, and so how narrow every interval, a reproduction pays for.
    timing_windows_per_seed: int = 3
    timing_steps_per_window: int = 2
    cpu_reduced_precision: str = "bf16"   # fp16 autocast is slow on CPU (SPEC §3)
    standin_sizes: dict = field(default_factory=dict)  # stand-in data set sizes
    # Scaled-down GPT-2s keep the GPT-2 BPE but renumber only the token ids that occur in the
    # corpus: with 50,257 outputs the LM head would be ~90% of a 4x128 model's compute and memory,
    # hiding what the components do to the transformer blocks (the paper's model is ~30% head).
    compact_vocab: bool = False
    # In-run checkpoints (reproduction.resume): every this many minutes of a run, so a killed
    # run resumes instead of starting over; None: none (a quick run lasts about a minute).
    checkpoint_every_minutes: float | None = None
    # With a stand-in, an epoch counts this many samples -- the paper's training set's -- and the
    # stand-in is cycled to that length, so the run's length, its time to target and plan()'s
    # compile-repay decision are the paper's workload's whatever the data at hand. None: an epoch
    # is the data at hand (`train_samples` or the whole split).
    paper_epoch_samples: int | None = None
    # plan() is told a run of this many samples instead of this profile's own (None: its own): the
    # gpu profile's short runs at the paper's sizes are planned for the paper's run, so whether
    # compiling repays is decided as it is for the paper's workload
    plan_run_samples: int | None = None

    def epoch_samples(self, num_train_samples: int, *, is_standin: bool) -> int:
        """Samples one epoch of this profile trains on: the paper's training set's where a
        stand-in replaces it (`paper_epoch_samples`), else the data at hand."""
        return self.paper_epoch_samples if is_standin and self.paper_epoch_samples else num_train_samples

    def run_length(self) -> str:
        """The run's length in words: what `list` prints."""
        unit = "images" if self.task == "cifar10" else f"sequences of {self.seq_len:,} tokens"
        if self.paper_epoch_samples:
            return (f"{epochs_text(self.epochs)} x {self.paper_epoch_samples:,} {unit} = "
                    f"{int(self.epochs * self.paper_epoch_samples):,} {unit} with a stand-in (the paper's "
                    f"{'CIFAR-10' if self.task == 'cifar10' else 'WikiText-2'} epoch: the stand-in cycled to it); "
                    f"{epochs_text(self.epochs)} of the real data set where it is in ./data")
        if self.train_samples:
            return f"{epochs_text(self.epochs)} x {self.train_samples:,} {unit} = {int(self.epochs * self.train_samples):,} {unit}"
        return f"{epochs_text(self.epochs)} of the data at hand"

    @property
    def plan_time_budget_s(self) -> float:
        """plan()'s time budget for this profile's `auto` plan (`PLAN_TIME_BUDGET_S`)."""
        return PLAN_TIME_BUDGET_S[self.profile]

    @property
    def quality_name(self) -> str:
        return "accuracy" if self.task == "cifar10" else "perplexity"

    @property
    def higher_is_better(self) -> bool:
        return self.task == "cifar10"

    @property
    def item_unit(self) -> str:
        return "img/s" if self.task == "cifar10" else "tok/s"

    def to_dict(self) -> dict:
        settings = dataclasses.asdict(self)
        for later in ("paper_epoch_samples", "plan_run_samples"):  # at None, the profiles that do not
            if settings[later] is None:                             # set them keep the conditions their
                del settings[later]                                 # records were made under
        return settings


# Settings only the interleaved throughput timing reads: a training run or a scaling launch
# made under other values of these did exactly the same, so its record stays reusable.
TIMING_ONLY_SETTINGS = ("timing_windows_per_seed", "timing_steps_per_window")


def _task(task: str, profile: str, **settings) -> TaskProfile:
    """A TaskProfile whose model size (and GPT-2 sequence length) come from models.MODEL_SIZES."""
    size = dict(MODEL_SIZES[profile]["resnet" if task == "cifar10" else "gpt2"])
    seq_len = size.pop("seq_len", None)
    return TaskProfile(task=task, profile=profile, model=size, seq_len=seq_len, **settings)


_PROFILES = {
    ("cifar10", "paper"): _task(
        "cifar10", "paper",
        baseline_batch_size=128, train_samples=None, epochs=PAPER_EPOCHS["cifar10"], eval_every_samples=50_000,
        eval_samples=10_000, lr=1e-4, target=0.85, throughput_warmup_steps=20, timing_windows_per_seed=4,
        timing_steps_per_window=10, checkpoint_every_minutes=10.0, paper_epoch_samples=PAPER_EPOCH_SAMPLES["cifar10"],
    ),
    ("wikitext2", "paper"): _task(
        "wikitext2", "paper",
        baseline_batch_size=32, train_samples=None, epochs=PAPER_EPOCHS["wikitext2"], eval_every_samples=2_000,
        eval_samples=240, lr=1e-4, target=45.0, throughput_warmup_steps=20, timing_windows_per_seed=4,
        timing_steps_per_window=10, checkpoint_every_minutes=10.0,
        paper_epoch_samples=PAPER_EPOCH_SAMPLES["wikitext2"],
    ),
    # The paper's models and batches (§IV) in runs sized for one GPU session: baseline, optimized
    # and `auto` of both tasks -- their runs, interleaved timing, peaks, energy and FLOPs
    # utilization -- in about 6 minutes on one H100 (scripts/gpu_campaign.py). Far too short to
    # reach the paper's targets, which they keep: time to target is the paper profile's.
    ("cifar10", "gpu"): _task(
        "cifar10", "gpu",
        baseline_batch_size=128, train_samples=8_192, epochs=1, eval_every_samples=4_096,
        eval_samples=2_048, lr=1e-4, target=0.85, throughput_warmup_steps=5, timing_windows_per_seed=6,
        timing_steps_per_window=5, standin_sizes=dict(standin_train_size=8_192, standin_test_size=2_048),
        plan_run_samples=PAPER_RUN_SAMPLES["cifar10"],
    ),
    ("wikitext2", "gpu"): _task(
        "wikitext2", "gpu",
        baseline_batch_size=32, train_samples=None, epochs=4, eval_every_samples=256,
        eval_samples=64, lr=1e-4, target=45.0, throughput_warmup_steps=5, timing_windows_per_seed=6,
        timing_steps_per_window=3, plan_run_samples=PAPER_RUN_SAMPLES["wikitext2"],
    ),
    ("cifar10", "quick"): _task(
        "cifar10", "quick",
        baseline_batch_size=128, train_samples=8_000, epochs=2, eval_every_samples=1_280,
        eval_samples=500, lr=5e-3, target=0.75, timing_windows_per_seed=4, timing_steps_per_window=6,
        standin_sizes=dict(standin_train_size=8_000, standin_test_size=1_000),
    ),
    ("wikitext2", "quick"): _task(
        "wikitext2", "quick",
        baseline_batch_size=16, train_samples=800, epochs=2, eval_every_samples=128,
        eval_samples=64, lr=1e-3, target=100.0, compact_vocab=True, timing_steps_per_window=4,
    ),
    ("cifar10", "smoke"): _task(
        "cifar10", "smoke",
        baseline_batch_size=32, train_samples=256, epochs=1, eval_every_samples=128,
        eval_samples=128, lr=2e-3, target=0.12, throughput_warmup_steps=1, timing_windows_per_seed=1,
        timing_steps_per_window=1,
        standin_sizes=dict(standin_train_size=512, standin_test_size=256),
    ),
    ("wikitext2", "smoke"): _task(
        "wikitext2", "smoke",
        baseline_batch_size=8, train_samples=64, epochs=1, eval_every_samples=32,
        eval_samples=16, lr=1e-3, target=4_500.0, throughput_warmup_steps=1, compact_vocab=True,
        timing_windows_per_seed=1, timing_steps_per_window=1,
    ),
}


def get_profile(task: str, profile: str) -> TaskProfile:
    if task not in TASKS:
        raise ValueError(f"task={task!r} is invalid: allowed {TASKS}")
    if profile not in PROFILES:
        raise ValueError(f"profile={profile!r} is invalid: allowed {PROFILES}")
    prof = _PROFILES[(task, profile)]
    calibrated = _CALIBRATED_TARGETS.get(profile, {}).get(task) if profile not in ("paper", "gpu") else None
    return prof if calibrated is None else dataclasses.replace(prof, target=calibrated)


TARGETS_FILE = Path(__file__).with_name("targets.json")


def load_targets(path: str | Path = TARGETS_FILE) -> dict:
    """{profile: {task: target}} from a calibration file (empty when there is none)."""
    path = Path(path)
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return {profile: {task: entry["target"] for task, entry in tasks.items()} for profile, tasks in data.items()}


_CALIBRATED_TARGETS = load_targets()
