"""Shared trainer runs. Each torchrun job costs seconds of start-up on a 2-core machine, so the
runs several tests read are batched into three sweeps (one per process count), each launched
once per session: ``python -m reference_trainer --config a.yaml --config b.yaml ...``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.trainer.helpers import TINY_GPT, TINY_LLAMA, run_trainer, write_config

FAULT = "REFERENCE_TRAINER_FAULT"
CPU_PROFILE = Path(__file__).resolve().parents[2] / "hardware_profiles" / "calibrated" / "cpu-2core.toml"
CHECKPOINTED = {"model": {**TINY_GPT, "dropout": 0.1}, "layout": {"dp": 2},
                "sections": {"training": {"steps": 8}, "data": {"workers": 1},
                             "checkpoint": {"interval": 2, "keep_last": 2, "auto_resume": True}}}


def checkpointed_config(folder, name):
    """The fault tests' run: dp=2 with dropout (RNG state matters) and a loader worker."""
    return write_config(folder, name, CHECKPOINTED["model"], CHECKPOINTED["layout"], **CHECKPOINTED["sections"])


@pytest.fixture(scope="session")
def single_sweep(tmp_path_factory):
    """One process: the reference runs, an fp16 run with one injected overflow, and (last, as it
    stops the sweep with exit code 3) a run whose losses stay non-finite."""
    folder = tmp_path_factory.mktemp("single")
    tokens = folder / "tokens.bin"  # a memory-mapped token file: a repeating ramp, 40 samples of 64
    (np.arange(40 * 64 + 1) % 97).astype(np.uint16).tofile(tokens)
    configs = [
        write_config(folder, "gpt-1", TINY_GPT, {"dp": 1}),
        write_config(folder, "llama-1", TINY_LLAMA, {"dp": 1}),
        write_config(folder, "gpt-memmap", TINY_GPT, {"dp": 1}, data={"path": str(tokens), "workers": 1},
                     training={"steps": 10}),
        write_config(folder, "gpt-tensorboard", TINY_GPT, {"dp": 1},
                     profile={"tensorboard": True, "metrics_port": 0, "hardware_profile": str(CPU_PROFILE)}),
        write_config(folder, "fp16-overflow", TINY_GPT, {"dp": 1}, training={"steps": 5, "precision": "fp16"}),
        write_config(folder, "stop-nonfinite", TINY_GPT, {"dp": 1}, training={"max_nonfinite_steps": 2}),
    ]
    faults = "overflow:run=fp16-overflow:step=3,overflow:run=stop-nonfinite:from=2"
    return folder / "runs", run_trainer(configs, 1, env={FAULT: faults})


@pytest.fixture(scope="session")
def two_sweep(tmp_path_factory):
    """Two processes: data, tensor and pipeline parallel each alone (the equivalence runs, which
    also cover ZeRO 0/2/3, recompute (selective, full, half), standard attention, interleaving, DualPipeV), GPipe with 1 and 8
    micro-batches (bubble; the drain booked as bubble), and the uninterrupted reference of the
    fault tests."""
    folder = tmp_path_factory.mktemp("two")
    pipe = {"training": {"steps": 8}, "profile": {"trace_steps": 2}}
    configs = [
        write_config(folder, "gpt-dp2", TINY_GPT, {"dp": 2}, profile={"trace_steps": 2}),
        write_config(folder, "gpt-dp2-zero2", {**TINY_GPT, "attention": "standard"}, {"dp": 2, "zero_stage": 2}),
        write_config(folder, "llama-dp2-zero3", TINY_LLAMA, {"dp": 2, "zero_stage": 3, "recompute": "full"}),
        write_config(folder, "llama-tp2", TINY_LLAMA, {"tp": 2, "sequence_parallel": True, "recompute": "selective"}),
        write_config(folder, "llama-tp2-nosp", TINY_LLAMA, {"tp": 2, "recompute": "half"}),
        write_config(folder, "gpt-pp2-interleaved", TINY_GPT, {"pp": 2, "vpp": 2}),
        write_config(folder, "gpt-pp2-dualpipev", TINY_GPT, {"pp": 2, "vpp": 2, "schedule": "dualpipev"}),
        # Sequences of 256: the last stage's drain (the first stage's backward of the one micro-batch)
        # well above the AdamW step, so the record's booking of it shows (test_trainer_record.py).
        # hidden 256: the first stage's backward (the last stage's wait, ~0.25 s on a 2-core machine)
        # dwarfs the scheduler's jitter in the first stage's own wait (1.5 ms seen in CI)
        write_config(folder, "gpt-pp2-m1", {**TINY_GPT, "seq_len": 256, "hidden": 256},
                     {"pp": 2, "schedule": "gpipe", "micro_batch": 8}, **pipe),
        write_config(folder, "gpt-pp2-m8", TINY_GPT, {"pp": 2, "schedule": "gpipe", "micro_batch": 1}, **pipe),
        checkpointed_config(folder, "ckpt-reference"),
    ]
    return folder / "runs", run_trainer(configs, 2)


@pytest.fixture(scope="session")
def four_sweep(tmp_path_factory):
    """Four processes: tensor x pipeline parallel (sequence parallel, 1F1B) and data x pipeline
    parallel (FSDP2 ZeRO 1 inside the pipeline, tied embeddings across stages)."""
    folder = tmp_path_factory.mktemp("four")
    configs = [
        write_config(folder, "llama-tp2-pp2", TINY_LLAMA, {"tp": 2, "pp": 2, "sequence_parallel": True,
                                                           "micro_batch": 1}),
        write_config(folder, "gpt-dp2-pp2-zero1", TINY_GPT, {"dp": 2, "pp": 2, "zero_stage": 1, "micro_batch": 1}),
    ]
    return folder / "runs", run_trainer(configs, 4)
