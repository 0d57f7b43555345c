"""DeepSpeed behind the engine interface: ZeRO stage 0/1/2 driven by the same OptimizationConfig.

    engine = trainopt_core.prepare(model, optimizer, config, backend="deepspeed",
                                   total_samples=..., micro_batch_size=32)
    model = engine.model                     # the DeepSpeed engine: the forward runs through it
    for x, y in batches:
        with engine.autocast():
            loss = F.cross_entropy(model(x), y)
        engine.backward(loss, num_items=len(y))
        engine.step()

The configuration becomes a DeepSpeed config (`ds_config.deepspeed_config`): micro-batch size, k as
gradient_accumulation_steps, fp16 dynamic loss scaling or bf16, clipping τ (eq. 12) and the ZeRO
stage; the user's optimizer is wrapped (ZeRO-1 partitions its state, ZeRO-2 also the gradients).
On CPU DeepSpeed runs with DS_ACCELERATOR=cpu over gloo. Its CPU backend would compile a
shared-memory all-reduce with gcc when it starts (a minute or more the first time, a load in every
process after); only DeepSpeed's inference all-reduce uses it, so it is left out (`_skip_cpu_op`):
training reduces through torch.distributed either way.

The accumulation boundary is ours, not DeepSpeed's: DeepSpeed counts micro-steps itself and
steps when (micro_steps + 1) % gradient_accumulation_steps == 0, which stops matching the
effective batch as soon as adaptive accumulation changes k mid-run. So every backward first
tells DeepSpeed whether it completes the effective batch (`set_gradient_accumulation_boundary`),
`ds_engine.step()` runs after every micro-batch (it updates only at that boundary), and a new k
reaches DeepSpeed (`set_train_batch_size`) only between effective batches.

Item weighting (eq. 4 with unequal micro-batches): DeepSpeed's loss division by k is replaced by
weighting micro-batch j's mean loss by n_j / (k · n̄), n̄ the mean items per micro-batch seen
before this step. The step's gradient is then Σ_j n_j g_j / (k n̄): the item-weighted mean
direction, exact in size when the micro-batches hold n̄ items on average (always with equal
micro-batches). It cannot be corrected afterwards as the torch-native engine does, because
ZeRO-2 reduces and partitions each micro-batch's gradient during its backward; the factor
N / (k n̄) of the last step is `engine.item_weight_ratio` (1.0 = exact). Across replicas
DeepSpeed averages the per-replica gradients (equal weight per replica).
"""
from __future__ import annotations


import math
import os

import torch

from .. import precision as mp
from .._caller import warn_at_caller
from ..config import OptimizationConfig
from ..engine import TrainingEngine, check_loss, item_count
from ..engine_arguments import EngineArguments
from ..schedule import clip_gradients
from .ds_config import DEEPSPEED_MIN_LOSS_SCALE, deepspeed_config, zero_partitioning
from .process_group import cleanup, find_free_port

CPU_OP = "deepspeed_shm_comm"  # the op DeepSpeed's CPU backend would compile with gcc when it starts


