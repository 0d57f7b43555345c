"""The live-tensor tracker: peak memory of the code run inside it (one training step), with a
breakdown by what the memory holds (SPEC §4), on any device; on CPU the only source.

A `TorchDispatchMode` sees every tensor an operator returns (forward, backward and optimizer ops
alike); each new storage is counted from the op that creates it until Python's weak reference to
it reports it freed (storages keep one Python object for their whole life, so the reference dies
with the memory). At the peak the live storages are sorted into:

- parameters / buffers: the model's (and the optimizer's) parameters and buffers;
- gradients: the `.grad` of those parameters (tagged by post-accumulate-grad hooks);
- optimizer_state: tensors in `optimizer.state` (Adam moments, step counters);
- activations: storages autograd saves for backward (tagged by a `saved_tensors_hooks` pack
  hook; this includes the inputs a non-reentrant checkpoint keeps for recomputation, while
  activations recomputed during backward count as temporaries);
- temporaries: everything else (outputs awaiting use, backward buffers, optimizer scratch);
- communication_buffers: a `DistributedDataParallel` module's gradient buckets (when the tracked
  model is the DDP wrapper): flat buffers its reducer allocates in C++ when it is built, where the
  gradients are copied for the all-reduce -- one more copy of the gradients, held for the module's
  whole life and never an op's output, so counted from the bucket sizes DDP reports (not with
  `gradient_as_bucket_view=True`: the gradients are then views of the buckets, counted as
  gradients once they point there).

Memory that exists before the step and is only read by it (a data set tensor a batch is sliced
from) is not counted unless autograd saves it; allocations inside a kernel that never surface
as an op's output, and `UntypedStorage.resize_` called directly, are not seen.

Also here, the byte counts the tracker and the planner's memory model share: `storage_bytes`,
`state_bytes` (what a model and optimizer hold between steps), `ddp_bucket_bytes`.
"""
from __future__ import annotations

import threading
import weakref
from functools import partial

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

CATEGORIES = ("parameters", "buffers", "gradients", "optimizer_state", "activations", "temporaries",
              "communication_buffers")
# A storage keeps its strongest role: a weight that autograd saves for backward stays a parameter.
_RANK = {"parameters": 5, "buffers": 4, "optimizer_state": 3, "gradients": 2, "activations": 1, "temporaries": 0,
         "communication_buffers": 0}
_BUCKETS_KEY = -1  # the record of DDP's buckets (the other records are keyed by id(storage), never negative)

