"""The training run: process group, model parts, resume, the step loop, checkpoints, the record.

Called by ``python -m reference_trainer --config run.yaml`` (under torchrun, or alone for one
process) after the config has been validated without torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import socket
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from reference_trainer import exchange, faults, profiler, record
from reference_trainer.board import Board, predicted
from reference_trainer.checkpoint import Checkpointer
from reference_trainer.config import ConfigError, RunConfig, config_to_dict
from reference_trainer.data import TokenSource, make_loader, split
from reference_trainer.parallel import build_mesh, parallelize
from reference_trainer.step import NonFiniteGuard, Stepper, build_optimizers, compute_dtype

EXIT_NONFINITE = 3


def _single_process_env() -> None:
    """Outside torchrun: a world of one on a free loopback port."""
    if "RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


class Log:
    """Messages and the progress bar, on rank 0 only."""

    def __init__(self, rank: int):
        self.on = rank == 0
        self.tty = sys.stdout.isatty()
        self._bar = False

    def __call__(self, msg: str) -> None:
        if self.on:
            self._end_bar()
            print(msg, flush=True)

    def progress(self, step: int, total: int, loss: float, tokens_per_s: float, extra: str = "") -> None:
        if not self.on:
            return
        width = 30
        done = int(width * step / total)
        line = (f"[{'#' * done}{'.' * (width - done)}] step {step}/{total}  loss {loss:.4f}  "
                f"{tokens_per_s:,.0f} tok/s{extra}")
        if self.tty:
            print("\r" + line, end="", flush=True)
            self._bar = step < total
            if not self._bar:
                print(flush=True)
        else:
            print(line, flush=True)

    def _end_bar(self) -> None:
        if self._bar:
            print(flush=True)
            self._bar = False


def run(configs: list[RunConfig]) -> int:
    """Train each config in turn in one process group (a sweep: the same world size for all,
    checked before); stop at the first that fails. Returns the exit code."""
    if "TORCHELASTIC_RUN_ID" in os.environ:  # under torchrun: die with it (ranks run in their own sessions)
        faults.die_with_parent()
    _single_process_env()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend="cpu:gloo,cuda:nccl" if cuda else "gloo", device_id=device if cuda else None)
    try:
        for config in configs:
            if cuda:
                tf32 = config.training.precision == "tf32"
                torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
                # The memory cap (profile.memory_fraction; the whole GPU when unset), over an empty
                # cache so that an earlier run of the sweep holds nothing above it.
                torch.cuda.empty_cache()
                torch.cuda.set_per_process_memory_fraction(config.profile.memory_fraction or 1.0, device)
                torch.cuda.reset_peak_memory_stats(device)
                torch.cuda.reset_accumulated_memory_stats(device)  # num_alloc_retries counts this run's only
            state: dict = {}
            try:
                rc = _train(config, device, state)
            except ConfigError as exc:  # only visible once running (e.g. a checkpoint of another layout)
                if refused_to_launcher(str(exc), dist.get_rank()):
                    return 0  # `planner run` says it in one line and exits 2
                rc = 2
            finally:
                for held in ("checkpoint_lock", "lock"):
                    if state.get(held) is not None:
                        state[held].release()
                # Drop everything that holds the process group before destroying it; gloo otherwise
                # aborts at interpreter exit ("terminate called without an active exception").
                state.clear()
                gc.collect()
            if rc != 0:
                return rc
        return 0
    finally:
        dist.destroy_process_group()


@dataclasses.dataclass(slots=True)
class _Loop:
    """What the step loop works with (built once per run by ``_train``), and what it measured."""

    config: RunConfig
    device: torch.device
    log: Log
    parts: object
    stepper: Stepper
    ckpt: Checkpointer
    guard: NonFiniteGuard
    batches: object
    pin: bool
    nvml: profiler.NvmlSampler
    csv: record.StepCsv | None
    board: object
    rows: list = dataclasses.field(default_factory=list)
    analyses: list = dataclasses.field(default_factory=list)
    status: str = "completed"
    message: str | None = None
    save_s: float = 0.0


def _train(config: RunConfig, device: torch.device, state: dict) -> int:
    # Benign here: the last stage's logits come out of tensor parallel's all-gather as a view,
    # and nothing modifies them in place (the loss reads them).
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor", category=UserWarning)
    tr = config.training
    faults.set_run(config.run_name)
    rank, world = dist.get_rank(), dist.get_world_size()
    log = Log(rank)
    wall0, cpu0 = time.perf_counter(), profiler.cpu_times()
    mesh, parts, stepper = _build(config, device, state, log, world)
    _lock_run(config, rank, log, state)
    ckpt = Checkpointer(config.checkpoint_dir, keep_last=config.checkpoint.keep_last,
                        layout=dict(config_to_dict(config)["layout"]), world_size=world)
    guard = NonFiniteGuard(tr.max_nonfinite_steps)
    start = _resume(config, ckpt, parts, stepper, guard, device, log) if config.checkpoint.auto_resume else 0
    missing = [start >= tr.steps and rank == 0 and not (config.run_dir / record.RECORD_JSON).exists()]
    dist.broadcast_object_list(missing, src=0)
    rebuild = missing[0]
    if rebuild:  # killed between the final checkpoint and record.json: write the record now
        log(f"run {config.run_name} complete but its record is missing: rebuilding it from {record.STEPS_CSV}")
    elif start >= tr.steps:
        log(f"run {config.run_name} already complete ({start}/{tr.steps} steps in its newest checkpoint); "
            "nothing to do")
        return 0
    csv = record.StepCsv(config.run_dir / record.STEPS_CSV, keep_until=start) if rank == 0 else None
    lost = _lost_steps(config, csv, start) if rebuild else []
    batches, pin = _loader(config, device, start, mesh.get_local_rank("dp"))
    state["loader"] = batches
    nvml = profiler.NvmlSampler(device, config.profile.nvml_interval_s)
    nvml_reason = nvml.start()
    if nvml_reason:
        log(nvml_reason)
    watched = config.profile.tensorboard or config.profile.metrics_port is not None
    board = _open_board(config, device, world, log) if rank == 0 and watched else None
    state["board"] = board
    loop = _Loop(config=config, device=device, log=log, parts=parts, stepper=stepper, ckpt=ckpt, guard=guard,
                 batches=batches, pin=pin, nvml=nvml, csv=csv, board=board)
    _run_steps(loop, start)
    nvml_summary = nvml.stop()
    if board is not None:
        board.close()
    if rebuild:  # no step ran in this launch: the CSV's (rank 0's) timers, and a status that says so
        loop.rows = csv.rows if csv is not None else []
        loop.status, loop.message = "completed_rebuilt", (f"record rebuilt on a restart from {record.STEPS_CSV} "
                                                          "(rank 0's timers; memory, traces and NVML not measured)")
        if lost:  # the CSV lost rows (cut by hand, or another run's folder): not a completed run
            loop.status = "rebuilt_partial"
            loop.message += f"; {record.STEPS_CSV} lacks {len(lost)} of {tr.steps} steps ({_ranges(lost)})"
    mine = _rank_summary(loop.rows, loop.analyses, config.profile.warmup_steps, device, mesh, wall0, cpu0,
                         nvml_summary, loop.save_s)
    _write_record(loop, mine, start=0 if rebuild else start, nvml_reason=nvml_reason)
    status = loop.status
    del batches, loop
    return EXIT_NONFINITE if status not in ("completed", "completed_rebuilt", "rebuilt_partial") else 0


def _lost_steps(config: RunConfig, csv, start: int) -> list[int]:
    """The steps 1..start that rank 0's steps.csv lacks (all ranks get the answer). None left:
    a ConfigError, since no record can be rebuilt from nothing."""
    answer = [None if csv is None else sorted(set(range(1, start + 1)) - {r["step"] for r in csv.rows})]
    dist.broadcast_object_list(answer, src=0)
    if len(answer[0]) == start:
        raise ConfigError(f"{config.checkpoint_dir} holds a finished run ({start}/{config.training.steps} steps) "
                          f"but {config.run_dir / record.STEPS_CSV} has no step rows, so no record can be rebuilt; "
                          "use another checkpoint.dir (or run_name), or raise training.steps")
    return answer[0]


def _ranges(steps: list[int]) -> str:
    """[1, 2, 3, 7] -> '1-3, 7'."""
    spans: list[list[int]] = []
    for s in steps:
        if spans and s == spans[-1][1] + 1:
            spans[-1][1] = s
        else:
            spans.append([s, s])
    return ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in spans)


def _build(config: RunConfig, device: torch.device, state: dict, log: Log, world: int):
    """The device mesh, this rank's model parts (parallelised from outside) and its stepper."""
    lay, tr = config.layout, config.training
    mesh = build_mesh(lay, device.type)
    dp_rank, pp_rank = mesh.get_local_rank("dp"), mesh.get_local_rank("pp")
    torch.manual_seed(config.seed + 1_000_003 * pp_rank + 7919 * dp_rank)  # dropout: TP ranks share a stream
    parts = parallelize(config.spec, lay, mesh, device, seed=config.seed, attention=config.attention,
                        compute_dtype=compute_dtype(tr.precision), lora=config.lora if tr.mode == "lora" else None)
    stepper = Stepper(parts, build_optimizers(parts.modules, tr, lay.offload, device), tr, lay, device)
    state.update(parts=parts, stepper=stepper)
    log(f"{config.spec.describe()}\nlayout dp={lay.dp} tp={lay.tp} pp={lay.pp} cp={lay.cp} vpp={lay.vpp} micro_batch="
        f"{lay.micro_batch} global_batch={lay.global_batch} (m={config.micro_batches}) zero={lay.zero_stage} "
        f"recompute={lay.recompute} sp={lay.sequence_parallel} schedule={lay.schedule} offload={lay.offload}; "
        f"{tr.precision} on "
        f"{world} x {device.type}")
    return mesh, parts, stepper


