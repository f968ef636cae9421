"""``planner run``: build a run config from flags, check it, launch torchrun, return its exit code.

    planner run --preset gpt3-125m --seq-len 512 --dp 2 --micro-batch 4 --global-batch 32 --steps 50
    planner run --layers 4 --hidden 64 --heads 4 --vocab 512 --seq-len 64 --tp 2 --pp 2 --steps 20

Flags override the keys of an optional ``--config`` YAML. The resolved config is written to
``runs/<run-name>/config.yaml`` and run as ``torchrun --standalone --nproc_per_node dp*tp*pp -m
reference_trainer --config ...`` (or with torchrun's c10d rendezvous when ``--nnodes`` > 1). A bad
config prints one line and returns 2 before anything starts. No torch import here.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from planner.core.layout import ATTENTION, GPU_FACTORS, JOB_OPTIONS, LAYOUT_DIMS, MODES
from reference_trainer import faults
from reference_trainer.config import (
    PRECISIONS,
    TRAINER_DIMS,
    ConfigError,
    build_config,
    config_to_dict,
    validate,
)

PARENT_ENV = "PLANNER_RUN_PARENT_PID"  # set by `planner run`: this launcher dies with it

# flag -> (section, key) of the run config; section None: top level. The layout's flags are
# derived from its declaration (planner.core.layout.LAYOUT_DIMS), one per dimension.
FLAGS = {
    "preset": ("model", "preset"), "params": ("model", "params"), "arch": ("model", "arch"),
    "layers": ("model", "layers"), "hidden": ("model", "hidden"), "heads": ("model", "heads"),
    "kv_heads": ("model", "kv_heads"), "ffn_hidden": ("model", "ffn_hidden"), "vocab": ("model", "vocab"),
    "seq_len": ("model", "seq_len"), "tied_embeddings": ("model", "tied_embeddings"),
    "dropout": ("model", "dropout"), "attention": ("model", "attention"),
    **{k: ("model", k) for k in ("experts", "top_k", "expert_ffn", "shared_experts", "dense_layers",
                                 "capacity_factor", "shared_expert_gate", "expert_groups", "groups_per_token")},
    **{d.name: ("layout", d.name) for d in LAYOUT_DIMS},
    "steps": ("training", "steps"), "precision": ("training", "precision"), "lr": ("training", "lr"),
    "warmup_steps": ("training", "warmup_steps"), "grad_clip": ("training", "grad_clip"),
    "data": ("data", "path"), "data_dtype": ("data", "dtype"), "workers": ("data", "workers"),
    "checkpoint_interval": ("checkpoint", "interval"), "keep_last": ("checkpoint", "keep_last"),
    "auto_resume": ("checkpoint", "auto_resume"), "checkpoint_dir": ("checkpoint", "dir"),
    "gpu": ("profile", "hardware_profile"), "peak_tflops": ("profile", "peak_tflops"),
    "metrics_port": ("profile", "metrics_port"), "tensorboard": ("profile", "tensorboard"),
    "memory_fraction": ("profile", "memory_fraction"),
    "trace_steps": ("profile", "trace_steps"), "profile_warmup_steps": ("profile", "warmup_steps"),
    "mode": ("training", "mode"), "lora_r": ("lora", "r"), "lora_alpha": ("lora", "alpha"),
    "lora_targets": ("lora", "targets"),
    "seed": (None, "seed"), "run_name": (None, "run_name"), "runs_dir": (None, "runs_dir"),
    "log_every": (None, "log_every"),
}


_JOB = {o.name: o for o in JOB_OPTIONS}  # the planner's job options: the trainer's flags share their help


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line naming the flag, the value and what is allowed (exit 2),
    not a usage dump; numbers read strictly (planner.numbers: no 1_0, no 1e400 read as infinity)."""

    def __init__(self, *args, **kwargs) -> None:
        from planner.numbers import strict

        super().__init__(*args, **kwargs)
        strict(self)

    def error(self, message: str) -> None:  # type: ignore[override]
        bad = re.fullmatch(r"argument (\S+): invalid (int|float) value: (.*)", message)
        if bad:
            flag, kind, value = bad.groups()
            message = f"{flag.split('/')[0]}={value}: expected {'an integer' if kind == 'int' else 'a number'}"
        print(f"error: {message} (planner run --help lists the flags)", file=sys.stderr)
        raise SystemExit(2)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="planner run", description="Train with the reference trainer under torchrun "
                                "and write a run record under runs/.")
    p.add_argument("--config", help="a run config YAML to start from (flags override its keys)")
    m = p.add_argument_group("model (a preset, a parameter count, or a shape; shape flags override a preset's)")
    m.add_argument("--preset")
    m.add_argument("--params", help="e.g. 350M, 1.3B: the nearest preset or a LLaMA-style shape")
    m.add_argument("--arch", choices=("gpt", "llama"))
    for name in ("layers", "hidden", "heads", "kv-heads", "ffn-hidden", "vocab", "seq-len"):
        m.add_argument(f"--{name}", type=int)
    m.add_argument("--tied-embeddings", action=argparse.BooleanOptionalAction, default=None)
    m.add_argument("--dropout", type=float)
    m.add_argument("--attention", choices=ATTENTION, help=_JOB["attention"].help)
    moe = p.add_argument_group("mixture of experts (planner ModelSpec fields; experts 0: dense)")
    for name, helptext in (("experts", "routed experts per MoE layer"), ("top-k", "experts each token goes to"),
                           ("expert-ffn", "each expert's FFN width (default ffn_hidden)"),
                           ("shared-experts", "always-on experts: one MLP of width shared_experts * expert_ffn"),
                           ("dense-layers", "leading layers that keep the dense MLP"),
                           ("expert-groups", "equal groups of experts for group-limited routing (default 1)"),
                           ("groups-per-token", "groups a token's experts may come from (default 1)")):
        moe.add_argument(f"--{name}", type=int, help=helptext)
    moe.add_argument("--capacity-factor", type=float, help="tokens per expert capped at this x the mean (0: dropless)")
    moe.add_argument("--shared-expert-gate", action=argparse.BooleanOptionalAction, default=None,
                     help="sigmoid gate on the shared MLP (Qwen-MoE)")
    lay = p.add_argument_group("layout (one flag per dimension of planner.core.layout.Layout)")
    for d in LAYOUT_DIMS:
        flags, kwargs = d.argparse_spec()
        lay.add_argument(*flags, **kwargs)
    tr = p.add_argument_group("training")
    tr.add_argument("--steps", type=int)
    tr.add_argument("--precision", choices=PRECISIONS)
    tr.add_argument("--lr", type=float)
    tr.add_argument("--warmup-steps", type=int, help="learning-rate warm-up steps")
    tr.add_argument("--grad-clip", type=float)
    tr.add_argument("--seed", type=int)
    tr.add_argument("--mode", choices=MODES, help=_JOB["mode"].help)
    tr.add_argument("--lora-r", type=int, help=_JOB["lora_r"].help)
    tr.add_argument("--lora-alpha", type=float, help=_JOB["lora_alpha"].help)
    tr.add_argument("--lora-targets", help=_JOB["lora_targets"].help)
    d = p.add_argument_group("data and checkpoints")
    d.add_argument("--data", help="token file (flat uint16/uint32); default: the seeded synthetic stream")
    d.add_argument("--data-dtype", choices=("uint16", "uint32"))
    d.add_argument("--workers", type=int, help="data loader worker processes")
    d.add_argument("--checkpoint-interval", type=int, help="steps between checkpoints (0: none)")
    d.add_argument("--keep-last", type=int)
    d.add_argument("--checkpoint-dir")
    d.add_argument("--auto-resume", action=argparse.BooleanOptionalAction, default=None)
    pr = p.add_argument_group("profile and record")
    pr.add_argument("--gpu", help="planner hardware profile whose peak FLOP/s gives the MFU")
    pr.add_argument("--peak-tflops", type=float, help="peak TFLOP/s per device, instead of a profile")
    pr.add_argument("--trace-steps", type=int, help="steps traced with torch.profiler")
    pr.add_argument("--tensorboard", action=argparse.BooleanOptionalAction, default=None,
                    help="TensorBoard event files under runs/<run-name>/tensorboard (rank 0)")
    pr.add_argument("--metrics-port", type=int,
                    help="serve Prometheus text metrics at http://<host>:PORT/metrics from rank 0 (0: any free port)")
    pr.add_argument("--profile-warmup-steps", type=int, help="steps left out of the timing statistics")
    pr.add_argument("--memory-fraction", type=float,
                    help="cap each GPU process's memory at this share of the GPU (0-1; torch.cuda."
                         "set_per_process_memory_fraction): runs near a memory ceiling; no effect on a CPU")
    pr.add_argument("--run-name", help="runs/<run-name>/ (default: model, layout and time)")
    pr.add_argument("--runs-dir")
    pr.add_argument("--log-every", type=int)
    ln = p.add_argument_group("launch (multi-node: torchrun's c10d rendezvous)")
    ln.add_argument("--nnodes", type=int, default=1)
    ln.add_argument("--nproc-per-node", type=int, help="default: the layout's GPUs (dp*tp*pp...) / nnodes")
    ln.add_argument("--rdzv-endpoint", help="HOST:PORT of the rendezvous (needed when --nnodes > 1)")
    ln.add_argument("--rdzv-id", help="a job id shared by all nodes (default: the run name)")
    ln.add_argument("--dry-run", action="store_true", help="check and print the config and command; run nothing")
    return p


