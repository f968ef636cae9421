"""``python -m reference_trainer --config run.yaml [--config next.yaml ...]``: train, under torchrun or
as a single process. Several configs run one after another in the same processes (a sweep; they
must need the same number of processes). Every config is checked before torch is imported or
any process group starts; a bad one prints one line and exits with code 2.

``python -m reference_trainer trace FILE [--step N]``: book a recorded torch.profiler / Kineto
Chrome trace (``.json`` or ``.json.gz``) by the profiler's rules and print one JSON line per step
(seconds); a file it cannot read prints one line and exits with code 2."""

from __future__ import annotations

import argparse
import os
import sys


def trace_main(argv: list[str]) -> int:
    """The ``trace`` subcommand (reference_trainer/README.md, "Reading a recorded trace")."""
    import json

    from reference_trainer.trace import PROFILER_STEP, TraceError, analyse_trace, load_trace

    parser = argparse.ArgumentParser(prog="python -m reference_trainer trace",
                                     description="Book a recorded torch.profiler/Kineto Chrome trace by the "
                                                 "profiler's rules: one JSON line per step, in seconds.")
    parser.add_argument("file", help="Chrome trace JSON (.json or .json.gz) from export_chrome_trace or Kineto")
    parser.add_argument("--step", default=None,
                        help="only this step: N or ProfilerStep#N (default: every ProfilerStep#N in the trace)")
    args = parser.parse_args(argv)
    step = f"{PROFILER_STEP}{args.step}" if args.step is not None and args.step.isdigit() else args.step
    try:
        booked = analyse_trace(load_trace(args.file), step)
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, figures in booked.items():
        print(json.dumps({"step": name, **figures}))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["trace"]:
        return trace_main(argv[1:])
    from reference_trainer.config import ConfigError, launched_world_size, load_config, validate

    parser = argparse.ArgumentParser(prog="python -m reference_trainer", description=__doc__)
    parser.add_argument("--config", required=True, action="append",
                        help="run config (YAML; reference_trainer/README.md lists the keys); repeat for a sweep")
    args = parser.parse_args(argv)
    try:
        configs = [load_config(path) for path in args.config]
        for config in configs:
            validate(config, world_size=launched_world_size() or 1)
    except ConfigError as exc:
        from reference_trainer.faults import REFUSED_ENV

        handed = os.environ.get(REFUSED_ENV)
        if handed:  # each node's `planner run` prints it and exits 2 (train.refused_to_launcher)
            if os.environ.get("LOCAL_RANK", "0") == "0":
                with open(handed, "w") as f:
                    f.write(str(exc))
            return 0
        if os.environ.get("RANK", "0") == "0":  # one line, not one per process
            print(f"error: {exc}", file=sys.stderr)
        return 2
    from reference_trainer.train import run

    return run(configs)


def _exit_now(rc: int) -> None:
    """Leave without the interpreter's teardown of torch's modules (about 0.7 s a process on a CPU,
    paid by every rank of every run): the run has already closed everything it wrote (records and
    checkpoints are written to a temporary name, synced and renamed), destroyed its process group
    and shut its loader workers down; logging and the standard streams are flushed here."""
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can be said there
            pass
    os._exit(rc)


if __name__ == "__main__":
    _exit_now(int(main() or 0))
