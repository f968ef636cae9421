"""planner export --format torchtitan: the TOML parses (tomllib) and torchtitan, reading it, runs the
layout the planner chose. Each config is read back the way torchtitan reads it
(torchtitan/distributed/parallel_dims.py, train.py, distributed/pipeline_parallel.py at e347b1e5)
and compared field by field with the layout `planner estimate` picks for the same flags, and with
the values pinned by hand."""

from __future__ import annotations

import json
import math
import tomllib

import pytest

from tests.test_export import run

SCHEDULES = {"1F1B": ("1f1b", False), "Interleaved1F1B": ("1f1b", True), "GPipe": ("gpipe", False)}


def toml_export(capsys, *argv: str) -> dict:
    code, out, err = run(capsys, "export", "--format", "torchtitan", *argv)
    assert code == 0, err
    assert out.startswith("# planner export --format torchtitan")
    return tomllib.loads(out)


def stage_layers(par: dict, layers: int) -> list[int]:
    """Layers per virtual stage as torchtitan splits them (pipeline_llm, generate_llm_fqn_per_model_part)."""
    if "module_fqns_per_model_part" in par:
        parts = par["module_fqns_per_model_part"]
        names = [n for part in parts for n in part]
        assert names == ["tok_embeddings", *(f"layers.{i}" for i in range(layers)), "norm", "output"]
        return [sum(n.startswith("layers.") for n in part) for part in parts]
    per = par["pipeline_parallel_layers_per_stage"]
    first, last = par["pipeline_parallel_first_stage_less_layers"], par["pipeline_parallel_last_stage_less_layers"]
    stages = math.ceil((layers + first + last) / per)
    base, extra = divmod(layers + first + last, stages)
    counts = [base + (k < extra) for k in range(stages)]
    counts[0] -= first
    counts[-1] -= last
    return counts


def read_layout(cfg: dict, layers: int, gpus: int) -> dict:
    """The planner's layout fields as torchtitan would run this config."""
    par, tr = cfg["parallelism"], cfg["training"]
    rep, shard = par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]
    tp, pp, cp = par["tensor_parallel_degree"], par["pipeline_parallel_degree"], par["context_parallel_degree"]
    assert rep * shard * cp * tp * pp == gpus  # ParallelDims._validate
    assert rep == 1 or shard == 1  # no HSDP in these layouts
    dp = rep * shard
    local, global_batch = tr["local_batch_size"], tr["global_batch_size"]
    accum = global_batch // (local * dp)
    assert accum * local * dp == global_batch  # train.py: gradient-accumulation steps
    vpp, micro, schedule = 1, local, "1f1b"
    if pp > 1:
        counts = stage_layers(par, layers)
        assert len(counts) % pp == 0 and min(counts) >= 1
        vpp = len(counts) // pp
        micro = par["pipeline_parallel_microbatch_size"]
        assert local % micro == 0 and accum == 1  # n_microbatches = local / micro; no accumulation with PP
        schedule, interleaved = SCHEDULES[par["pipeline_parallel_schedule"]]
        assert interleaved == (vpp > 1)
    ac = cfg["activation_checkpoint"]
    if ac["mode"] == "selective":
        assert ac["selective_ac_option"] == "op"
    return {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "vpp": vpp, "micro_batch": micro, "global_batch": global_batch,
            "zero_stage": 3 if shard > 1 or (cp > 1 and rep == 1) else 0, "recompute": ac["mode"],
            "schedule": schedule, "ep": par["expert_parallel_degree"],
            "offload": "params" if tr["enable_cpu_offload"] else "none"}


def planned_layout(capsys, *argv: str) -> dict:
    code, out, err = run(capsys, "estimate", *argv, "--stack", "fsdp2", "--format", "json")
    assert code == 0, err
    return json.loads(out)["layout"]


