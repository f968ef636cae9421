"""planner export: every format parses (JSON, YAML, `bash -n`) and encodes the layout exactly; a
format that cannot express the layout is one line naming the field, exit code 2."""

import json
import re
import shlex
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cli.main import main
from planner.export.yamltext import dump

yaml = pytest.importorskip("yaml")  # PyYAML: the trainer extra installs it

# llama-33b (60 layers) on 128 A100s with every layout field pinned to something non-default:
# layers per virtual stage = 60 / (pp 4 x vpp 3) = 5; grad accum = 2048 / (dp 8 x mb 2) = 128.
PINNED = ["--params", "33B", "--gpus", "128", "--dp", "8", "--tp", "4", "--pp", "4", "--vpp", "3",
          "--micro-batch", "2", "--global-batch", "2048", "--zero", "1", "--recompute", "full",
          "--sequence-parallel", "--sharding", "full", "--precision", "fp16"]


def run(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def export(capsys, fmt, *argv):
    code, out, err = run(capsys, "export", "--format", fmt, *argv)
    assert code == 0, err
    return out, err


def bash_syntax_ok(tmp_path, text: str) -> None:
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    path = tmp_path / "script.sh"
    path.write_text(text)
    res = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr


def heredoc_yaml(script: str) -> dict:
    body = re.search(r"<<'PLANNER_RUN_CONFIG'\n(.*?)\nPLANNER_RUN_CONFIG\n", script, re.DOTALL).group(1)
    return yaml.safe_load(body)


def bash_arrays(script: str) -> dict[str, list[str]]:
    """NAME=( ... ) blocks of a script, each as its shell words."""
    return {m.group(1): shlex.split(m.group(2)) for m in re.finditer(r"^(\w+)=\(\n(.*?)^\)$", script, re.MULTILINE | re.DOTALL)}


def flags(words: list[str]) -> dict[str, str | bool]:
    out: dict[str, str | bool] = {}
    for i, w in enumerate(words):
        if w.startswith("--"):
            nxt = words[i + 1] if i + 1 < len(words) else None
            out[w] = nxt if nxt is not None and not nxt.startswith("--") else True
    return out


def estimate_layout(capsys, *argv) -> dict:
    """The layout `planner estimate` picks for the same flags (the contract export must encode)."""
    code, out, _ = run(capsys, "estimate", *argv, "--stack", "reference", "--format", "json")  # torchrun's stack
    assert code == 0
    return json.loads(out)


LAYOUT_KEYS = ("dp", "tp", "pp", "cp", "vpp", "ep", "micro_batch", "global_batch", "zero_stage", "recompute",
               "sequence_parallel", "schedule", "sharding", "offload")


def test_torchrun_script_and_run_config_encode_the_layout(capsys, tmp_path):
    out, _ = export(capsys, "torchrun", *PINNED)
    bash_syntax_ok(tmp_path, out)
    config = heredoc_yaml(out)
    want = estimate_layout(capsys, *PINNED)
    assert config["layout"] == {k: want["layout"][k] for k in LAYOUT_KEYS}
    assert config["layout"] | {} == {"dp": 8, "tp": 4, "pp": 4, "cp": 1, "vpp": 3, "ep": 1, "micro_batch": 2,
                                     "global_batch": 2048, "zero_stage": 1, "recompute": "full",
                                     "sequence_parallel": True, "schedule": "1f1b", "sharding": "full",
                                     "offload": "none"}
    assert config["training"]["precision"] == "fp16" and config["training"]["init_loss_scale"] == 2.0**16
    # steps = tokens / (global batch x sequence length), rounded up
    assert config["training"]["steps"] == -(-int(want["train"]["tokens"]) // (2048 * 2048))
    assert {k: config["model"][k] for k in ("layers", "hidden", "heads", "vocab", "seq_len")} == {
        "layers": 60, "hidden": 6656, "heads": 52, "vocab": 32000, "seq_len": 2048}
    launch = next(line for line in out.splitlines() if line.startswith("torchrun"))
    f = flags(shlex.split(launch))
    assert f["--nnodes"] == "16" and f["--nproc_per_node"] == "8" and f["--config"] == "$CONFIG"
    assert "-m reference_trainer" in launch
    assert "planner run --preset llama-33b --dp 8 --tp 4 --pp 4 --vpp 3 --micro-batch 2" in out


def test_run_config_is_accepted_by_the_reference_trainer(capsys):
    config_mod = pytest.importorskip("reference_trainer.config")
    if not hasattr(config_mod, "build_config"):
        pytest.skip("reference_trainer.config has no build_config")
    out, _ = export(capsys, "torchrun", *PINNED)
    cfg = config_mod.build_config(heredoc_yaml(out))
    assert (cfg.layout.tp, cfg.layout.pp, cfg.layout.vpp, cfg.layout.zero_stage) == (4, 4, 3, 1)


def test_megatron_arguments_encode_the_layout(capsys, tmp_path):
    out, _ = export(capsys, "megatron", *PINNED)
    bash_syntax_ok(tmp_path, out)
    arrays = bash_arrays(out)
    f = flags([w for words in arrays.values() for w in words])
    assert f["--tensor-model-parallel-size"] == "4" and f["--pipeline-model-parallel-size"] == "4"
    assert f["--num-layers-per-virtual-pipeline-stage"] == "5"  # 60 / (4 x 3)
    assert f["--micro-batch-size"] == "2" and f["--global-batch-size"] == "2048"
    assert f["--recompute-granularity"] == "full" and f["--recompute-method"] == "uniform"
    assert f["--sequence-parallel"] is True and f["--use-distributed-optimizer"] is True
    assert f["--fp16"] is True and f["--initial-loss-scale"] == "65536" and "--bf16" not in f
    assert f["--num-layers"] == "60" and f["--swiglu"] is True and f["--normalization"] == "RMSNorm"
    launch = out.strip().splitlines()[-1]
    assert "pretrain_gpt.py" in launch and all(f'"${{{name}[@]}}"' in launch for name in arrays)
    assert flags(shlex.split(launch.split(" pretrain_gpt.py")[0]))["--nnodes"] == "16"


def test_megatron_selective_recompute_and_no_distributed_optimizer(capsys):
    out, _ = export(capsys, "megatron", "--preset", "llama-13b", "--gpus", "16", "--tp", "2", "--pp", "2",
                    "--zero", "0", "--recompute", "selective", "--attention", "standard", "--no-sequence-parallel")
    f = flags([w for words in bash_arrays(out).values() for w in words])
    assert f["--recompute-granularity"] == "selective" and "--recompute-method" not in f
    assert "--use-distributed-optimizer" not in f and "--sequence-parallel" not in f
    assert "--num-layers-per-virtual-pipeline-stage" not in f or int(f["--num-layers-per-virtual-pipeline-stage"]) > 0
    assert f["--attention-backend"] == "unfused" and f["--bf16"] is True


def test_deepspeed_config_encodes_the_layout(capsys):
    argv = ["--preset", "llama-7b", "--gpus", "16", "--tp", "1", "--pp", "1", "--micro-batch", "4",
            "--global-batch", "1024", "--zero", "2", "--recompute", "full", "--precision", "fp16"]
    out, _ = export(capsys, "deepspeed", *argv)
    d = json.loads(out)
    # train_batch_size = micro-batch x accumulation x data-parallel ranks: 4 x 16 x 16 = 1024
    assert d["train_micro_batch_size_per_gpu"] == 4 and d["gradient_accumulation_steps"] == 16
    assert d["train_batch_size"] == 1024 == 4 * 16 * 16
    assert d["zero_optimization"]["stage"] == 2
    assert d["fp16"] == {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                         "hysteresis": 2, "min_loss_scale": 1}
    assert d["bf16"] == {"enabled": False}
    assert d["activation_checkpointing"]["number_checkpoints"] == 32
    out, _ = export(capsys, "deepspeed", "--preset", "llama-7b", "--gpus", "16", "--tp", "1", "--pp", "1",
                    "--zero", "3", "--recompute", "none")
    d = json.loads(out)
    assert d["bf16"] == {"enabled": True} and d["fp16"] == {"enabled": False}
    assert d["zero_optimization"]["stage"] == 3 and "activation_checkpointing" not in d


def test_slurm_script(capsys, tmp_path):
    out, _ = export(capsys, "slurm", *PINNED)
    bash_syntax_ok(tmp_path, out)
    sbatch = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)$", out, re.MULTILINE))
    assert sbatch["nodes"] == "16" and sbatch["gpus-per-node"] == "8" and sbatch["ntasks-per-node"] == "1"
    assert heredoc_yaml(out)["layout"]["vpp"] == 3
    launch = out.strip().splitlines()[-1]
    f = flags(shlex.split(launch))
    assert launch.startswith("srun") and f["--nnodes"] == "16" and f["--nproc_per_node"] == "8"


def test_slurm_spreads_a_partial_node_count_evenly(capsys):
    out, _ = export(capsys, "slurm", "--preset", "llama-7b", "--gpus", "12")
    sbatch = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)$", out, re.MULTILINE))
    assert (sbatch["nodes"], sbatch["gpus-per-node"]) == ("2", "6")