def refused_to_launcher(message: str, rank: int) -> bool:
    """Report a refusal (a ConfigError once running): under ``planner run`` each node's local rank 0
    hands it to its launcher through the file it names (REFUSED_ENV) and every rank exits 0, since
    torchrun answers a non-zero exit with a page of ChildFailedError; the launcher prints the line
    and exits 2. Otherwise rank 0 prints it here. True when handed over."""
    handed = os.environ.get(faults.REFUSED_ENV)
    if handed:
        if os.environ.get("LOCAL_RANK", "0") == "0":
            Path(handed).write_text(message)
        return True
    if rank == 0:
        print(f"error: {message}", file=sys.stderr, flush=True)
    return False


def _lock_run(config: RunConfig, rank: int, log: Log, state: dict) -> None:
    """One live run per run folder and per checkpoint folder (another run name may share it):
    rank 0 takes both locks, every rank learns whether it got them."""
    busy = [None]
    if rank == 0:
        for key, lock in (("lock", faults.RunLock(config.run_dir)),
                          ("checkpoint_lock", faults.CheckpointLock(config.checkpoint_dir))):
            busy = [lock.acquire(log)]
            if busy[0]:
                break
            state[key] = lock  # released by run(), however _train ends
    dist.broadcast_object_list(busy, src=0)
    if busy[0]:
        raise ConfigError(busy[0])