CASES = {
    # llama3-8b on 16 GPUs, FSDP over 8, TP 2 (sequence parallel), compiled, async TP, full AC
    "dense": (["--preset", "llama3-8b", "--gpus", "16", "--dp", "8", "--tp", "2", "--pp", "1", "--zero", "3",
               "--micro-batch", "2", "--global-batch", "512", "--recompute", "full", "--sequence-parallel",
               "--compile", "--async-tp"],
              {"dp": 8, "tp": 2, "pp": 1, "cp": 1, "vpp": 1, "micro_batch": 2, "global_batch": 512,
               "zero_stage": 3, "recompute": "full"}),
    # DDP (ZeRO-0 is data_parallel_replicate_degree) of a 1B-class llama shape torchtitan has no flavor for
    "ddp": (["--arch", "llama", "--layers", "16", "--hidden", "2048", "--heads", "16", "--kv-heads", "8",
             "--vocab", "128256", "--seq-len", "8192", "--gpus", "16", "--dp", "16", "--tp", "1", "--pp", "1",
             "--zero", "0", "--micro-batch", "1", "--global-batch", "256", "--recompute", "full"],
            {"dp": 16, "tp": 1, "pp": 1, "vpp": 1, "micro_batch": 1, "global_batch": 256, "zero_stage": 0}),
    # llama3-70b, 80 layers over pp 4 x vpp 2 = 8 virtual stages of 10; m = 64 / (2 x 1) = 32
    "pp-interleaved": (["--preset", "llama3-70b", "--gpus", "64", "--dp", "2", "--tp", "8", "--pp", "4", "--vpp",
                        "2", "--micro-batch", "1", "--global-batch", "64", "--zero", "3", "--recompute",
                        "selective", "--attention", "standard", "--sequence-parallel"],
                       {"dp": 2, "tp": 8, "pp": 4, "vpp": 2, "micro_batch": 1, "global_batch": 64,
                        "recompute": "selective", "schedule": "1f1b"}),
    # llama3-8b's 32 layers over 3 stages: 10, 11, 11 (the remainder to stages 1..r)
    "pp-uneven": (["--preset", "llama3-8b", "--gpus", "24", "--dp", "1", "--tp", "8", "--pp", "3", "--vpp", "1",
                   "--micro-batch",
                   "1", "--global-batch", "12", "--zero", "3", "--recompute", "full", "--sequence-parallel"],
                  {"dp": 1, "tp": 8, "pp": 3, "vpp": 1, "micro_batch": 1, "global_batch": 12}),
    # 128K tokens, context parallel 8 x tensor parallel 8
    "cp": (["--preset", "llama3-8b", "--seq-len", "131072", "--gpus", "64", "--dp", "1", "--tp", "8", "--pp", "1",
            "--cp", "8", "--micro-batch", "1", "--global-batch", "32", "--zero", "3", "--recompute", "full",
            "--sequence-parallel"],
           {"dp": 1, "tp": 8, "pp": 1, "cp": 8, "micro_batch": 1, "global_batch": 32, "zero_stage": 3}),
    "fp8": (["--preset", "llama3-8b", "--gpus", "16", "--gpu", "h100", "--precision", "fp8", "--dp", "16", "--tp",
             "1", "--pp", "1", "--zero", "3", "--micro-batch", "1", "--global-batch", "256", "--recompute", "full"],
            {"dp": 16, "zero_stage": 3, "global_batch": 256}),
}


@pytest.mark.parametrize("case", CASES)
def test_every_layout_value_round_trips(capsys, case):
    argv, pinned = CASES[case]
    cfg = toml_export(capsys, *argv)
    gpus = int(argv[argv.index("--gpus") + 1])
    layers = {"llama3-8b": 32, "llama3-70b": 80}.get(argv[1]) or int(argv[argv.index("--layers") + 1])
    got = read_layout(cfg, layers, gpus)
    want = planned_layout(capsys, *argv)
    if got["dp"] * got["cp"] == 1:  # one data-parallel rank: nothing to shard, ZeRO-0 and ZeRO-3 the same run
        got["zero_stage"] = want["zero_stage"]
    assert got == {k: want.get(k, {"ep": 1, "offload": "none"}.get(k)) for k in got}
    assert {k: got[k] for k in pinned} == pinned
    seq = int(argv[argv.index("--seq-len") + 1]) if "--seq-len" in argv else 8192  # llama3's context
    assert cfg["training"]["seq_len"] == seq


def test_dense_config_details(capsys):
    cfg = toml_export(capsys, *CASES["dense"][0])
    assert cfg["model"] == {"name": "llama3", "flavor": "8B", "hf_assets_path": "./assets/hf/llama3-8b"}
    assert cfg["compile"] == {"enable": True, "components": ["model", "loss"]}
    assert cfg["parallelism"]["enable_async_tensor_parallel"] is True
    assert cfg["training"]["mixed_precision_param"] == "bfloat16" and "quantize" not in cfg
    # Llama 2's pretraining recipe (planner/export/hyper.py): AdamW 3e-4, betas 0.9/0.95, cosine to 10%
    assert cfg["optimizer"] == {"name": "AdamW", "lr": 3e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-5,
                                "weight_decay": 0.1}
    assert cfg["lr_scheduler"]["decay_type"] == "cosine" and cfg["lr_scheduler"]["min_lr_factor"] == 0.1
    assert cfg["checkpoint"]["enable"] is True and cfg["checkpoint"]["keep_latest_k"] == 3


