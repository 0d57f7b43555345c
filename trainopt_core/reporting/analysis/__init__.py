"""Error analysis (paper §V-D): where the gains come from.

- `gains`: from run records -- by training phase, by component (leave-one-out), memory by
  category, the eq. 21 decomposition, the adaptive-k / gradient-noise trajectory.
- `profiling`: measured on a few training steps -- torch.profiler self time by operation
  category, activation bytes by module type, the recomputation overhead of checkpointing.
"""
from .gains import (
    PHASES, architecture_patterns, convergence_phases, component_contributions, eq21_decomposition, memory_by_category,
    noise_by_phase, phase_speedups, phase_times, time_at_samples, with_borrowed_clock,
)
from .profiling import (
    OP_CATEGORIES, OPTIMIZER_REGION, activation_bytes_by_module_type, measure_recompute_overhead, op_category,
    profile_operations, profile_training_steps, task_activation_memory, time_forward_backward_s,
)

__all__ = [
    "OPTIMIZER_REGION", "OP_CATEGORIES", "PHASES", "activation_bytes_by_module_type", "architecture_patterns", "convergence_phases",
    "component_contributions", "eq21_decomposition", "measure_recompute_overhead", "memory_by_category",
    "noise_by_phase", "op_category", "phase_speedups", "phase_times", "profile_operations",
    "profile_training_steps", "task_activation_memory", "time_at_samples", "time_forward_backward_s", "with_borrowed_clock",
]
