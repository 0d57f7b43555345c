"""trainopt_core: the training-compute optimizations of paper §III for an existing PyTorch loop.

    from trainopt_core import OptimizationConfig, prepare
    engine = prepare(model, optimizer, OptimizationConfig.optimized(),
                     total_samples=..., micro_batch_size=...)
"""
from .config import ABLATION_LADDER, OptimizationConfig, leave_one_out
from .engine import TrainingEngine, prepare

__version__ = "0.1.0"

__all__ = [
    "ABLATION_LADDER",
    "OptimizationConfig",
    "TrainingEngine",
    "apply_activation_checkpointing",
    "leave_one_out",
    "prepare",
]


def __getattr__(name):
    # checkpointing imports torchvision/transformers adapters lazily; keep `import trainopt_core` light
    if name == "apply_activation_checkpointing":
        from .checkpointing import apply_activation_checkpointing

        return apply_activation_checkpointing
    raise AttributeError(f"module 'trainopt_core' has no attribute {name!r}")
