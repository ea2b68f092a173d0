"""dev/gpu_check.sh: the GPU check's every step, run on the CPU at tiny sizes (--dry-run), as it runs on a GPU."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

STEPS = [
    "machine",
    "copy",
    "convert",
    "decode",
    "update",
    "grpo",
    "grpo-compiled",
    "decode-0.5b",
    "decode-1.5b",
    "grpo-0.5b",
    "grpo-1.5b",
    "ppo-precision",
    "ppo-budget",
    "tier",
    "ppo-verifier",
    "dpo",
    "sft",
    "mismatch",
]
RUNS = ["grpo", "grpo-compiled", "grpo-0.5b", "grpo-1.5b", "ppo-verifier", "dpo", "sft"]


def test_the_dry_run_passes_every_step_and_leaves_four_files(tmp_path):
    out = tmp_path / "out"
    temp = tmp_path / "temp"
    temp.mkdir()
    proc = subprocess.run(
        ["bash", "dev/gpu_check.sh", "--dry-run", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "TMPDIR": str(temp)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(os.listdir(out)) == ["check.log", "runs.tar.gz", "summary.json", "tier.log"]
    # its run folders and weights went with it: runs.tar.gz holds their logs
    assert not list(temp.glob("gpu-check-*"))
    steps = json.loads((out / "summary.json").read_text())["steps"]
    assert list(steps) == STEPS and all(step["ok"] for step in steps.values())
    assert steps["tier"]["tests"] >= 7 and steps["tier"]["failures"] == 0
    assert steps["grpo"]["accuracy"] == "0.000 -> 0.000" and steps["grpo"]["median time/generate"] > 0
    assert all(isinstance(steps[name]["memory_plan_gib"], float) for name in RUNS)
    update = steps["update"]
    for micro in (2, 8):  # the dry run's 8 rows: micro-batches of 2 and one of 8
        for phase in (
            "reference, float32 weights",
            "reference, bf16 linear weights",
            "policy forward and backward",
        ):
            assert update[f"{phase}, micro-batch {micro} ms"] > 0
    # one tiny seed in bf16-mixed: three evaluations (steps 0, 1, 2) and a KL for each third of 2 steps
    assert list(steps["ppo-precision"]["runs"]) == ["ppo-bf16-mixed-0"]
    assert all(
        len(run["accuracy"]) == 3 and run["kl_per_completion"]
        for run in steps["ppo-precision"]["runs"].values()
    )
    # the search's one tiny budget, 16 completions (2 steps), seed 0
    assert [(run["completions"], run["seed"]) for run in steps["ppo-budget"]["runs"]] == [(128, 0)]
    # float32: the sampler agrees with the trainer to rounding; under the nucleus the gap is -log(mass kept)
    plain, nucleus = steps["mismatch"]["rows"]
    assert plain["mismatch/max_log_ratio"] < 1e-4
    assert (
        nucleus["mean_log_ratio"] == pytest.approx(nucleus["predicted"], abs=1e-4)
        and nucleus["predicted"] > 0.01
    )
    for path in ("plain", "compiled"):
        row = steps["decode"][f"{path} 16 rows"]
        assert 0 < row["fraction_of_bound"] < 1 and row["token_steps"] == [32, 32, 32]
    assert steps["grpo-compiled"]["accuracy"] == "0.000 -> 0.000"
    assert steps["grpo-1.5b"]["steps"] == 2 and steps["decode-1.5b"]["plain 16 rows"]["token_steps"] == [
        32,
        32,
        32,
    ]


def test_without_cuda_the_real_check_is_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "dev/gpu_check.py", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        proc.returncode == 2
        and proc.stderr == "error: no CUDA device here; --dry-run runs the steps on the CPU\n"
    )
