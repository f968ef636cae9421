"""The dimensions of issue 14 in the Megatron-LM and DeepSpeed exports: context parallel, CPU
offload (and, in tests/test_export_moe.py, mixture-of-experts). Each export is parsed back: the
Megatron script's bash arrays, the DeepSpeed JSON."""

from __future__ import annotations

import json

import pytest

from tests.test_export import bash_arrays, bash_syntax_ok, export, flags, run

FINETUNE_ONE_GPU = ["--preset", "llama2-7b", "--mode", "full-finetune", "--gpus", "1", "--gpu", "a6000"]


def megatron_flags(text: str) -> dict:
    return flags([w for words in bash_arrays(text).values() for w in words])


def test_megatron_context_parallel(capsys, tmp_path):
    # 128K tokens on 64 GPUs: tp 8 x cp 8, so data parallel is 64 / (8 x 1 x 8) = 1
    out, _ = export(capsys, "megatron", "--preset", "llama3-8b", "--seq-len", "131072", "--gpus", "64", "--tp", "8",
                    "--pp", "1", "--cp", "8", "--sequence-parallel")
    bash_syntax_ok(tmp_path, out)
    f = megatron_flags(out)
    assert f["--context-parallel-size"] == "8" and f["--cp-comm-type"] == "p2p"
    assert f["--tensor-model-parallel-size"] == "8" and f["--seq-length"] == "131072"
    assert "world 64 / (tp 8 x pp 1 x cp 8) = 1" in out


def test_megatron_without_context_parallel_has_no_cp_flags(capsys):
    f = megatron_flags(export(capsys, "megatron", "--preset", "llama-13b", "--gpus", "16", "--cp", "1")[0])
    assert "--context-parallel-size" not in f and "--cp-comm-type" not in f


def test_megatron_optimizer_offload(capsys):
    f = megatron_flags(export(capsys, "megatron", *FINETUNE_ONE_GPU, "--offload", "optimizer")[0])
    assert f["--optimizer-cpu-offload"] is True and f["--optimizer-offload-fraction"] == "1.0"
    assert f["--use-precision-aware-optimizer"] is True and f["--use-distributed-optimizer"] is True