def test_a_rack_scale_nvlink_domain_launches_per_host(capsys, tmp_path):
    """GB200 NVL72: the cost model's node is the 72-GPU NVLink rack, but an operating system (and
    Slurm, torchrun, Kubernetes) sees a compute tray of 4 GPUs: 144 GPUs are 36 nodes of 4."""
    out, _ = export(capsys, "slurm", "--params", "70B", "--gpus", "144", "--gpu", "gb200-nvl72")
    bash_syntax_ok(tmp_path, out)
    sbatch = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)$", out, re.MULTILINE))
    assert (sbatch["nodes"], sbatch["gpus-per-node"]) == ("36", "4")
    f = flags(shlex.split(out.strip().splitlines()[-1]))
    assert (f["--nnodes"], f["--nproc_per_node"]) == ("36", "4")
    out, _ = export(capsys, "k8s", "--params", "70B", "--gpus", "144", "--gpu", "gb200-nvl72")
    specs = list(yaml.safe_load_all(out))[1]["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] + specs["Worker"]["replicas"] == 36
    gpus = specs["Worker"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    assert gpus == 4
    # 70 GPUs are not whole trays: refused in one line, as any count that does not split evenly.
    code, _, err = run(capsys, "export", "--format", "slurm", "--params", "70B", "--gpus", "70", "--gpu",
                       "gb200-nvl72")
    assert code == 2 and err.count("\n") == 1 and "gpus" in err


def test_k8s_manifest(capsys):
    out, _ = export(capsys, "k8s", *PINNED, "--image", "registry.example/trainer:1")
    config_map, job = yaml.safe_load_all(out)
    assert config_map["kind"] == "ConfigMap" and job["kind"] == "PyTorchJob"
    assert job["apiVersion"] == "kubeflow.org/v1"
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 15
    container = specs["Worker"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example/trainer:1"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert "--nnodes=16" in container["command"] and "--node_rank=$(RANK)" in container["command"]
    config = yaml.safe_load(config_map["data"]["run.yaml"])
    assert config["layout"]["tp"] == 4 and config["layout"]["recompute"] == "full"
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", job["metadata"]["name"])
    out, _ = export(capsys, "k8s", "--preset", "llama-7b", "--gpus", "8")
    _, job = yaml.safe_load_all(out)
    assert "Worker" not in job["spec"]["pytorchReplicaSpecs"]  # one node: the master alone


def test_export_takes_the_best_layout_the_format_can_express(capsys):
    out, err = export(capsys, "megatron", "--params", "33B", "--gpus", "128", "--stack", "fsdp2")
    f = flags([w for words in bash_arrays(out).values() for w in words])
    assert "note: the fastest layout" in err and "zero_stage=3" in err  # fsdp2's best is ZeRO-3
    assert "--tensor-model-parallel-size" in f and "--global-batch-size" in f


@pytest.mark.parametrize("argv, needle", [
    (["--format", "megatron", "--params", "33B", "--gpus", "128", "--zero", "3"], "zero_stage=3"),
    (["--format", "megatron", "--params", "33B", "--gpus", "128", "--pp", "2", "--schedule", "gpipe"],
     "schedule='gpipe'"),
    (["--format", "deepspeed", "--params", "33B", "--gpus", "64", "--dp", "8", "--tp", "4", "--pp", "2"], "tp=4"),
    (["--format", "deepspeed", "--params", "33B", "--gpus", "64", "--tp", "1", "--pp", "2"], "pp=2"),
    (["--format", "deepspeed", "--params", "33B", "--gpus", "128", "--recompute", "selective", "--attention",
      "standard"], "recompute='selective'"),
    (["--format", "torchrun", "--params", "33B", "--gpus", "128", "--gpu", "h100", "--precision", "fp8"],
     "precision='fp8'"),
    (["--format", "slurm", "--params", "33B", "--gpus", "13"], "gpus=13"),
    (["--format", "xml", "--params", "33B"], "invalid choice"),
    (["--format", "deepspeed", "--preset", "llama-7b", "--gpus", "8", "--mode", "lora"], "mode='lora'"),
    (["--format", "k8s", "--params", "33B", "--steps", "0"], "steps=0"),
])
def test_unexpressible_or_bad_input_is_one_line_and_exit_2(capsys, argv, needle):
    code, out, err = run(capsys, "export", *argv)
    assert code == 2 and out == ""
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_pinned_layout_that_does_not_fit_exits_3(capsys):
    code, out, err = run(capsys, "export", "--format", "torchrun", "--params", "33B", "--gpus", "128", "--tp", "1",
                         "--pp", "1", "--zero", "0", "--micro-batch", "8")
    assert code == 3 and out == "" and len(err.strip().splitlines()) == 1
    assert "nearest that fits" in err


# --- the YAML writer ---------------------------------------------------------------------------

keys = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)
text = st.text(st.sampled_from("abc xyz:#-'\"\\\t{}[],&*!|>%@`?01.eEnoyY大模型"), max_size=12)
scalars = st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(allow_nan=False,
                                                                               allow_infinity=False) | text
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
                      max_leaves=12)


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(keys, values, max_size=5))
def test_yaml_writer_round_trips_through_pyyaml(doc):
    assert yaml.safe_load(dump(doc)) == doc