def _skip_cpu_op() -> None:
    """Marks DeepSpeed's shared-memory all-reduce op unusable, so that its CPU backend starts
    without compiling or loading it. The op serves only `inference_all_reduce`; gradients are
    reduced through torch.distributed with or without it. `deepspeed.ops.__compatible_ops__` is
    the table the backend consults, probed once per process and kept for such edits."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__[CPU_OP] = False


def _import_deepspeed(device: torch.device):
    if device.type == "cpu":
        # DeepSpeed picks its accelerator once, at first use; on a CUDA machine it would pick
        # CUDA even for a CPU run.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import deepspeed
        from deepspeed.accelerator import get_accelerator
    except ImportError as err:
        raise ImportError("backend='deepspeed' needs DeepSpeed: pip install 'trainopt[deepspeed]'") from err
    if device.type == "cpu":
        _skip_cpu_op()
    accelerator = get_accelerator()
    if accelerator.device_name() != device.type:
        raise ValueError(
            f"device={str(device)!r} is invalid: DeepSpeed's accelerator here is "
            f"{accelerator.device_name()!r} (DS_ACCELERATOR={os.environ.get('DS_ACCELERATOR')!r}); "
            "allowed a device of that type"
        )
    return deepspeed, accelerator


class DeepSpeedTrainingEngine(TrainingEngine):
    """The TrainingEngine interface over a DeepSpeed engine (build it with `prepare(backend="deepspeed")`).

    `model` is the DeepSpeed engine (call it for the forward), `module` the user's module,
    `ds_engine` the DeepSpeed engine, `ds_config` the config it was built from, and
    `zero_bucket_sizes` the ZeRO reduce/allgather bucket sizes in elements
    ({"reduce_bucket_size": n, "allgather_bucket_size": n}; None at stage 0, which has none).
    In fp16/bf16 DeepSpeed casts the parameters only; the BatchNorm running statistics are cast
    to their weights' dtype as well (`batch_norm_stats_cast`: how many modules), or batch_norm
    refuses the mix.
    fp16: a loss scale collapsed at DeepSpeed's floor (`DEEPSPEED_MIN_LOSS_SCALE`) raises
    RuntimeError as in the torch-native engine.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, config: OptimizationConfig,
                 arguments: EngineArguments):
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            raise ValueError(
                "model is DistributedDataParallel-wrapped: with backend='deepspeed' pass the plain module"
            )
        device, world_size, micro_batch_size = arguments.device, arguments.world_size, arguments.micro_batch_size
        deepspeed, accelerator = _import_deepspeed(device)
        for precision, supported in (("fp16", accelerator.is_fp16_supported), ("bf16", accelerator.is_bf16_supported)):
            if config.precision == precision and not supported():
                raise ValueError(
                    f"OptimizationConfig.precision={precision!r} is invalid with backend='deepspeed' here: "
                    f"DeepSpeed's {accelerator.device_name()} accelerator does not support it on this "
                    "machine; allowed 'fp32' or 'bf16' (CPUs without AVX512-FP16 have no fp16)"
                )
        self._owns_process_group = _ensure_process_group(device, world_size)
        try:
            # The shared engine state: validation, LR schedule, base LRs, noise-monitor hooks. The
            # monitor's tensor hooks stay on the parameter objects when DeepSpeed flattens or casts
            # them, and fire before DeepSpeed's reduction hooks: micro-batch norms are local (eq. 7).
            super().__init__(model, optimizer, config, arguments)
            self.scaler = None  # DeepSpeed's own dynamic loss scaler runs fp16
            self.module = model
            num_parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
            self.ds_config = deepspeed_config(config, micro_batch_size=micro_batch_size, k=self.k,
                                              num_parameters=num_parameters)
            zero = self.ds_config["zero_optimization"]
            if "reduce_bucket_size" in zero:
                self.zero_bucket_sizes = {key: zero[key] for key in ("reduce_bucket_size", "allgather_bucket_size")}
            self.ds_engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=self.ds_config)
            self.batch_norm_stats_cast = _match_batch_norm_stats_to_weights(model)
            self.model = self.ds_engine
            # DeepSpeed's forward arms its backward (ZeRO's per-step hook state and the output hooks
            # that run its backward prologue); a forward on the bare module would skip that.
            self._forward_seen = False
            self._forward_hook = self.ds_engine.register_forward_pre_hook(self._note_forward)
        except BaseException:
            if self._owns_process_group:  # made here for one process: do not leave it behind
                torch.distributed.destroy_process_group()
            raise
        if self.ds_engine.dp_world_size != world_size:
            raise ValueError(
                f"world_size={world_size!r} is invalid: DeepSpeed runs data parallel over "
                f"{self.ds_engine.dp_world_size} processes; allowed {self.ds_engine.dp_world_size}"
            )
        # stage 0 in fp32 steps the torch optimizer directly, which keeps no gradient norm
        self._norm_from_grads = not hasattr(self.ds_engine.optimizer, "_global_grad_norm")
        self._loss_scale = self._current_loss_scale()
        self._items_seen = 0.0
        self._micro_batches_seen = 0
        self._mean_items = 0.0
        self._ds_step_due = False
        self.item_weight_ratio = 1.0

    # ------------------------------------------------------------------ k reaches DeepSpeed
    @property
    def k(self) -> int:
        return self._k

    @k.setter
    def k(self, value: int) -> None:
        if getattr(self, "_micro_index", 0) != 0:
            raise ValueError(f"k={value!r} set mid-way through an effective batch: allowed only at a boundary")
        TrainingEngine.k.fset(self, value)  # checks it
        if hasattr(self, "ds_engine"):
            self.ds_engine.set_train_batch_size(self.micro_batch_size * value * self.ds_engine.dp_world_size)

    # ------------------------------------------------------------------ loop API
    def autocast(self):
        """Context for the forward: DeepSpeed holds the module in fp16/bf16 and autocast lets
        fp32 inputs meet those weights (matmuls in the low precision, reductions in fp32)."""
        return mp.autocast(self.device, self.config.precision, tf32=self.config.tf32,
                           sdpa_backend=self.config.sdpa_backend)

    def backward(
        self, loss: torch.Tensor, num_items: float | None = None, *, num_samples: int | None = None
    ) -> None:
        """Backward of one micro-batch through DeepSpeed; `loss` is the mean over `num_items` items."""
        check_loss(loss)
        items = item_count(num_items, self.micro_batch_size)
        samples = self._sample_count(num_samples)
        if not self._forward_seen:
            raise ValueError(
                "backward() without a forward through engine.model: with backend='deepspeed' run the "
                "forward as engine.model(inputs) (the DeepSpeed engine), not on the module itself"
            )
        self._forward_seen = False
        if self._ds_step_due:  # a loop that calls engine.step() only after the k-th backward
            if self._micro_index >= self.k:
                raise ValueError("backward() after a completed effective batch: call engine.step() first")
            self.ds_engine.step()
        if self._micro_index == 0:
            self._mean_items = self._items_seen / self._micro_batches_seen if self._micro_batches_seen else items
        weight = items / (self.k * self._mean_items)
        self.ds_engine.set_gradient_accumulation_boundary(self.is_accumulation_boundary)
        if self.monitor is not None:
            self.monitor.begin_micro_batch(self.device, 1.0 / (weight * self._loss_scale), items)
        if self.config.precision != "fp16":  # on the device: one sync per step, at the boundary
            self._note_loss(loss)
        with mp.kernel_settings(tf32=self.config.tf32, sdpa_backend=self.config.sdpa_backend):
            self.ds_engine.backward(loss * weight, scale_wrt_gas=False)
        self._ds_step_due = True
        self._micro_index += 1
        self._step_items += items
        self._step_samples += samples

    def step(self) -> bool:
        """`ds_engine.step()` after every micro-batch; at the boundary first the LR (eqs. 10-11)
        and afterwards loss scale, skipped steps, gradient norm and the next k are read back."""
        if not self._ds_step_due:
            return False
        if self._micro_index < self.k:
            self.ds_engine.step()  # not a boundary: DeepSpeed only counts the micro-step
            self._ds_step_due = False
            return False
        if self._resumed_without_position():
            self._warn_resumed_without_position()
        if not self._losses_were_finite():
            self._stop_nonfinite_before_step()
        step_samples = self._replica_sum(self._step_samples)
        self.effective_batch_size = step_samples
        self._apply_lr(self.samples_consumed + step_samples, step_samples)
        own_norm = clip_gradients(self.module.parameters(), None) if self._norm_from_grads else None
        # gradients on the module (no ZeRO partitioning: stage 0), read before the step: a
        # non-finite one is dropped, so that DeepSpeed's optimizer steps over no gradient and the
        # weights and optimizer state stay as they were -- the step skipped, as the torch engine does
        withheld = (self.config.precision != "fp16" and own_norm is not None
                    and not math.isfinite(float(own_norm)))
        if withheld:
            for parameter in self.module.parameters():
                parameter.grad = None
        scale_before = self._loss_scale
        stepped = self._deepspeed_step() and not withheld
        norm = self.ds_engine.get_global_grad_norm() if own_norm is None else own_norm
        self._grad_norm = None if norm is None else float(norm)  # pre-clip, unscaled
        self._loss_scale = self._current_loss_scale()
        self._count_deepspeed_step(stepped, step_samples, withheld)
        self._stop_where_deepspeed_may_not_go_on(stepped, withheld, scale_before)
        return stepped

    def _deepspeed_step(self) -> bool:
        """DeepSpeed's optimizer step at the boundary; whether DeepSpeed applied it. DeepSpeed counts
        a step as skipped from its own overflow check of the gradients (inf/nan), the same test as
        GradScaler's -- not from the scale's movement."""
        skipped_before = self.ds_engine.skipped_steps
        scale_before = self._loss_scale
        try:
            self.ds_engine.step()
        except Exception as error:  # ZeRO's loss scaler raises a bare Exception at its floor
            if "loss scale already at minimum" not in str(error):
                raise
            self._ds_step_due = False
            self.skipped_steps += 1
            self.consecutive_skipped_steps += 1
            self.optimizer_steps += 1
            raise self._loss_scale_collapse(scale_before) from error
        self._ds_step_due = False
        return self.ds_engine.skipped_steps == skipped_before

    def _count_deepspeed_step(self, stepped: bool, step_samples: int, withheld: bool) -> None:
        """After a boundary step, taken or skipped: the counters, the item weighting's running mean, the next k."""
        if stepped:
            self.consecutive_skipped_steps = 0
        else:
            self.skipped_steps += 1
            self.consecutive_skipped_steps += 1
        self.item_weight_ratio = self._step_items / (self._micro_index * self._mean_items)
        self._items_seen += self._step_items
        self._micro_batches_seen += self._micro_index
        self.samples_consumed += step_samples
        self.optimizer_steps += 1
        self._micro_index = 0
        self._step_items = 0.0
        self._step_samples = 0
        if self.monitor is not None:
            if self._grad_norm is None or withheld or not math.isfinite(self._grad_norm):
                self.monitor.finish_step(math.nan, [])
            else:
                self._update_k()  # eq. 6 on identical gathered numbers; the k setter tells DeepSpeed

    def _stop_where_deepspeed_may_not_go_on(self, stepped: bool, withheld: bool, scale_before: float) -> None:
        """Raise after a boundary step where the run may not go on: too many non-finite steps in a
        row, a non-finite step DeepSpeed applied, or fp16's loss scale collapsed at DeepSpeed's floor."""
        # bf16/fp32 at ZeRO-1/2: DeepSpeed's ZeRO optimizer finds the non-finite norm itself and
        # skips the step (its weights untouched: DeepSpeed 0.19); counted as the torch engine does
        nonfinite_norm = (self.config.precision != "fp16" and not withheld and self._grad_norm is not None
                          and not math.isfinite(self._grad_norm))
        skipped_by_deepspeed = nonfinite_norm and not stepped
        if (withheld or skipped_by_deepspeed) and self.consecutive_skipped_steps >= self.config.max_nonfinite_steps:
            raise mp.nonfinite_steps_error(
                step=self.optimizer_steps, grad_norm=self._grad_norm, consecutive=self.consecutive_skipped_steps,
                allowed=self.config.max_nonfinite_steps, precision=self.config.precision,
                backend=f"DeepSpeed ZeRO-{self.config.zero_stage}, the steps skipped before they reached the weights")
        if nonfinite_norm and stepped:  # DeepSpeed applied a step whose norm was not finite
            raise mp.nonfinite_steps_error(
                step=self.optimizer_steps, grad_norm=self._grad_norm, consecutive=1,
                allowed=0, precision=self.config.precision,
                backend="DeepSpeed, which applied the step: it skips non-finite steps only in fp16")
        if self.config.precision == "fp16":
            # DeepSpeed clamps the scale at its floor: a step skipped there is the collapse
            # (ZeRO-1/2 raise it above; stage 0 would skip at the floor for ever).
            if not stepped and scale_before <= DEEPSPEED_MIN_LOSS_SCALE:
                raise self._loss_scale_collapse(self._loss_scale)
            mp.check_loss_scale(self._loss_scale, consecutive_skips=self.consecutive_skipped_steps,
                                min_loss_scale=DEEPSPEED_MIN_LOSS_SCALE, backend="DeepSpeed")

    def _stop_nonfinite_before_step(self) -> None:
        """bf16/fp32 under DeepSpeed: its optimizers apply whatever gradient they hold (only its
        fp16 loss scaler skips), so a non-finite loss stops the run before the step reaches the
        weights -- DeepSpeed's weights and optimizer state stay finite for a checkpoint."""
        raise mp.NonFiniteTrainingError(
            f"non-finite loss at optimizer step {self.optimizer_steps + 1} in {self.config.precision} (DeepSpeed "
            f"ZeRO-{self.config.zero_stage}): stopped before its optimizer step, whatever its gradients hold, since "
            "DeepSpeed applies every bf16/fp32 step it is given (only its fp16 loss scaler skips one); "
            "OptimizationConfig.max_nonfinite_steps, the steps the torch engine may skip in a row, does not apply "
            f"here. {mp.NON_FINITE_CAUSES}.")

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """The engine state of `TrainingEngine.state_dict` plus the item weighting's running
        mean; model, ZeRO-partitioned optimizer state and DeepSpeed's loss scaler are saved by
        DeepSpeed itself: use `save_checkpoint` / `load_checkpoint`."""
        if self._ds_step_due:
            raise RuntimeError("engine.state_dict() before engine.step() of the last backward: call step() first")
        state = super().state_dict()
        state["deepspeed"] = {"items_seen": self._items_seen, "micro_batches_seen": self._micro_batches_seen,
                              "mean_items": self._mean_items, "item_weight_ratio": self.item_weight_ratio}
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        extra = state.get("deepspeed")
        if extra is None:
            raise ValueError("engine state has no 'deepspeed' entry: it was saved by the torch-native engine")
        self._items_seen, self._micro_batches_seen = extra["items_seen"], extra["micro_batches_seen"]
        self._mean_items, self.item_weight_ratio = extra["mean_items"], extra["item_weight_ratio"]

    def save_checkpoint(self, directory: str | os.PathLike, tag: str | None = None,
                        client_state: dict | None = None) -> None:
        """DeepSpeed's checkpoint (`ds_engine.save_checkpoint`: module, ZeRO-partitioned optimizer
        state, loss scaler) with this engine's `state_dict()` in its client state. Every rank calls it."""
        client = dict(client_state or {}, trainopt_engine=self.state_dict())
        self.ds_engine.save_checkpoint(os.fspath(directory), tag=tag, client_state=client)

    def load_checkpoint(self, directory: str | os.PathLike, tag: str | None = None) -> dict:
        """Loads a `save_checkpoint` checkpoint into this engine (built as the saving one was);
        returns the rest of the client state. Every rank calls it."""
        path, client = self.ds_engine.load_checkpoint(os.fspath(directory), tag=tag)
        if path is None or client is None or "trainopt_engine" not in client:
            raise FileNotFoundError(f"no trainopt DeepSpeed checkpoint (tag {tag!r}) under {os.fspath(directory)!r}")
        client = dict(client)
        self.load_state_dict(client.pop("trainopt_engine"))
        return client

    # ------------------------------------------------------------------ internals
    def _holds_resumed_state(self) -> bool:
        # DeepSpeed's own load_checkpoint restores its step count and the optimizer, not this engine
        return super()._holds_resumed_state() or getattr(self.ds_engine, "global_steps", 0) > 0

    def _warn_resumed_without_position(self) -> None:
        warn_at_caller(
            f"DeepSpeed was resumed (its step count {getattr(self.ds_engine, 'global_steps', 0)}, or the optimizer "
            "holds state) but the engine starts at step 0: its LR schedule restarts its warmup and its sample count "
            "from 0. Resume through engine.load_checkpoint(directory), which restores both (engine.save_checkpoint "
            "saved them), not engine.ds_engine.load_checkpoint; for a checkpoint without engine state, call "
            "engine.start_at(steps=...) before the first step.")

    def _zero_partitioning(self, zero_stage: int, world_size: int) -> str:
        return zero_partitioning(zero_stage, world_size)

    def _note_forward(self, module, inputs) -> None:
        self._forward_seen = True

    def _replica_sum(self, value: int) -> int:
        # the effective batch (and so the LR of eq. 11) must be the same number on every rank
        if self.world_size == 1:
            return value
        total = torch.tensor([float(value)], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(total)
        return int(round(total.item()))

    def _loss_scale_collapse(self, loss_scale: float) -> RuntimeError:
        return mp.loss_scale_collapse_error(
            consecutive_skips=self.consecutive_skipped_steps, loss_scale=loss_scale,
            min_loss_scale=DEEPSPEED_MIN_LOSS_SCALE, backend="DeepSpeed",
            detail=" (its floor, fp16.min_loss_scale: the step was skipped there again)")

    def _current_loss_scale(self) -> float:
        if self.config.precision != "fp16":
            return 1.0
        optimizer = self.ds_engine.optimizer
        # the ZeRO and fp16 optimizers keep the dynamic scale under one of these names
        scale_config = getattr(optimizer, "loss_scale_config", None)
        scale = getattr(scale_config, "cur_scale", None) or getattr(optimizer, "cur_scale", None)
        return float(scale if scale is not None else optimizer.loss_scale)

    def close(self) -> None:
        """Removes the hooks, releases DeepSpeed's engine and a process group made for one process."""
        super().close()
        self._forward_hook.remove()
        self.ds_engine.destroy()
        if self._owns_process_group and torch.distributed.is_initialized():
            # gloo's workers given time to drop the last works (see process_group.cleanup); the
            # group destroyed through deepspeed.comm, which also drops DeepSpeed's cached groups
            # (its clone of the world group among them): destroyed behind its back, a later engine
            # in this process found them unregistered ("Group ... is not registered")
            from deepspeed import comm as ds_comm
            cleanup(destroy=ds_comm.destroy_process_group)
            self._owns_process_group = False


def _match_batch_norm_stats_to_weights(model: torch.nn.Module) -> int:
    """Hold each BatchNorm's running statistics in its weights' dtype; returns how many modules changed.

    DeepSpeed's fp16/bf16 casts parameters but keeps buffers in their dtype (its
    data_types.buffer_dtype would cast every buffer of the model). A BatchNorm then holds bf16
    weights beside fp32 running statistics, which torch's batch_norm refuses ("expected scalar
    type BFloat16 but found Float") in the first training forward and in evaluation. Casting
    the statistics is what `module.bfloat16()` does to a whole torch module.
    """
    changed = 0
    for module in model.modules():
        if not isinstance(module, torch.nn.modules.batchnorm._NormBase) or module.weight is None:
            continue
        stats = [name for name in ("running_mean", "running_var")
                 if getattr(module, name, None) is not None and getattr(module, name).dtype != module.weight.dtype]
        for name in stats:
            getattr(module, name).data = getattr(module, name).data.to(module.weight.dtype)
        changed += bool(stats)
    return changed


def _ensure_process_group(device: torch.device, world_size: int) -> bool:
    """DeepSpeed needs a process group; one process without a launcher gets a 1-rank group
    (DeepSpeed would otherwise look for MPI). Returns whether it was created here."""
    dist = torch.distributed
    if dist.is_initialized():
        if dist.get_world_size() != world_size:
            raise ValueError(
                f"world_size={world_size!r} is invalid: the process group has {dist.get_world_size()} "
                f"processes; allowed {dist.get_world_size()}"
            )
        return False
    if world_size != 1:
        raise ValueError(
            f"world_size={world_size!r} needs an initialized process group: start the processes with "
            "trainopt_core.distributed (run_processes or the launch CLI) or torchrun"
        )
    os.environ.setdefault("LOCAL_RANK", "0")  # what a launcher sets; DeepSpeed requires it
    dist.init_process_group(
        backend="nccl" if device.type == "cuda" else "gloo",
        init_method=f"tcp://127.0.0.1:{find_free_port()}",
        rank=0,
        world_size=1,
    )
    return True