def _resume(config: RunConfig, ckpt: Checkpointer, parts, stepper: Stepper, guard: NonFiniteGuard,
            device: torch.device, log: Log) -> int:
    """The step of the newest checkpoint, its weights, optimizer, RNG, scaler and guard restored; 0 without one."""
    found = ckpt.latest(log)
    if found is None:
        return 0
    start, path = found
    extra = ckpt.load(path, parts.modules, stepper.optimizers)
    torch.set_rng_state(extra["rng"])
    if device.type == "cuda" and extra.get("cuda_rng") is not None:
        torch.cuda.set_rng_state(extra["cuda_rng"], device)
    if stepper.scaler is not None and extra.get("scaler"):
        stepper.scaler.load_state_dict(extra["scaler"])
    guard.run, guard.first = extra["guard"]
    log(f"resumed from {path.name} (step {start})")
    return start


def _loader(config: RunConfig, device: torch.device, start: int, dp_rank: int):
    """This data-parallel rank's batches from step ``start`` on, and whether they are pinned."""
    lay = config.layout
    source = TokenSource(seed=config.seed, vocab=config.spec.vocab, seq_len=config.spec.seq_len,
                         path=config.data.path, dtype=config.data.dtype)
    pin = config.data.pin_memory if config.data.pin_memory is not None else device.type == "cuda"
    batches = make_loader(source, start_step=start, global_batch=lay.global_batch, micro_batch=lay.micro_batch,
                          micro_batches=config.micro_batches, dp_rank=dp_rank, workers=config.data.workers,
                          prefetch_samples=config.prefetch_samples, pin_memory=pin)
    return batches, pin


