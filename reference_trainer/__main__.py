"""``python -m reference_trainer --config run.yaml [--config next.yaml ...]``: train, under torchrun or
as a single process. Several configs run one after another in the same processes (a sweep; they
must need the same number of processes). Every config is checked before torch is imported or
any process group starts; a bad one prints one line and exits with code 2."""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
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
        if os.environ.get("RANK", "0") == "0":  # one line, not one per process
            print(f"error: {exc}", file=sys.stderr)
        return 2
    from reference_trainer.train import run

    return run(configs)


if __name__ == "__main__":
    sys.exit(main())