def config_dict(args: argparse.Namespace) -> dict:
    """The run config as a mapping: the --config file's keys, overridden by the flags given."""
    data: dict = {}
    if args.config:
        import yaml

        try:
            data = yaml.safe_load(Path(args.config).read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"--config {args.config}: cannot read ({exc.strerror})") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"--config {args.config}: not a UTF-8 text file (byte {exc.start}); "
                              "expected a run config YAML") from None
        except RecursionError:
            raise ConfigError(f"--config {args.config}: nested too deeply for a run config") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"--config {args.config}: not valid YAML ({str(exc).splitlines()[0]})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"--config {args.config}: expected a mapping of keys")
    for flag, (section, key) in FLAGS.items():
        value = getattr(args, flag)
        if value is None:
            continue
        if section is None:
            data[key] = value
        else:
            if not isinstance(data.get(section) or {}, dict):
                raise ConfigError(f"{section}: expected a mapping of keys")
            data.setdefault(section, {})
            data[section] = dict(data[section] or {}, **{key: value})
    if ("preset" in (data.get("model") or {}) or "params" in (data.get("model") or {})) and (
            args.preset is not None or args.params is not None):
        model = data["model"]
        for other in ("preset", "params"):
            if getattr(args, other) is None:
                model.pop(other, None)  # a flag's model choice replaces the file's
    return data