def _run_steps(loop: _Loop, start: int) -> None:
    """Steps ``start`` .. steps: timed, some traced, logged, checkpointed; stops on the guard."""
    config, log, tr = loop.config, loop.log, loop.config.training
    warm = config.profile.warmup_steps
    traced = range(start + warm, start + warm + config.profile.trace_steps)  # a range: any size costs nothing
    for i in range(start, tr.steps):
        row, result, analysis = _one_step(loop, i, i in traced)
        step = i + 1
        if analysis is not None:
            loop.analyses.append(analysis)
        loop.rows.append(row)
        if loop.csv is not None:
            loop.csv.write(row)
        if loop.board is not None:
            loop.board.write(row, analysis, loop.nvml.latest_memory_bytes())
        if result.skipped:
            log(f"step {step}: non-finite loss or gradients; step skipped"
                + (f", loss scale now {result.loss_scale:g}" if result.loss_scale is not None else ""))
        if step % config.log_every == 0 or step == tr.steps:
            log.progress(step, tr.steps, result.loss, row["tokens_per_s"])
        if loop.guard.update(step, result.skipped):
            loop.status, loop.message = "stopped_nonfinite", loop.guard.diagnosis(tr.precision, result.loss_scale)
            log(f"error: {loop.message}")
            break
        interval = config.checkpoint.interval
        if interval and (step % interval == 0 or step == tr.steps):
            loop.save_s += _save_checkpoint(loop, step)
            log(f"checkpoint step {step} saved")


def _one_step(loop: _Loop, i: int, traced: bool):
    """Step ``i`` timed in its parts (data wait, forward+backward, optimizer): its CSV row, the
    stepper's result, and the profiler's analysis when traced (else None)."""
    device, stepper, m = loop.device, loop.stepper, loop.config.micro_batches
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    trace = profiler.tracer(device.type) if traced else contextlib.nullcontext()
    with trace as prof, profiler.mark(profiler.STEP_MARK):
        t0 = time.perf_counter()
        micro = split(next(loop.batches).to(device, non_blocking=loop.pin), m)
        t1 = time.perf_counter()
        with profiler.mark(profiler.FWD_BWD_MARK):
            loss_sum = stepper.forward_backward(micro, i)
            sync()
        t2 = time.perf_counter()
        faults.maybe_kill("step", i + 1)
        result = stepper.update(loss_sum, i)
        sync()
        t3 = time.perf_counter()
    analysis = None
    if prof is not None:
        analysis = profiler.analyse(profiler.traced_events(prof), device.type)
        dist.barrier()  # the analysis must not leak into other ranks' next step
    tokens_per_step = loop.config.layout.global_batch * loop.config.spec.seq_len
    row = {"step": i + 1, "loss": result.loss, "lr": result.lr, "grad_norm": result.grad_norm,
           "loss_scale": result.loss_scale, "skipped": int(result.skipped), "step_s": t3 - t0,
           "data_wait_s": t1 - t0, "fwd_bwd_s": t2 - t1, "optimizer_s": t3 - t2,
           "sync_wait_s": result.sync_s,  # inside optimizer_s: the cross-stage collectives, mostly waiting
           "tokens_per_s": tokens_per_step / (t3 - t0), "traced": int(prof is not None), **loop.nvml.latest(),
           **exchange.take()}
    return row, result, analysis


def _save_checkpoint(loop: _Loop, step: int) -> float:
    """A checkpoint of every rank's shard with the RNG, scaler and guard state; the seconds it took."""
    device, stepper = loop.device, loop.stepper
    extra = {"step": step, "rng": torch.get_rng_state(),
             "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
             "scaler": stepper.scaler.state_dict() if stepper.scaler is not None else None,
             "guard": (loop.guard.run, loop.guard.first)}
    return loop.ckpt.save(step, loop.parts.modules, stepper.optimizers, extra)