SOURCE_CUDA = "cuda_max_memory_allocated"
SOURCE_TRACKER = "cpu_live_tensor_tracker"
BREAKDOWN_SOURCE = "live_tensor_tracker"


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (views and tied weights counted once)."""
    storages = {}
    for tensor in tensors:
        storage = _storage_of(tensor)
        if storage is not None:
            storages[(storage.device, storage.data_ptr())] = storage.nbytes()
    return sum(storages.values())


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> int:
    """Bytes a model and its optimizer hold between steps: parameters, buffers, gradients and
    optimizer state, each storage counted once, and a DDP wrapper's gradient buckets. What several
    models built side by side hold together, apart from the activations and temporaries each step
    allocates and frees."""
    return storage_bytes(tensor for _, tensor in _state_tensors(model, optimizer)) + ddp_bucket_bytes(model)


def ddp_bucket_bytes(model) -> int:
    """Bytes of a `DistributedDataParallel` module's gradient buckets, as its reducer reports them
    (every trainable parameter's gradient once, in buckets of up to `bucket_cap_mb`); 0 for any
    other model, and with `gradient_as_bucket_view=True` (the gradients are the buckets)."""
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return 0
    if getattr(model, "gradient_as_bucket_view", False):
        return 0
    try:
        sizes = str(model._get_ddp_logging_data()["bucket_sizes"])
        return sum(int(size) for size in sizes.split(",") if size.strip())
    except (AttributeError, KeyError, ValueError, RuntimeError):  # the reducer's report is not public API
        return storage_bytes(p for p in model.parameters() if p.requires_grad)


def _parameters_of(model, optimizer) -> list[torch.Tensor]:
    params = list(model.parameters()) if model is not None else []
    if optimizer is not None:
        params += [p for group in optimizer.param_groups for p in group["params"]]
    return list({id(p): p for p in params}.values())


def _state_tensors(model, optimizer):
    """(category, tensor) for what a model and optimizer hold between steps."""
    if model is not None:
        yield from (("parameters", t) for t in model.parameters())
        yield from (("buffers", t) for t in model.buffers())
    for parameter in _parameters_of(model, optimizer):
        yield "parameters", parameter
        if parameter.grad is not None:
            yield "gradients", parameter.grad
    if optimizer is not None:
        yield from (("optimizer_state", v) for v in optimizer_state_tensors(optimizer))


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The tensors in `optimizer.state` (Adam's moments, step counters)."""
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


class _Storage:
    __slots__ = ("nbytes", "category")

    def __init__(self, nbytes: int, category: str):
        self.nbytes = nbytes
        self.category = category


def _storage_of(value):
    """The untyped storage behind a plain dense tensor, or None (meta, sparse, subclasses...)."""
    if not isinstance(value, torch.Tensor) or value.device.type == "meta":
        return None
    try:
        return value.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


class _StorageMode(TorchDispatchMode):
    def __init__(self, tracker: "MemoryTracker"):
        super().__init__()
        self.tracker = tracker

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.tracker._after_op((args, kwargs), out)
        return out


class MemoryTracker:
    """Peak memory of the code run inside it (one training step), with a breakdown.

        with MemoryTracker(model, optimizer) as tracker:
            loss_fn(model(x), y).backward(); optimizer.step()
        tracker.peak_bytes, tracker.breakdown_at_peak, tracker.source

    Attributes after exit: `peak_bytes` (CUDA allocator peak on CUDA, tracker peak elsewhere),
    `peak_reserved_bytes` (CUDA only, else None), `tracked_peak_bytes`, `breakdown_at_peak`
    (category -> bytes; sums to `tracked_peak_bytes`; "communication_buffers" only for a DDP
    module), `max_bytes_by_category` (each category's own maximum during the step: e.g. all saved
    activations at the end of the forward pass), `source` and `breakdown_source`. On CUDA the
    allocator's peak statistics are reset on entry (`reset_cuda_peak=False` leaves them alone).

    `breakdown=False` (CUDA only): the allocator's peaks alone, no hooks and no dispatch mode --
    for a step replayed in CUDA graphs (`compile_mode="reduce-overhead"`), which the breakdown's
    dispatch mode, active for one step, leaves replaying at eager speed afterwards (measured on an
    H200: 2.0x eager before such a step, 0.91x after). `breakdown_at_peak` is then empty.
    """

    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 device: torch.device | str | None = None, *, reset_cuda_peak: bool = True, breakdown: bool = True):
        if device is None:
            first = next(iter(model.parameters()), None) if model is not None else None
            device = first.device if first is not None else torch.device("cpu")
        self.device = torch.device(device)
        if not breakdown and self.device.type != "cuda":
            raise ValueError(f"breakdown=False on {self.device}: allowed on CUDA only (elsewhere the live-tensor "
                             "breakdown is the only reading of the peak)")
        self.breakdown = breakdown
        self.model = model
        self.optimizer = optimizer
        self.reset_cuda_peak = reset_cuda_peak
        self.source = SOURCE_CUDA if self.device.type == "cuda" else SOURCE_TRACKER
        self.breakdown_source = BREAKDOWN_SOURCE
        self.peak_bytes: int | None = None
        self.peak_reserved_bytes: int | None = None
        self.cuda_peak_before_bytes: int | None = None  # allocator peak before this tracker reset it
        self.tracked_peak_bytes = 0
        self.current_bytes = 0
        self.breakdown_at_peak: dict[str, int] = {}
        self.max_bytes_by_category: dict[str, int] = {c: 0 for c in CATEGORIES}
        self._bytes_by_category = {c: 0 for c in CATEGORIES}
        self._records: dict[int, _Storage] = {}
        self._weakrefs: dict[int, weakref.ref] = {}
        self._peak_records: list[_Storage] = []
        self._lock = threading.RLock()
        self._open = False
        self._handles: list = []
        self._contexts: list = []
        self._keys_before_forward: set[int] = set()

    # ------------------------------------------------------------------ bookkeeping
    def _track(self, storage, category: str) -> _Storage | None:
        key = id(storage)
        record = self._records.get(key)
        if record is None:
            nbytes = storage.nbytes()
            if nbytes == 0:
                return None
            record = _Storage(nbytes, category)
            self._records[key] = record
            self._weakrefs[key] = weakref.ref(storage, partial(self._on_free, key))
            self._add(record.category, nbytes)
        elif _RANK[category] > _RANK[record.category]:
            self._retag(record, category)
        return record

    def _retag(self, record: _Storage, category: str) -> None:
        self._add(record.category, -record.nbytes)
        record.category = category
        self._add(category, record.nbytes)

    def _add(self, category: str, nbytes: int) -> None:
        self._bytes_by_category[category] += nbytes
        self.current_bytes += nbytes
        if self._bytes_by_category[category] > self.max_bytes_by_category[category]:
            self.max_bytes_by_category[category] = self._bytes_by_category[category]

    def _on_free(self, key: int, _ref) -> None:
        with self._lock:
            if not self._open:
                return
            record = self._records.pop(key, None)
            self._weakrefs.pop(key, None)
            if record is not None:
                self._add(record.category, -record.nbytes)

    def _note_peak(self) -> None:
        if self.current_bytes > self.tracked_peak_bytes:
            self.tracked_peak_bytes = self.current_bytes
            # Keep the records (not just the sums) so that roles assigned later in the step
            # (optimizer state created by the first step) still classify the peak correctly.
            self._peak_records = list(self._records.values())

    def _tag(self, tensors, category: str) -> None:
        for tensor in tensors:
            storage = _storage_of(tensor)
            if storage is not None:
                self._track(storage, category)

    def _tag_state(self) -> None:
        for category, tensor in _state_tensors(self.model, self.optimizer):
            self._tag([tensor], category)

    def _parameters(self) -> list[torch.Tensor]:
        return _parameters_of(self.model, self.optimizer)

    # ------------------------------------------------------------------ hooks
    def _after_op(self, inputs, outputs) -> None:
        with self._lock:
            input_storages = {id(s) for s in map(_storage_of, tree_leaves(inputs)) if s is not None}
            for value in tree_leaves(outputs):
                storage = _storage_of(value)
                if storage is None:
                    continue
                record = self._records.get(id(storage))
                if record is not None:
                    if storage.nbytes() != record.nbytes:  # an out= op resized a tracked storage
                        self._add(record.category, storage.nbytes() - record.nbytes)
                        record.nbytes = storage.nbytes()
                elif id(storage) not in input_storages:
                    # a storage an op created (views and in-place results alias an input's storage)
                    self._track(storage, "temporaries")
            self._note_peak()

    def _pack(self, tensor):
        with self._lock:
            storage = _storage_of(tensor)
            if storage is not None:
                self._track(storage, "activations")
                self._note_peak()
        return tensor

    def _grad_ready(self, parameter) -> None:
        with self._lock:
            if parameter.grad is not None:
                self._tag([parameter.grad], "gradients")

    def _before_ddp_forward(self, _module, _args) -> None:
        with self._lock:
            if _BUCKETS_KEY in self._records:  # the rebuild still to come
                self._keys_before_forward = set(self._records)

    def _after_ddp_pre_forward(self, _module, _args) -> None:
        """DDP rebuilds its buckets once, in the order the gradients arrived, at the first forward
        after the first synchronized backward: the new buckets are ops' outputs (tracked), the old
        ones go unseen. From then on the new ones are the communication buffers."""
        with self._lock:
            if not self.model._has_rebuilt_buckets or _BUCKETS_KEY not in self._records:
                return
            for key in set(self._records) - self._keys_before_forward:
                if self._records[key].category == "temporaries":
                    self._retag(self._records[key], "communication_buffers")
            self._add("communication_buffers", -self._records.pop(_BUCKETS_KEY).nbytes)

    def _optimizer_stepped(self, optimizer, args, kwargs) -> None:
        with self._lock:
            self._tag_state()

    # ------------------------------------------------------------------ context
    def __enter__(self) -> "MemoryTracker":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.cuda_peak_before_bytes = torch.cuda.max_memory_allocated(self.device)
            if self.reset_cuda_peak:
                torch.cuda.reset_peak_memory_stats(self.device)
        if not self.breakdown:
            return self
        with self._lock:
            self._open = True
            self._tag_state()
            buckets = ddp_bucket_bytes(self.model)
            if buckets:  # alive before the step and after it, never an op's output
                self._records[_BUCKETS_KEY] = _Storage(buckets, "communication_buffers")
                self._add("communication_buffers", buckets)
            self._note_peak()
        if buckets and not getattr(self.model, "_has_rebuilt_buckets", True):
            self._handles += [self.model.register_forward_pre_hook(self._before_ddp_forward),
                              self.model.module.register_forward_pre_hook(self._after_ddp_pre_forward)]
        for parameter in self._parameters():
            if parameter.requires_grad:
                self._handles.append(parameter.register_post_accumulate_grad_hook(self._grad_ready))
        if self.optimizer is not None:
            self._handles.append(self.optimizer.register_step_post_hook(self._optimizer_stepped))
        self._contexts = [torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor),
                          _StorageMode(self)]
        for context in self._contexts:
            context.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.breakdown:
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device)
            self.peak_reserved_bytes = torch.cuda.max_memory_reserved(self.device)
            return
        for context in reversed(self._contexts):
            context.__exit__(exc_type, exc, tb)
        self._contexts = []
        for handle in self._handles:
            handle.remove()
        self._handles = []
        with self._lock:
            self._tag_state()  # roles known only at the end (state created by the first step)
            self._open = False
            self.breakdown_at_peak = {c: 0 for c in CATEGORIES}
            for record in self._peak_records:
                self.breakdown_at_peak[record.category] += record.nbytes
            if not self.max_bytes_by_category["communication_buffers"]:  # no DDP: the breakdown it always had
                del self.breakdown_at_peak["communication_buffers"]
            self._records.clear()
            self._weakrefs.clear()
            self._peak_records = []
        self.peak_bytes = self.tracked_peak_bytes
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device)
            self.peak_reserved_bytes = torch.cuda.max_memory_reserved(self.device)

    def to_dict(self) -> dict:
        return dict(
            peak_bytes=self.peak_bytes, peak_reserved_bytes=self.peak_reserved_bytes, source=self.source,
            tracked_peak_bytes=self.tracked_peak_bytes, breakdown_at_peak=dict(self.breakdown_at_peak),
            max_bytes_by_category=dict(self.max_bytes_by_category), breakdown_source=self.breakdown_source,
        )
