"""Bad configs fail with one line naming the problem, before any process group starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("torch")

import yaml

from reference_trainer import launch
from reference_trainer.config import ConfigError, build_config, validate
from tests.trainer.helpers import TINY_GPT, trainer_env

BASE = {"run_name": "t", "model": TINY_GPT, "layout": {"dp": 2, "micro_batch": 2, "global_batch": 8}}
TINY_FLAGS = ["--layers", "4", "--hidden", "64", "--heads", "4", "--vocab", "512", "--seq-len", "64"]


def with_(section: str, **changes) -> dict:
    return {**BASE, section: {**BASE.get(section, {}), **changes}}


@pytest.mark.parametrize("data, message", [
    ({**BASE, "optimizer": {}}, "optimizer: unknown key"),
    (with_("training", step=3), "training.step: unknown key"),
    (with_("checkpoint", interval=2, keep=1), "checkpoint.keep: unknown key"),
    (with_("model", hiden=64), "model.hiden: unknown key"),
    ({**BASE, "model": {"layers": 8}}, "model.hidden: missing: a shape needs layers, hidden, heads (given: layers)"),
    ({**BASE, "model": {"layers": 8, "hidden": 64}}, "model.heads: missing: a shape needs layers, hidden, heads"),
    (with_("layout", global_batch=6), "layout.global_batch=6: must be divisible by dp*micro_batch=2*2=4"),
    (with_("layout", tp=3), "layout.tp=3: must divide model heads=4"),
    ({**with_("layout", pp=2, vpp=3, global_batch=16), "model": {**TINY_GPT, "layers": 9}},
     "interleaving needs layers=9 divisible by pp*vpp=6"),
    (with_("layout", pp=2, dp=1, global_batch=2), "1F1B needs micro-batches per step m=1 >= pp=2"),
    (with_("layout", pp=8, dp=1), "at most layers=4 stages"),
    (with_("layout", zero_stage=4), "zero_stage=4"),
    (with_("training", steps="many"), "training.steps='many': expected an integer"),
    (with_("training", precision="fp8"), "training.precision='fp8'"),
    (with_("checkpoint", keep_last=0), "checkpoint.keep_last=0: at least 1"),
    (with_("data", path="/no/such/tokens.bin"), "data.path='/no/such/tokens.bin': no such file"),
    (with_("profile", hardware_profile="z100"), "profile.hardware_profile"),
    (with_("profile", memory_fraction=0), "profile.memory_fraction=0.0: a share of the GPU's memory above 0"),
    (with_("profile", memory_fraction=1.5), "profile.memory_fraction=1.5"),
    (with_("profile", memory_fraction=True), "profile.memory_fraction=True"),
])
def test_bad_config_names_the_key(data, message):
    with pytest.raises(ConfigError) as err:
        build_config(data)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_world_size_must_equal_dp_tp_pp():
    config = build_config(with_("layout", tp=2, global_batch=8))
    validate(config, world_size=4)
    with pytest.raises(ConfigError, match=r"world size 2 != dp\*tp\*pp\*cp: dp=2 tp=2 pp=1 cp=1 needs 4 processes"):
        validate(config, world_size=2)


def test_a_good_config_round_trips_through_yaml():
    from reference_trainer.config import config_to_dict

    config = build_config(with_("layout", zero_stage=3, recompute="full"))
    again = build_config(yaml.safe_load(yaml.safe_dump(config_to_dict(config))))
    assert again == config


def test_trainer_rejects_a_mismatched_world_before_starting(tmp_path):
    """Under torchrun's environment, before importing torch or starting a process group."""
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({**BASE, "runs_dir": str(tmp_path / "runs")}))
    env = trainer_env({"WORLD_SIZE": "3", "RANK": "0"})  # no MASTER_ADDR: a process group could not start
    proc = subprocess.run([sys.executable, "-m", "reference_trainer", "--config", str(path)], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: world size 3 != dp*tp*pp*cp: dp=2 tp=1 pp=1 cp=1 needs 2 processes"]
    assert not (tmp_path / "runs").exists()


def test_trainer_rejects_an_unknown_key(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({**BASE, "checkpoint": {"interval": 2, "every": 3}}))
    proc = subprocess.run([sys.executable, "-m", "reference_trainer", "--config", str(path)], env=trainer_env(),
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: checkpoint.every: unknown key; allowed: dir, interval, keep_last, auto_resume"]


@pytest.mark.parametrize("argv, message", [
    (["--dp", "3", "--global-batch", "8"], "layout.global_batch=8: must be divisible by dp*micro_batch=3*1=3"),
    (["--dp", "2", "--nproc-per-node", "4"], "world size 4 != dp*tp*pp*cp: dp=2 tp=1 pp=1 cp=1 needs 2 processes"),
    (["--tp", "3"], "layout.tp=3: must divide model heads=4"),
    (["--preset", "gpt5"], "preset='gpt5'"),
    (["--dp", "2", "--nnodes", "2"], "--nnodes=2: give --rdzv-endpoint"),
    (["--memory-fraction", "-0.5"], "profile.memory_fraction=-0.5: a share of the GPU's memory above 0 and at most 1"),
])
def test_launcher_rejects_with_one_line_and_exit_2(argv, message, capsys, tmp_path):
    rc = launch.main([*TINY_FLAGS, *argv, "--runs-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    assert not any(tmp_path.iterdir())  # nothing written, nothing launched


def test_launcher_rejects_an_unknown_key_in_its_config_file(capsys, tmp_path):
    path = tmp_path / "base.yaml"
    path.write_text(yaml.safe_dump({"layout": {"dp": 2, "mirco_batch": 2}}))
    assert launch.main(["--config", str(path), "--runs-dir", str(tmp_path / "runs")]) == 2
    assert capsys.readouterr().err.startswith("error: layout.mirco_batch: unknown key")


def test_launcher_dry_run_builds_the_torchrun_command(capsys, tmp_path):
    rc = launch.main([*TINY_FLAGS, "--dp", "2", "--pp", "2", "--micro-batch", "1", "--global-batch", "8",
                      "--steps", "3", "--zero", "1", "--recompute", "selective", "--run-name", "x",
                      "--runs-dir", str(tmp_path), "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0
    command = out.strip().splitlines()[-1].split()
    assert command[1:3] == ["-m", "torch.distributed.run"] and "--standalone" in command
    assert command[command.index("--nproc-per-node") + 1] == "4"
    assert command[-4:] == ["-m", "reference_trainer", "--config", str(tmp_path / "x" / "config.yaml")]
    config = yaml.safe_load(out[:out.rindex("\n", 0, len(out.rstrip()))])
    assert config["layout"]["zero_stage"] == 1 and config["layout"]["recompute"] == "selective"
    assert config["training"]["steps"] == 3 and config["model"]["layers"] == 4


def test_every_layout_dimension_is_a_launcher_flag():
    """The launcher's layout flags come from the planner's declaration (planner.core.layout):
    each dimension's flag lands in the config's layout section under the dimension's name."""
    from planner.core.layout import LAYOUT_DIMS

    p = launch.parser()
    for d in LAYOUT_DIMS:
        flags, _ = d.argparse_spec()
        if d.type is bool:
            argv, expected = [flags[0]], True
        elif d.type is str:
            argv, expected = [flags[0], d.choices[-1]], d.choices[-1]
        else:
            argv, expected = [flags[0], "2"], 2
        assert launch.config_dict(p.parse_args(argv))["layout"] == {d.name: expected}, d.name


def test_a_dimension_the_trainer_does_not_run_is_refused_unless_at_its_default():
    from planner.core.layout import LAYOUT_DIMS
    from reference_trainer.config import TRAINER_DIMS

    others = [d for d in LAYOUT_DIMS if d.name not in TRAINER_DIMS and d.type is int]
    if not others:
        pytest.skip("every declared dimension is one the trainer runs")
    name = others[0].name
    build_config(with_("layout", **{name: 1}))
    with pytest.raises(ConfigError, match=rf"layout\.{name}=2: the reference trainer does not run this dimension"):
        build_config(with_("layout", **{name: 2}))


def test_trainer_defaults_are_the_planners_declared_job_options():
    """LoRA r=8, alpha=16 on q_proj,v_proj (Hu et al. 2021, Sec. 7.1); three checkpoints kept."""
    config = build_config(BASE)
    assert (config.lora.r, config.lora.alpha, config.lora.targets) == (8, 16.0, ("q_proj", "v_proj"))
    assert config.training.mode == "pretrain" and config.attention == "flash" and config.checkpoint.keep_last == 3