def _write_record(loop: _Loop, mine: dict, *, start: int, nvml_reason: str | None) -> None:
    """Every rank's summary gathered; rank 0 builds and writes the run record."""
    config = loop.config
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    if dist.get_rank() != 0:
        return
    try:
        rec = record.build_record(config=config, config_dict=config_to_dict(config), ranks=gathered,
                                  rows=loop.csv.rows if loop.csv else loop.rows, start_step=start,
                                  warmup_steps=config.profile.warmup_steps, status=loop.status,
                                  message=loop.message, nvml_reason=nvml_reason, env=_environment(loop.device),
                                  fault=faults.active())
    except ValueError as exc:  # the record schema refused it (e.g. a steps.csv edited to hold inf)
        if loop.status != "completed_rebuilt" and loop.status != "rebuilt_partial":
            raise
        raise ConfigError(f"no record rebuilt from {config.run_dir / record.STEPS_CSV}: {exc}") from None
    path = record.write_record(config.run_dir, rec)
    loop.log(record.summary(rec))
    loop.log(f"run record: {path}")


def _open_board(config: RunConfig, device: torch.device, world: int, log: Log):
    """TensorBoard event files under the run folder, with the planner's prediction beside the
    measured figures; None (and a line saying why) without tensorboard."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name()
    prediction, why = predicted(config, name, world)
    if why:
        log(why)
    metrics = None
    if config.profile.metrics_port is not None:
        from reference_trainer.metrics import MetricsServer

        metrics = MetricsServer({"run": config.run_name})
        try:
            port = metrics.start(config.profile.metrics_port)
            log(f"metrics: http://{socket.gethostname()}:{port}/metrics (Prometheus text format)")
        except OSError as exc:
            log(f"metrics endpoint not started: port {config.profile.metrics_port}: {exc}")
            metrics = None
    board = Board(config.run_dir / "tensorboard", prediction, metrics)
    why = board.open() if config.profile.tensorboard else None
    if why:
        log(why)
    if board.writer is None and board.metrics is None:
        return None
    return board


def _rank_summary(rows, analyses, warm, device, mesh, wall0, cpu0, nvml, save_s) -> dict:
    """This rank's figures for the record. Means, not medians: the parts of a step add up."""
    measured = [r for r in rows[warm:] if not r["traced"]] or rows
    mean = lambda key: statistics.fmean(r[key] for r in measured) if measured else 0.0
    part = lambda key: statistics.fmean(r.get(key) or 0.0 for r in measured) if measured else 0.0  # noqa: E731
    return {"rank": dist.get_rank(), "pp_rank": mesh.get_local_rank("pp"), "dp_rank": mesh.get_local_rank("dp"),
            "cp_rank": mesh.get_local_rank("cp"), "tp_rank": mesh.get_local_rank("tp"), "hostname": socket.gethostname(),
            "step_s": mean("step_s"), "data_wait_s": mean("data_wait_s"), "fwd_bwd_s": mean("fwd_bwd_s"),
            "optimizer_s": mean("optimizer_s"), "cp_comm_s": part("cp_comm_s"),
            "all_to_all_s": part("all_to_all_s"), "traced": analyses, "memory": profiler.peak_memory(device),
            "wall_s": time.perf_counter() - wall0, "cpu_s": profiler.cpu_times() - cpu0, "nvml": nvml,
            "checkpoint_s": save_s, "sync_steps_s": [r.get("sync_wait_s") or 0.0 for r in measured]}


def _environment(device: torch.device) -> dict:
    import platform

    import numpy

    env = {"device_kind": device.type, "python": platform.python_version(), "torch": torch.__version__,
           "numpy": numpy.__version__, "platform": platform.platform(), "cuda": torch.version.cuda,
           "backend": "nccl" if device.type == "cuda" else "gloo", "cpu_cores": os.cpu_count(),
           "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", "1"))}
    if device.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(device)
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        from planner.hardware import driver_version

        env["driver"] = driver_version()  # NVML's; None without pynvml
        env["device_memory_bytes"] = torch.cuda.get_device_properties(device).total_memory
    else:
        env["device_name"] = _cpu_name()
    return env


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "cpu"