def default_run_name(data: dict, spec_name: str) -> str:
    lay = data.get("layout") or {}
    shape = "-".join(f"{k}{lay.get(k, 1)}" for k in GPU_FACTORS if k in TRAINER_DIMS)  # dp, tp, pp
    return f"{spec_name}-{shape}-{time.strftime('%Y%m%d-%H%M%S')}"


def torchrun_command(config_path: Path, nnodes: int, nproc: int, rdzv_endpoint: str | None,
                     rdzv_id: str) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    if nnodes == 1:
        cmd += ["--standalone", "--nnodes", "1"]
    else:
        cmd += ["--nnodes", str(nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint,
                "--rdzv-id", rdzv_id]
    return cmd + ["--nproc-per-node", str(nproc), "-m", "reference_trainer", "--config", str(config_path)]


def _check_launch_flags(args: argparse.Namespace) -> None:
    """Launch flags given but unusable are refused, never replaced by a default."""
    for name, value in vars(args).items():  # argparse turns `--flag=--` into a list
        if isinstance(value, list):
            raise ConfigError(f"--{name.replace('_', '-')}={value!r}: expected one value")
    if args.nnodes < 1:
        raise ConfigError(f"--nnodes={args.nnodes}: expected a positive integer")
    if args.nproc_per_node is not None and args.nproc_per_node < 1:
        raise ConfigError(f"--nproc-per-node={args.nproc_per_node}: expected a positive integer "
                          "(leave it out for the layout's GPUs / --nnodes)")
    for flag in ("run_name", "runs_dir", "checkpoint_dir", "rdzv_id", "gpu"):
        value = getattr(args, flag)
        if value is not None and not value.strip():
            raise ConfigError(f"--{flag.replace('_', '-')}={value!r}: expected a non-empty value "
                              "(leave the flag out for the default)")


def _per_node(world: int, nnodes: int) -> int:
    """Processes per node: the layout's GPUs split evenly over the nodes."""
    if world % nnodes:
        raise ConfigError(f"--nnodes={nnodes}: the layout's {world} processes (dp*tp*pp...) do not split evenly over "
                          f"{nnodes} nodes; give a layout whose GPU count is a multiple of --nnodes, or "
                          "--nproc-per-node")
    return world // nnodes


def _preflight(config) -> None:
    """What would stop the run once started, checked before torchrun starts and before config.yaml
    is written: a live run in the run or checkpoint folder, a checkpoint of another layout."""
    from reference_trainer import manifest

    for lock in (faults.RunLock(config.run_dir), faults.CheckpointLock(config.checkpoint_dir)):
        if busy := lock.probe():
            raise ConfigError(busy)
    if config.checkpoint.auto_resume:
        layout = dict(config_to_dict(config)["layout"])
        if why := manifest.layout_problem(config.checkpoint_dir, layout, config.world_size):
            raise ConfigError(why)


def main(argv: list[str]) -> int:
    if os.environ.get(PARENT_ENV, "").isdigit():
        faults.die_with_parent(int(os.environ[PARENT_ENV]))
    args = parser().parse_args(argv)
    try:
        _check_launch_flags(args)
        data = config_dict(args)
        config = build_config(data, default_name="run")
        if not data.get("run_name"):
            name = args.rdzv_id if args.nnodes > 1 and args.rdzv_id else default_run_name(data, config.spec.name)
            config = build_config({**data, "run_name": name})
        world = config.world_size
        nproc = args.nproc_per_node or _per_node(world, args.nnodes)
        validate(config, world_size=args.nnodes * nproc)
        if args.nnodes > 1 and not args.rdzv_endpoint:
            raise ConfigError(f"--nnodes={args.nnodes}: give --rdzv-endpoint HOST:PORT (the same on every node)")
        if not args.dry_run:
            _preflight(config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # e.g. the planner rejecting a preset name or a parameter count
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import yaml

    config_path = config.run_dir / "config.yaml"
    cmd = torchrun_command(config_path, args.nnodes, nproc, args.rdzv_endpoint, args.rdzv_id or config.run_name)
    text = yaml.safe_dump(config_to_dict(config), sort_keys=False)
    if args.dry_run:
        print(text + "\n" + " ".join(cmd))
        return 0
    config.run_dir.mkdir(parents=True, exist_ok=True)
    tmp = config_path.with_suffix(f".yaml.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, config_path)
    env = dict(os.environ)
    refused = config.run_dir / f".refused.{os.getpid()}"
    env[faults.REFUSED_ENV] = str(refused.resolve())
    # torchrun would set OMP_NUM_THREADS=1; on a CPU run, share the cores among the local ranks.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    print(f"run {config.run_name}: {world} processes ({args.nnodes} node(s) x {nproc}); config {config_path}",
          flush=True)
    # torchrun dies with this launcher (and its ranks with torchrun: train.py arms the same signal).
    rc = subprocess.call(cmd, env=env, preexec_fn=faults.die_with_parent)
    if refused.exists():  # refused once running (the trainer exited 0 so that torchrun stays quiet)
        print(f"error: {refused.read_text().strip()}", file=sys.stderr)
        refused.unlink()
        return 2
    if rc != 0:  # on success the run itself has said where its record is (train.py, "run record: ...")
        print(f"error: the run exited with code {rc} (logs above; per-step figures in {config.run_dir}/steps.csv)",
              file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