@pytest.mark.parametrize("offload, param", [("optimizer", False), ("params", True)])
def test_deepspeed_offload(capsys, offload, param):
    d = json.loads(export(capsys, "deepspeed", *FINETUNE_ONE_GPU, "--offload", offload)[0])
    z = d["zero_optimization"]
    assert z["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert ("offload_param" in z) == param and z["stage"] >= (3 if param else 1)
    if param:
        assert z["offload_param"] == {"device": "cpu", "pin_memory": True}


def test_deepspeed_without_offload_has_no_offload_keys(capsys):
    d = json.loads(export(capsys, "deepspeed", "--preset", "llama-7b", "--gpus", "16", "--tp", "1", "--pp", "1",
                          "--offload", "none")[0])
    assert "offload_optimizer" not in d["zero_optimization"] and "offload_param" not in d["zero_optimization"]


@pytest.mark.parametrize("argv, needle", [
    (["--format", "megatron", *FINETUNE_ONE_GPU, "--offload", "params", "--stack", "deepspeed-zero"],
     "offload='params'"),
    (["--format", "torchrun", *FINETUNE_ONE_GPU, "--offload", "params", "--stack", "deepspeed-zero"],
     "offload='params'"),
    (["--format", "deepspeed", "--preset", "llama3-8b", "--seq-len", "65536", "--gpus", "16", "--cp", "2",
      "--stack", "megatron-core"], "cp=2"),
])
def test_new_dimensions_a_format_cannot_express(capsys, argv, needle):
    code, out, err = run(capsys, "export", *argv)
    assert code == 2 and out == "", err
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


# Hybrid sharding (HSDP): ZeRO over the data-parallel ranks inside one node, replicated across nodes.
# On 8-GPU nodes with tp t, a node holds 8 / t ranks of each data-parallel group.

def test_megatron_hybrid_sharding_is_distributed_optimizer_instances(capsys):
    # dp 16 x tp 2: 4 ranks of each dp group per node, so 16 / 4 = 4 optimizer instances
    f = megatron_flags(export(capsys, "megatron", "--params", "33B", "--gpus", "128", "--dp", "16", "--tp", "2",
                              "--pp", "4", "--zero", "1", "--sharding", "hybrid")[0])
    assert f["--use-distributed-optimizer"] is True and f["--num-distributed-optimizer-instances"] == "4"


def test_deepspeed_hybrid_sharding_is_mics(capsys):
    d = json.loads(export(capsys, "deepspeed", "--preset", "llama-7b", "--gpus", "32", "--tp", "1", "--pp", "1",
                          "--zero", "3", "--sharding", "hybrid")[0])
    assert d["zero_optimization"]["stage"] == 3 and d["zero_optimization"]["mics_shard_size"] == 8


def test_torchtitan_hybrid_sharding_is_hsdp(capsys):
    import tomllib

    code, out, err = run(capsys, "export", "--format", "torchtitan", "--preset", "llama3-8b", "--gpus", "32", "--dp",
                         "16", "--tp", "2", "--pp", "1", "--zero", "3", "--sharding", "hybrid", "--sequence-parallel")
    assert code == 0, err
    par = tomllib.loads(out)["parallelism"]
    # 8 / tp 2 = 4 ranks shard inside a node; 16 / 4 = 4 replicas
    assert (par["data_parallel_shard_degree"], par["data_parallel_replicate_degree"]) == (4, 4)
    assert par["data_parallel_shard_degree"] * par["data_parallel_replicate_degree"] * par["tensor_parallel_degree"] == 32


@pytest.mark.parametrize("argv, needle", [
    (["--format", "deepspeed", "--preset", "llama-7b", "--gpus", "32", "--tp", "1", "--pp", "1", "--zero", "2",
      "--sharding", "hybrid"], "sharding='hybrid'"),
])
def test_hybrid_sharding_a_format_cannot_express(capsys, argv, needle):
    code, out, err = run(capsys, "export", *argv)
    assert code == 2 and out == "", err
    assert needle in err and len(err.strip().splitlines()) == 1


def megatron_layout_counts(layout: str) -> list[int]:
    """Layers per stage of a --pipeline-model-parallel-layout string, unrolled as Megatron-Core does
    (PipelineParallelLayerLayout.parse_str_to_list: "x*n" is n x's, stages split at "|")."""
    import re

    text = re.sub(r"(.)\*(\d+)", lambda mt: mt.group(1) * int(mt.group(2)), layout.replace(",", ""))
    stages = text.split("|")
    assert stages[0].startswith("E") and stages[-1].endswith("L")
    assert set("".join(stages)) <= {"E", "t", "L"}
    return [s.count("t") for s in stages]


def test_megatron_uneven_pipeline_stages_as_a_layout(capsys):
    # llama-33b: 60 layers over 8 stages = 7 each, the 4 extra to stages 1..4 (planner.core.pipeline)
    out, _ = export(capsys, "megatron", "--params", "33B", "--gpus", "128", "--pp", "8", "--vpp", "1")
    f = megatron_flags(out)
    assert megatron_layout_counts(f["--pipeline-model-parallel-layout"]) == [7, 8, 8, 8, 8, 7, 7, 7]
    assert "--num-layers-per-virtual-pipeline-stage" not in f and "June 2025" in out
    # DeepSeek-V3's 61 layers over 16 stages: 3 each, 13 extra to stages 1..13
    f = megatron_flags(export(capsys, "megatron", "--preset", "deepseek-v3", "--gpus", "2048", "--gpu", "h100",
                              "--pp", "16", "--vpp", "1")[0])
    assert megatron_layout_counts(f["--pipeline-model-parallel-layout"]) == [3] + [4] * 13 + [3, 3]
    # an even split keeps the plain flags
    f = megatron_flags(export(capsys, "megatron", "--params", "33B", "--gpus", "128", "--pp", "4", "--vpp", "3")[0])
    assert "--pipeline-model-parallel-layout" not in f and f["--num-layers-per-virtual-pipeline-stage"] == "5"


@pytest.mark.parametrize("argv, want", [
    (["--preset", "llama-7b", "--seq-len", "8192", "--gpus", "16", "--cp", "2", "--stack", "fsdp2"], {"cp": 2}),
    ([*FINETUNE_ONE_GPU, "--offload", "optimizer", "--stack", "deepspeed-zero"], {"offload": "optimizer"}),
    (["--preset", "llama-7b", "--gpus", "32", "--sharding", "hybrid", "--zero", "3", "--stack", "fsdp2"],
     {"sharding": "hybrid"}),
])
def test_trainer_run_config_with_cp_offload_or_hybrid_is_accepted_by_the_trainer(capsys, argv, want):
    from tests.test_export import heredoc_yaml

    config_mod = pytest.importorskip("reference_trainer.config")
    out, _ = export(capsys, "torchrun", *argv)
    raw = heredoc_yaml(out)
    assert {k: raw["layout"][k] for k in want} == want
    cfg = config_mod.build_config(raw)
    assert all(getattr(cfg.layout, k) == v for k, v in want.items())
    launch = next(line for line in out.splitlines() if line.startswith("#   planner run"))
    assert all(f"--{k} {v}" in launch for k, v in want.items())
    if "offload" in want:  # the trainer writes no checkpoint with its optimizer offloaded
        assert raw["checkpoint"]["interval"] == 0


def test_trainer_unbuilt_variants_are_the_trainers():
    """The export refuses exactly the model variants the reference trainer refuses."""
    from planner.export.rules import TRAINER_UNBUILT

    config_mod = pytest.importorskip("reference_trainer.config")
    assert TRAINER_UNBUILT == config_mod.UNBUILT_SPEC