def test_yaml_writer_quotes_what_yaml_1_1_would_misread():
    doc = {"a": "1f1b", "b": "on", "c": "no", "d": 6e-05, "e": "null", "f": "x\ny\n", "g": [{"h": 1, "i": [2]}]}
    assert yaml.safe_load(dump(doc)) == doc
    assert "d: 6.0e-05" in dump(doc)


def test_each_format_plans_for_the_stack_it_runs(capsys):
    """Without --stack, a format's plan is made for the stack it runs (the reference trainer for
    torchrun, Megatron-Core for megatron), which both run the ZeRO-1 pinned here."""
    from planner.export.formats import FORMATS, formats, get_format

    for fmt in ("torchrun", "megatron"):
        out, _ = export(capsys, fmt, *PINNED)
        assert "ZeRO-1" in out
    assert get_format("torchrun").stack == "reference" and get_format("megatron").stack == "megatron-core"
    assert tuple(formats()) == FORMATS  # one registry: the CLI's choices, the explorer's list
    assert {f.language for f in formats().values()} == {"bash", "json", "toml", "yaml"}


def test_pretraining_exports_llama2_hyperparameters_fine_tuning_its_own(capsys):
    """Touvron et al. 2023 (Llama 2), Sec. 2.2: AdamW beta2 0.95, eps 1e-5, weight decay 0.1, cosine
    to 10%, 2000 warm-up steps; Table 1: peak lr 3.0e-4 at 7B. Fine-tuning keeps lr 6e-5, beta2 0.999."""
    base = ["--params", "7B", "--gpus", "64", "--format", "deepspeed"]
    out, _ = export(capsys, "deepspeed", *base[:-2])
    cfg = json.loads(out)
    assert cfg["optimizer"]["params"] == {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-5, "weight_decay": 0.1}
    assert cfg["scheduler"]["params"]["warmup_num_steps"] == 2000 and cfg["scheduler"]["params"]["cos_min_ratio"] == 0.1
    out, _ = export(capsys, "deepspeed", *base[:-2], "--mode", "full-finetune", "--tokens", "1B")
    cfg = json.loads(out)
    assert cfg["optimizer"]["params"] == {"lr": 6e-5, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}
    out, _ = export(capsys, "megatron", "--params", "70B", "--gpus", "256")
    assert "--lr 0.00015" in out and "--adam-beta2 0.95" in out and "--lr-warmup-iters 2000" in out  # 70B: 1.5e-4


