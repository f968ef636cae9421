"""The one prepared script for a short GPU slot (issue 40): probe, runs, calibration on half of the
runs, validation on the other half, everything packed into one archive plus a short summary.

    python3 benchmarks/gpu_session.py [--out DIR] [--base PROFILE] [--budget-s S] [--dry-run] [--fail STAGE]

It needs only what the GPU image has (python3 with torch, numpy, scipy, pynvml; no PyYAML, no
tomli-w, no matplotlib needed) and runs from a plain checkout: every step is ``sys.executable`` with
``PYTHONPATH`` set to this repository. Stages, each under its own limit and what is left of the
budget (default 330 s: 7 minutes of a slot with ~90 s for the machine's start and the copy back):

  device     torch's and NVML's view of the GPU (name, memory, driver, CUDA, torch) -> device.json;
             the datasheet profile is the one whose [gpu] model is the device's name (or --base),
             refused when its memory is not the device's (planner.calibration.probe.check_base)
  probe      planner probe --base that profile -> probed.toml (peaks kept, efficiencies measured)
  runs       12 short runs (benchmarks/trainer_gpu.py: 350M and 760M GPT-3 shapes, bf16, micro-batch
             2-16, recompute none/selective/full/quarter/half) -> runs/<name>/record.json, each
             written when it ends
  calibrate  planner calibrate on the even runs (the first of each pair: step time and its parts,
             leave-one-out) -> calibrated.toml, calibrate.txt
  validate   planner validate of the odd (held-out) runs with the probed and the calibrated profile
             -> validate-{probed,calibrated}.{txt,json}

Under --out (default $OUT, else runs/gpu-session) it leaves three files: gpu-session.tar.gz (the
whole working folder, repacked after every stage and whenever a run's record appears, so a slot cut
short keeps what it measured), summary.txt (the figures that matter) and session.log. The working
folder is --work (default: a fresh folder under the system's temporary folder). The exit code is
0 when every stage passed, 1 when any failed or was skipped for want of time, 2 on bad arguments.

--dry-run takes the same path on a CPU with a tiny fp32 model (no base profile: the probe fits the
CPU's peaks): under 2 minutes, for tests and rehearsal. --fail STAGE (or GPU_SESSION_FAIL=STAGE)
makes that stage fail as a broken one would: the stages that need it are skipped, the rest run,
the archive and summary are still written, and the exit code is 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from planner.calibration.profile_grid import stop_process_group  # noqa: E402  (after the path)

STAGES = ("device", "probe", "runs", "calibrate", "validate")
NEEDS = {"probe": ("device",), "runs": ("device",), "calibrate": ("probe",), "validate": ("calibrate",)}
LIMIT_S = {"device": 60, "probe": 90, "runs": 200, "calibrate": 90, "validate": 60}
MIN_LEFT_S = 10  # a stage that would start with less than this is skipped (and counts as failed)
ARCHIVE, SUMMARY, LOG = "gpu-session.tar.gz", "summary.txt", "session.log"


class Session:
    def __init__(self, out: Path, work: Path, budget_s: float, fail: str | None, base: str | None, dry: bool):
        self.out, self.work, self.fail, self.base, self.dry = out, work, fail, base, dry
        self.start = time.monotonic()
        self.deadline = self.start + budget_s
        self.status: dict[str, tuple[str, float]] = {}  # stage -> (ok / FAILED ... / skipped ..., seconds)
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get(
            "PYTHONPATH")])]), "PYTHONUNBUFFERED": "1"}
        self.env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `planner profile`: no spinning waits on a CPU

    def log(self, line: str) -> None:
        text = f"[{time.strftime('%H:%M:%S')} +{time.monotonic() - self.start:5.1f}s] {line}"
        print(text, flush=True)
        with (self.out / LOG).open("a") as fh:
            fh.write(text + "\n")

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def ready(self, stage: str) -> bool:
        """Whether ``stage`` may run: what it needs passed, and time is left. Else it is marked."""
        missing = [s for s in NEEDS.get(stage, ()) if self.status.get(s, ("",))[0] != "ok"]
        if missing:
            self.status[stage] = (f"skipped: {', '.join(missing)} did not pass", 0.0)
        elif self.left_s() < MIN_LEFT_S:
            self.status[stage] = (f"skipped: {self.left_s():.0f} s of the budget left", 0.0)
        else:
            return True
        self.log(f"{stage}: {self.status[stage][0]}")
        return False

    def run(self, stage: str, cmd: list[str], stdout: Path | None = None) -> bool:
        """One command of ``stage`` under min(its limit, what is left); output to the log (or to
        ``stdout``); the archive repacked whenever a run record appears. False when it failed."""
        if self.fail == stage:
            cmd = [sys.executable, "-c", f"import sys; sys.exit('injected failure of stage {stage} (--fail)')"]
        limit = max(1.0, min(LIMIT_S[stage], self.left_s()))
        self.log(f"{stage}: {' '.join(str(c) for c in cmd)} (limit {limit:.0f} s)")
        with (self.out / LOG).open("a") as log, (stdout.open("w") if stdout else open(os.devnull, "w")) as out:
            proc = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, env=self.env, stdout=out if stdout else log,
                                    stderr=log, start_new_session=True)
            end, seen = time.monotonic() + limit, self.records()
            try:
                while True:
                    try:
                        rc = proc.wait(timeout=min(5.0, max(0.1, end - time.monotonic())))
                        break
                    except subprocess.TimeoutExpired:
                        if time.monotonic() >= end:
                            stop_process_group(proc, grace_s=10.0)
                            self.log(f"{stage}: stopped at its limit of {limit:.0f} s")
                            return False
                        if self.records() != seen:  # a run just ended: its record goes into the archive now
                            seen = self.records()
                            self.pack()
            except BaseException:  # Ctrl-C or SIGTERM: no stage outlives the session
                stop_process_group(proc, grace_s=10.0)
                raise
        if rc != 0:
            self.log(f"{stage}: exit code {rc}")
        return rc == 0

    def records(self) -> list[str]:
        return sorted(str(p) for p in (self.work / "runs").glob("*/record.json"))

    def pack(self) -> None:
        """The working folder as one archive under --out, replaced atomically (checkpoints left out)."""
        tmp = self.out / f".{ARCHIVE}.tmp"
        skip = lambda t: None if "/checkpoints" in t.name or t.name.endswith("/run.lock") else t  # noqa: E731
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(self.work, arcname="gpu-session", filter=skip)
            if (self.out / LOG).exists():
                tar.add(self.out / LOG, arcname=f"gpu-session/{LOG}")
        os.replace(tmp, self.out / ARCHIVE)

    def stage(self, name: str, fn) -> None:
        if not self.ready(name):
            return
        t0 = time.monotonic()
        try:
            ok, why = fn(self)
        except Exception as exc:  # a bug of this script: the stage fails, the session goes on and says so
            ok, why = False, f"{type(exc).__name__}: {exc}"
        seconds = time.monotonic() - t0
        self.status[name] = ("ok" if ok else f"FAILED{': ' + why if why else ''}", seconds)
        self.log(f"{name}: {self.status[name][0]} ({seconds:.0f} s)")
        self.pack()


def _on_sigterm(signum, frame) -> None:
    raise SystemExit(143)


# --- the stages: each returns (passed, why not) ------------------------------------------------

def device_stage(s: Session) -> tuple[bool, str]:
    cmd = [sys.executable, __file__, "--device-json", s.work / "device.json"] + (["--base", s.base] if s.base else [])
    if s.dry:
        cmd.append("--dry-run")
    if not s.run("device", cmd):
        return False, "see session.log"
    info = json.loads((s.work / "device.json").read_text())
    s.base = info.get("base")
    s.log(f"device: {info['name']} ({info['memory_bytes'] / 2**30:.1f} GiB), driver {info['driver']}, CUDA "
          f"{info['cuda']}, torch {info['torch']}; base profile {s.base or '- (a CPU: the probe fits its peaks)'}")
    return True, ""


def probe_stage(s: Session) -> tuple[bool, str]:
    cmd = [sys.executable, "-m", "planner", "probe", "--out", s.work / "probed.toml", "--nprocs", "1", "--quick"]
    cmd += ["--device", "cpu"] if s.dry else ["--base", s.base]
    return s.run("probe", cmd, stdout=s.work / "probe.txt"), ""


def runs_stage(s: Session) -> tuple[bool, str]:
    cmd = [sys.executable, ROOT / "benchmarks" / "trainer_gpu.py", "--out", s.work / "runs"]
    cmd += ["--tiny", "--steps", "6"] if s.dry else ["--steps", "30", "--gpu", s.base]
    ok = s.run("runs", cmd, stdout=s.work / "runs.txt")
    return ok, "" if ok else f"{len(s.records())} of {len(SETTINGS)} records"


def halves(s: Session) -> tuple[list[str], list[str]]:
    """The finished runs to calibrate on (the first of each pair, even index) and to hold out."""
    done = {Path(p).parent.name: str(Path(p).parent) for p in s.records()}
    fit = [done[name] for name, *_ in SETTINGS[0::2] if name in done]
    held = [done[name] for name, *_ in SETTINGS[1::2] if name in done]
    return fit, held


def calibrate_stage(s: Session) -> tuple[bool, str]:
    fit, _ = halves(s)
    if not fit:
        return False, "no run to calibrate on"
    cmd = [sys.executable, "-m", "planner", "calibrate", *fit, "--base", s.work / "probed.toml",
           "--out", s.work / "calibrated.toml"]
    return s.run("calibrate", cmd, stdout=s.work / "calibrate.txt"), "see calibrate.txt and session.log"


def validate_stage(s: Session) -> tuple[bool, str]:
    _, held = halves(s)
    if not held:
        return False, "no held-out run"
    ok = True
    for profile in ("probed", "calibrated"):
        for fmt in ("json", "text"):
            cmd = [sys.executable, "-m", "planner", "validate", *held, "--gpu", s.work / f"{profile}.toml",
                   "--format", fmt]
            ok &= s.run("validate", cmd, stdout=s.work / f"validate-{profile}.{'json' if fmt == 'json' else 'txt'}")
    return ok, ""


# --- the summary --------------------------------------------------------------------------------

def _points(s: Session, profile: str) -> dict:
    path = s.work / f"validate-{profile}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def summary_lines(s: Session) -> list[str]:
    lines = []
    try:
        d = json.loads((s.work / "device.json").read_text())
        lines.append(f"device: {d['name']} ({d['memory_bytes'] / 2**30:.1f} GiB); driver {d['driver']}, CUDA "
                     f"{d['cuda']}, torch {d['torch']}; base profile {d.get('base') or '-'}")
    except (OSError, ValueError, KeyError):
        lines.append("device: unknown (the device stage did not pass)")
    lines.append("stages: " + "; ".join(f"{n} {st} ({sec:.0f} s)" for n, (st, sec) in s.status.items()))
    fit, held = halves(s)
    lines.append(f"runs: {len(s.records())} of {len(SETTINGS)} records; calibrated on {len(fit)} (even), "
                 f"held out {len(held)} (odd)")
    probed, calibrated = _points(s, "probed"), _points(s, "calibrated")
    for q, what, target in (("step_s", "step time", 0.10), ("peak_memory_bytes", "peak memory", 0.05)):
        got = {name: v.get("summary", {}).get(q) for name, v in (("probed", probed), ("calibrated", calibrated))}
        if got["calibrated"]:
            c, p = got["calibrated"], got["probed"]
            before = f"{p['mean_abs_error']:.1%} with the probed profile, " if p else ""
            verdict = "within" if c["worst_abs_error"] <= target else "NOT within"
            lines.append(f"held-out {what} |error| ({c['runs']} runs): {before}{c['mean_abs_error']:.1%} mean, "
                         f"{c['worst_abs_error']:.1%} worst calibrated: {verdict} {target:.0%}")
        else:
            lines.append(f"held-out {what}: not compared" + (" (a CPU's RSS is not what the planner predicts)"
                                                            if q == "peak_memory_bytes" and s.dry else ""))
    best = None
    for path in s.records():
        rec = json.loads(Path(path).read_text())
        if rec.get("mfu") is not None and (best is None or rec["mfu"] > best[0]):
            best = (rec["mfu"], rec["run_name"], rec["achieved_tflops_per_device"])
    lines.append(f"best MFU: {best[0]:.1%} ({best[1]}, {best[2]:.0f} TFLOP/s)" if best else "best MFU: n/a")
    factors = [line for line in _read(s.work / "calibrate.txt").splitlines()
               if line.startswith(("factors", "note:", "step time:"))]
    lines += [f"calibrate: {line}" for line in factors]
    failed = [n for n, (st, _) in s.status.items() if st != "ok"]
    lines.append(f"result: {'every stage passed' if not failed else 'FAILED: ' + ', '.join(failed)}; "
                 f"{time.monotonic() - s.start:.0f} s; archive {ARCHIVE}")
    return lines


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


# --- the device stage's own process: torch and NVML's view, the base profile checked -------------

def write_device_json(path: Path, base: str | None, dry: bool) -> int:
    from planner.calibration import probe
    from planner.errors import PlannerError
    from planner.hardware import get_profile

    info = probe.device_info("cpu" if dry else "cuda")
    if info.kind != "cpu":
        try:
            profile = get_profile(base) if base else probe.base_for(info)
            probe.check_base(profile, info)
        except PlannerError as exc:
            print(f"gpu_session: {exc}", file=sys.stderr)
            return 2
        base = profile.name
    data = {"kind": info.kind, "name": info.name, "memory_bytes": info.memory_bytes, "driver": info.driver,
            "cuda": info.cuda, "torch": info.torch, "base": base, "python": sys.version.split()[0]}
    try:
        smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        smi = None
    data["nvidia_smi"] = smi
    path.write_text(json.dumps(data, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    global SETTINGS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT") or "runs/gpu-session",
                    help="where the archive, summary.txt and session.log go (default: $OUT, else runs/gpu-session)")
    ap.add_argument("--work", help="the working folder (default: a fresh one under the temporary folder)")
    ap.add_argument("--base", help="the GPU's datasheet profile (default: the one named by the device's own name)")
    ap.add_argument("--budget-s", type=float, default=330.0,
                    help="seconds for the whole session (default 330: 7 minutes of a slot, start and copy included)")
    ap.add_argument("--dry-run", action="store_true", help="the same path on a CPU with a tiny model")
    ap.add_argument("--fail", default=os.environ.get("GPU_SESSION_FAIL") or None,
                    help=f"make this stage fail, to rehearse a broken one: {', '.join(STAGES)} (or GPU_SESSION_FAIL)")
    ap.add_argument("--device-json", help=argparse.SUPPRESS)  # the device stage's own process
    a = ap.parse_args(argv)
    if a.device_json:
        return write_device_json(Path(a.device_json), a.base, a.dry_run)
    if a.fail is not None and a.fail not in STAGES:
        print(f"gpu_session: --fail={a.fail!r}: one of {', '.join(STAGES)}", file=sys.stderr)
        return 2
    if not (a.budget_s > 0 and a.budget_s < 3600):
        print(f"gpu_session: --budget-s={a.budget_s}: seconds in (0, 3600)", file=sys.stderr)
        return 2
    from trainer_gpu import SETTINGS as settings

    SETTINGS = settings
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="gpu-session-"))
    work.mkdir(parents=True, exist_ok=True)
    for name in (ARCHIVE, SUMMARY, LOG):
        (out / name).unlink(missing_ok=True)
    s = Session(out, work, a.budget_s, a.fail, a.base, a.dry_run)
    import signal

    signal.signal(signal.SIGTERM, _on_sigterm)  # the stage in flight is stopped, the archive still packed
    s.log(f"gpu session: out {out}, work {work}, budget {a.budget_s:.0f} s, dry run {a.dry_run}, "
          f"python {sys.executable}" + (f", injected failure: {a.fail}" if a.fail else ""))
    try:
        for name, fn in (("device", device_stage), ("probe", probe_stage), ("runs", runs_stage),
                         ("calibrate", calibrate_stage), ("validate", validate_stage)):
            s.stage(name, fn)
    finally:
        lines = summary_lines(s)
        for folder in (out, work):  # beside the archive, and in it
            (folder / SUMMARY).write_text("\n".join(lines) + "\n")
        s.log("summary:\n" + "\n".join(lines))
        s.pack()
    return 0 if all(st == "ok" for st, _ in s.status.values()) and len(s.status) == len(STAGES) else 1


SETTINGS: list = []

if __name__ == "__main__":
    sys.exit(main())