def test_pipeline_stages_are_the_planners_split(capsys):
    cfg = toml_export(capsys, *CASES["pp-uneven"][0])
    par = cfg["parallelism"]
    assert par["pipeline_parallel_schedule"] == "1F1B"
    assert stage_layers(par, 32) == [10, 11, 11]
    assert par["module_fqns_per_model_part"][1][0] == "layers.10"
    assert cfg["training"]["local_batch_size"] == 12  # micro-batch 1 x 12 micro-batches, one step
    cfg = toml_export(capsys, *CASES["pp-interleaved"][0])
    par = cfg["parallelism"]
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert stage_layers(par, 80) == [10] * 8 and par["pipeline_parallel_layers_per_stage"] == 10
    assert cfg["training"]["local_batch_size"] == 32  # m = 64 / (dp 2 x micro-batch 1)


def test_fp8_is_torchao_float8_tensorwise(capsys):
    cfg = toml_export(capsys, *CASES["fp8"][0])
    assert cfg["model"]["converters"] == ["quantize.linear.float8"]
    f8 = cfg["quantize"]["linear"]["float8"]
    assert f8["recipe_name"] == "tensorwise" and f8["enable_fsdp_float8_all_gather"] is True
    assert f8["filter_fqns"] == ["output"]


def test_offloaded_fine_tune_on_one_gpu(capsys):
    cfg = toml_export(capsys, "--preset", "llama2-7b", "--mode", "full-finetune", "--gpus", "1", "--gpu", "a6000",
                      "--offload", "params")
    assert cfg["training"]["enable_cpu_offload"] is True
    par = cfg["parallelism"]
    assert par["data_parallel_shard_degree"] * par["data_parallel_replicate_degree"] == 1
    # no torchtitan flavor has llama2-7b's shape: the header says what to register
    assert cfg["model"]["flavor"] == "llama2-7b"


@pytest.mark.parametrize("argv, needle", [
    (["--preset", "llama3-8b", "--gpus", "16", "--zero", "1", "--stack", "megatron-core"], "zero_stage=1"),
    (["--preset", "llama3-8b", "--gpus", "16", "--precision", "fp16"], "precision='fp16'"),
    (["--preset", "gpt3-1.3b", "--gpus", "8"], "arch='gpt'"),
    (["--preset", "llama3-8b", "--gpus", "16", "--tp", "2", "--no-sequence-parallel"], "sequence_parallel=False"),
    (["--preset", "llama3-8b", "--gpus", "16", "--tp", "2", "--async-tp"], "async_tp=True"),
    (["--preset", "llama3-8b", "--gpus", "16", "--seq-len", "65536", "--cp", "2", "--zero", "0"], "zero_stage=0"),
    (["--preset", "llama2-7b", "--mode", "full-finetune", "--gpus", "1", "--gpu", "a6000", "--offload",
      "optimizer", "--stack", "deepspeed-zero"], "offload='optimizer'"),
])
def test_what_torchtitan_cannot_express_is_one_line_exit_2(capsys, argv, needle):
    code, out, err = run(capsys, "export", "--format", "torchtitan", *argv)
    assert code == 2 and out == "", err
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_hostile_names_stay_strings_and_comments(capsys, tmp_path):
    from tests.test_security import HOSTILE, hostile_profile

    try:
        code, out, err = run(capsys, "export", "--format", "torchtitan", "--preset", "llama3-8b", "--gpus", "16",
                             "--run-name", HOSTILE + "\nkey = 1", "--gpu", hostile_profile(tmp_path))
    except AssertionError:
        pytest.skip("the profile loader refuses a name with newlines")
    if code == 2:  # a profile schema may refuse the name: one line, exit 2, is as safe
        assert len(err.strip().splitlines()) == 1
        return
    assert code == 0, err
    cfg = tomllib.loads(out)  # parses: nothing injected a key or a table
    assert "key" not in cfg and set(cfg) <= {"job", "model", "optimizer", "lr_scheduler", "training", "parallelism",
                                             "checkpoint", "activation_checkpoint", "compile", "quantize"}
    head = out.split("\n\n", 1)[0]
    assert all(line.startswith("#") for line in head.splitlines())