def test_an_export_above_95_percent_of_memory_is_refused_unless_forced(capsys):
    # llama-33b, dp 32 x tp 2 x pp 2 x vpp 5, micro-batch 2, ZeRO-1: 99% of an A100's 80 GiB (megatron-core)
    pins = ["--params", "33B", "--gpus", "128", "--tp", "2", "--pp", "2", "--vpp", "5", "--micro-batch", "2",
            "--zero", "1", "--recompute", "none"]
    code, out, err = run(capsys, "export", "--format", "megatron", *pins)
    assert code == 3 and out == "" and len(err.strip().splitlines()) == 1
    assert "at most 95% of the GPU's memory" in err and "--force" in err
    code, out, err = run(capsys, "export", "--format", "megatron", *pins, "--force")
    assert code == 0 and "--micro-batch-size 2" in out
    used = re.search(r"([0-9.]+) of 80 GiB per GPU", out)
    assert used and float(used.group(1)) / 80 > 0.95
    # unpinned, the best layout under the limit is written, and the note says why it is not the fastest
    code, out, err = run(capsys, "export", "--format", "megatron", "--params", "33B", "--gpus", "128")
    used = re.search(r"([0-9.]+) of 80 GiB per GPU", out)
    assert code == 0 and float(used.group(1)) / 80 <= 0.95
