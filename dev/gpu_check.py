"""The GPU check's measurements; dev/gpu_check.sh brings what the machine lacks, then runs this.

    python dev/gpu_check.py --out DIR                 # on a CUDA machine
    python dev/gpu_check.py --dry-run --out DIR       # the same steps on the CPU at tiny sizes

Steps, each timed and recorded in DIR/summary.json (ok, seconds, and what it measured):
  machine   the GPU, its driver, and the versions of Python, torch and transformers
  copy      the device-to-device copy bandwidth (bytes read and written per second)
  convert   the embedded model from its GGUF file to safetensors (once)
  decode    one sampling call at GRPO's default batch (128 rows) and at half of it (64): milliseconds per token step
            of the plain sampler and of the compiled decode step (--decode compiled, infra/decoding.py; its first
            call, which compiles, left out), against the floor of reading every weight once per step at the copy
            bandwidth measured above
  update    one GRPO update at the default batch, by phase: the reference's log-probs with float32 weights and with
            its linear weights in bf16 (infra/launches.py), the policy's forward and backward, AdamW; in micro-batches
            of 32 rows and in one of 128; milliseconds and the allocated memory at each phase's start and peak
  grpo, grpo-compiled, dpo, ppo-verifier, sft
            the scripts on the embedded model, GRPO at its defaults (and with --decode compiled): held-out accuracy
            before -> after, wall time, seconds per step (generation and training apart where the script logs
            them), generated tokens per second, peak memory (torch.cuda.max_memory_allocated) beside what
            scripts/memory_plan.py predicts for the same command
  decode-0.5b, decode-1.5b, grpo-0.5b, grpo-1.5b
            the same for a 0.5B and a 1.5B shape with random weights (configs/qwen2.5-*.json): GRPO 4 steps
  mismatch  scripts/mismatch.py: the sampler's log-probs (the cached decode) against the trainer's (the full
            forward) at GRPO's default batch, bf16-mixed and float32, and under a nucleus (top-p 0.9)
  ppo-precision
            `ppo.py --reward verifier` at its defaults (128 completions a step) for 10 steps, seeds 0, 1, 2, in
            bf16-mixed (the GPU's default): held-out accuracy at steps 0, 5, 10 and the KL per completion over
            each third of each run, to tell whether PPO learns on the GPU at its batch (docs/ppo.md)
  ppo-budget
            scripts/ppo_budget.py at 640 completions (5 steps of 128, ppo.py's batch), seeds 0, 1, 2: whether PPO's
            critic explains the returns (explained variance > 0 over the last quarter) and its accuracy rises on
            every seed there, the first step of the clip, KL and GAE studies at a budget where PPO learns
            (docs/ppo.md; the studies themselves: `ppo_budget.py --budgets 640 --then-studies`, about 30 min)
  tier      `pytest -m cuda`: the cuda tier, every script's smoke run among it
DIR also gets check.log (this whole console), tier.log and runs.tar.gz (each run's logs, metrics and eval.json):
4 files, whatever a machine lets come back. The runs themselves go to a temporary folder.
--part runs one part (PARTS below: machine, speed, sizes, ppo, ppo-knobs, tests, model), each one command of at most
8 minutes with machine and copy first; --budget-s stops starting runs when it is spent.
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# The runs on the embedded model (GPU) and their tiny stand-ins (--dry-run): script and options.
SIZE = [
    "--steps",
    "4",
    "--eval-size",
    "16",
    "--pass-k",
    "0",
    "--no-save-model",
]  # random weights: time, memory
GPU_RUNS = {
    "grpo": ["grpo.py"],
    "grpo-compiled": ["grpo.py", "--decode", "compiled"],
    "grpo-0.5b": ["grpo.py", "--model", "configs/qwen2.5-0.5b.json", *SIZE],
    "grpo-1.5b": ["grpo.py", "--model", "configs/qwen2.5-1.5b.json", *SIZE],
    "ppo-verifier": ["ppo.py", "--reward", "verifier", "--steps", "10"],  # 10 of its 128-completion steps
    "dpo": ["dpo.py"],
    "sft": ["sft.py"],
}
TINY = ["--model", "tiny", "--steps", "2", "--eval-size", "8"]
DRY_RUNS = {
    "grpo": ["grpo.py", *TINY, "--prompts-per-step", "2", "--group-size", "4"],
    "grpo-compiled": [
        "grpo.py",
        *TINY,
        "--prompts-per-step",
        "2",
        "--group-size",
        "4",
        "--decode",
        "compiled",
    ],
    "grpo-0.5b": ["grpo.py", *TINY, "--prompts-per-step", "2", "--group-size", "4", "--no-save-model"],
    "grpo-1.5b": ["grpo.py", *TINY, "--prompts-per-step", "2", "--group-size", "4", "--no-save-model"],
    "ppo-verifier": ["ppo.py", "--reward", "verifier", *TINY],
    "dpo": ["dpo.py", *TINY, "--dataset", "tests/data/pairs.jsonl"],
    "sft": ["sft.py", *TINY, "--num-demonstrations", "20"],
}
# a stuck run costs the rest of the check
RUN_LIMIT_S = {
    "grpo": 300,
    "grpo-compiled": 300,
    "grpo-0.5b": 150,
    "grpo-1.5b": 200,
    "ppo-verifier": 200,
    "dpo": 150,
    "sft": 120,
}
# The check in parts, each one command of at most 8 minutes on an H100, what matters most first in each; every part
# starts with `machine` and `copy`. all: every part, in this order.
PARTS = {
    "machine": [],  # machine and copy alone: a first call that carries the first half of the model (gpu_check.sh)
    "speed": ["convert", "decode", "update", "grpo", "grpo-compiled"],
    "sizes": ["decode-0.5b", "decode-1.5b", "grpo-0.5b", "grpo-1.5b"],
    "ppo": ["convert", "ppo-precision"],
    "ppo-knobs": ["convert", "ppo-budget"],
    "tests": ["tier"],
    "model": ["convert", "ppo-verifier", "dpo", "sft", "mismatch"],
}
# PPO on the verifier at its defaults, as docs/ppo.md's decisive table ran it, in the GPU's default precision: 10 steps
# of 128 completions, about 2 minutes a seed on an H100 (a step costs about 2.7 GRPO steps on the CPU)
PPO_PRECISION = ["ppo.py", "--reward", "verifier", "--steps", "10", "--eval-every", "5", "--pass-k", "0"]
DRY_PPO_PRECISION = ["ppo.py", "--reward", "verifier", *TINY, "--eval-every", "1", "--pass-k", "0"]
# the search at 640 completions (5 steps of 128), where PPO learns on the CPU on every seed (docs/ppo.md): 3 runs. The
# studies there (ppo_budget.py --then-studies: the clip, KL and GAE rows, 10 more settings x 3 seeds = 30 runs) are
# over one part's 8 minutes: an estimate of 22-30 min on an H100 at 45-60 s a run (not measured), a session of its own
PPO_BUDGET = ["scripts/ppo_budget.py", "--budgets", "640", "--seeds", "0", "1", "2"]
DRY_PPO_BUDGET = [
    "scripts/ppo_budget.py",
    "--budgets",
    "128",
    "--seeds",
    "0",
    "--model",
    "tiny",
    "--eval-size",
    "8",
]


class Check:
    """The summary and the logs of one check, written to `out` as they come."""

    def __init__(self, out: Path, dry_run: bool, budget_s: float):
        self.out = out
        self.deadline = time.time() + budget_s
        # run folders and logs; runs.tar.gz packs them
        self.work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
        self.dry_run = dry_run
        self.device = "cpu" if dry_run else "cuda"
        self.summary = {
            "dry_run": dry_run,
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "steps": {},
        }
        self.env = {**os.environ, "RLHF_CACHE": str(self.work / "cache"), "PYTHONUNBUFFERED": "1"}
        if dry_run:
            self.env["CUDA_TIER_DEVICE"] = "cpu"

    def step(self, name: str, measure) -> dict:
        """Run `measure()` (a dict of what it measured), record it with its time and whether it raised."""
        print(f"== {name}", flush=True)
        start = time.time()
        try:
            record = {"ok": True, **measure()}
        except Exception as e:  # a failed step is recorded and the check goes on to the next
            record = {"ok": False, "error": f"{type(e).__name__}: {e}"[-2000:]}
        record["seconds"] = round(time.time() - start, 1)
        self.summary["steps"][name] = record
        print(json.dumps(record, indent=1), flush=True)
        self.write()
        self.pack()  # after every step: a check stopped at a time limit still leaves what it has
        return record

    def run(self, name: str, command: list[str], limit_s: int) -> subprocess.CompletedProcess:
        """`command` from the repository root, its output in work/<name>.log; a non-zero exit raises, and so does
        running past `limit_s` or past the check's own deadline."""
        limit_s = min(limit_s, self.deadline - time.time())
        if limit_s < 30:
            raise TimeoutError("skipped: too little of --budget-s left")
        log = self.work / f"{name}.log"
        with open(log, "w") as f:
            proc = subprocess.run(
                command,
                cwd=REPO,
                env=self.env,
                stdout=f,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=limit_s,
            )
        if proc.returncode != 0:
            raise RuntimeError(f"exit {proc.returncode}: ...{log.read_text()[-1500:]}")
        return proc

    def write(self) -> None:
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=2) + "\n")

    def pack(self) -> None:
        """work/ (logs, metrics.jsonl, eval.json, args.json; no weights) into runs.tar.gz."""
        keep = (".log", ".jsonl", ".json", ".txt", ".xml")
        with tarfile.open(self.out / "runs.tar.gz", "w:gz") as tar:
            for path in sorted(self.work.rglob("*")):
                if (
                    path.is_file()
                    and path.suffix in keep
                    and "cache" not in path.parts
                    and "model" not in path.parts
                ):
                    tar.add(path, arcname=str(path.relative_to(self.work)))


# ---- the steps ------------------------------------------------------------------------------------------------------
def machine(check: Check) -> dict:
    import torch
    import transformers

    record = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu_cores": os.cpu_count(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        record.update(
            {
                "gpu": props.name,
                "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                "multiprocessors": props.multi_processor_count,
                "cuda": torch.version.cuda,
            }
        )
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        )
        record["driver"] = smi.stdout.strip()
    else:
        record["processor"] = platform.processor() or platform.machine()
    return record


def copy_bandwidth(check: Check) -> dict:
    """Bytes read and written per second by a device-to-device copy of a large buffer (the median of 10)."""
    import torch

    size = 2**30 if check.device == "cuda" else 2**26
    source = torch.empty(size, dtype=torch.uint8, device=check.device)
    target = torch.empty_like(source)
    times = []
    for _ in range(13):
        synchronize(check.device)
        start = time.perf_counter()
        target.copy_(source)
        synchronize(check.device)
        times.append(time.perf_counter() - start)
    seconds = sorted(times[3:])[len(times[3:]) // 2]
    check.bandwidth = 2 * size / seconds
    return {"bytes": size, "gb_per_s": round(check.bandwidth / 1e9, 1)}


def synchronize(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def tier(check: Check) -> dict:
    """pytest -m cuda; passed and failed counted from its junit file."""
    junit = check.work / "tier.xml"
    log = check.work / "tier.log"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "cuda",
        "tests/test_cuda.py",
        "-q",
        "-rfE",
        "-p",
        "no:cacheprovider",
        f"--junitxml={junit}",
    ]
    # the test suite runs each script's tiny run on the CPU already, and --fsdp under torchrun on 2 CPU ranks
    # (tests/test_distributed.py): one smoke run here checks the test, and the torchrun test is left to the GPU
    if check.dry_run:
        command += ["-k", "every_scripts and grpo or not (every_scripts or torchrun)"]
    elif importlib.util.find_spec("xdist"):  # 4 processes share the GPU: the smoke runs are mostly start-up
        command += ["-n", "4"]
    with open(log, "w") as f:
        subprocess.run(
            command,
            cwd=REPO,
            env=check.env,
            stdout=f,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=max(30, check.deadline - time.time()),
        )
    text = junit.read_text()
    counts = {
        k: int(re.search(rf'{k}="(\d+)"', text).group(1)) for k in ("tests", "failures", "errors", "skipped")
    }
    failed = re.findall(r'<testcase classname="[^"]*" name="([^"]+)"[^>]*>\s*<(?:failure|error)', text)
    (check.out / "tier.log").write_text(log.read_text())
    if counts["failures"] or counts["errors"] or counts["skipped"] or counts["tests"] == 0:
        raise RuntimeError(f"{counts}; failed: {failed}")
    return counts


def convert(check: Check) -> dict:
    """The embedded model from its GGUF file, converted once (timed apart from the runs)."""
    if check.dry_run:
        return {"model": "tiny"}
    check.run(
        "convert", [sys.executable, "-c", "from infra import models; print(models.smollm2_checkpoint())"], 300
    )
    return {"model": "smollm2"}


def training_run(check: Check, name: str) -> dict:
    """One script's run: its summary numbers, its per-step times, and the memory plan's prediction for it."""
    argv = (DRY_RUNS if check.dry_run else GPU_RUNS)[name]
    output_dir = check.work / name
    command = [sys.executable, *argv, "--device", check.device, "--output-dir", str(output_dir)]
    plan_command = [
        sys.executable,
        "scripts/memory_plan.py",
        name.split("-")[0],
        *argv[1:],
        "--device",
        check.device,
    ]
    # on the CPU, beside the run: it builds the models on the meta device
    plan = subprocess.Popen(
        plan_command, cwd=REPO, env=check.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        check.run(name, command, RUN_LIMIT_S[name])
    except BaseException:
        plan.kill()
        raise
    (run_dir,) = list(output_dir.iterdir())
    result = json.loads((run_dir / "eval.json").read_text())
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    record = {
        "command": "python " + " ".join(argv),
        "wall_time_s": result["wall_time_s"],
        "steps": result["steps"],
        "peak_memory_gib": round(result["memory/peak_gb"], 3),
    }
    for key in ("accuracy", "pass@8"):
        if f"{key}_before" in result:
            record[key] = f"{result[f'{key}_before']:.3f} -> {result[f'{key}_after']:.3f}"
    for key in (
        "time/step",
        "time/generate",
        "time/score",
        "time/train",
        "time/update",
        "tokens_per_second/generate",
    ):
        values = sorted(row[key] for row in rows if key in row)
        if values:
            record[f"median {key}"] = round(values[len(values) // 2], 4)
    plan_out, plan_err = plan.communicate(timeout=120)
    total = re.search(r"^total\s+([\d.]+)", plan_out, re.M)
    record["memory_plan_gib"] = float(total.group(1)) if total else plan_err.strip()[-300:]
    return record


def decode(check: Check, model_name: str = "smollm2") -> dict:
    """Milliseconds per token step of one sampling call, 8 samples a prompt and 32 new tokens, bf16-mixed on CUDA:
    the plain sampler and the compiled step, at 128 rows (GRPO's default batch) and 64, against the floor of every
    weight read once per step, in bf16, at the measured bandwidth. `model_name`: the embedded model, or a config
    file's random weights (configs/)."""
    import torch

    from infra import decoding
    from infra import models
    from infra import runs
    from task import tasks

    name = "tiny" if check.dry_run else model_name
    runs.CACHE_DIR = Path(check.env["RLHF_CACHE"])
    tokenizer = models.load_tokenizer(name)
    device = torch.device(check.device)
    precision = "fp32" if check.dry_run else "bf16-mixed"
    model = models.load_model(name, len(tokenizer), device, precision, seed=0)
    weight_bytes = 2 * sum(p.numel() for p in model.parameters())
    floor = weight_bytes / check.bandwidth
    record = {"bf16_weight_mb": round(weight_bytes / 1e6, 1), "floor_ms_per_step": round(1e3 * floor, 4)}
    # the dry run times 2 prompts: the steps' plumbing, not a CPU's speed
    for prompts in (2,) if check.dry_run else (16, 8):
        problems = tasks.heldout_problems(prompts)
        ids, mask = tasks.tokenize_prompts(tokenizer, [p.prompt for p in problems], device)
        for path in ("plain", "compiled"):
            if path == "compiled":
                model.decoder = decoding.CompiledDecoder(model)
            row = time_sampling(check, model, tokenizer, ids, mask)
            row["fraction_of_bound"] = float(f"{floor / (row['ms_per_token_step'] / 1e3):.3g}")
            record[f"{path} {prompts * 8} rows"] = row
            if path == "compiled":
                del model.decoder
    return record


def time_sampling(check: Check, model, tokenizer, ids, mask) -> dict:
    """Four sampling calls from seeds 0-3, the first (a warm-up, or the compilation) left out."""
    import torch

    import common

    times, steps = [], []
    for seed in range(4):
        generator = torch.Generator(device=check.device).manual_seed(seed)
        synchronize(check.device)
        start = time.perf_counter()
        completions = common.sample_completions(
            model,
            ids,
            mask,
            8,
            32,
            tokenizer.eos_token_id,
            tokenizer.pad_token_id,
            temperature=1.0,
            generator=generator,
        )
        synchronize(check.device)
        times.append(time.perf_counter() - start)
        steps.append(completions.shape[1])
    seconds_per_step = sum(times[1:]) / sum(steps[1:])
    return {
        "token_steps": steps[1:],
        "first_call_s": round(times[0], 2),
        "ms_per_token_step": round(1e3 * seconds_per_step, 3),
        "tokens_per_second": round(ids.shape[0] * 8 / seconds_per_step),
    }


def update(check: Check) -> dict:
    """One GRPO update at the default batch on the embedded model, bf16-mixed: 16 prompts of 40 tokens and 8
    completions of 32 each (random ids: the work, not the numbers). Milliseconds, the median of 3 after a warm-up,
    of the reference's log-probs (its weights float32, cast by autocast at every forward, or stored in bf16 as
    infra/launches.py stores them) and of the policy's forward and backward over the micro-batches and its AdamW
    step, in micro-batches of 32 rows (--batch-size 32, the default) and in one of 128 (--batch-size None); and the
    peak memory of each, above what was allocated when it started, to place the memory plan's gap."""
    import torch

    import common
    import grpo
    from infra import launches
    from infra import models
    from infra import runs

    name = "tiny" if check.dry_run else "smollm2"
    runs.CACHE_DIR = Path(check.env["RLHF_CACHE"])
    tokenizer = models.load_tokenizer(name)
    device = torch.device(check.device)
    policy = models.load_model(name, len(tokenizer), device, "bf16-mixed", seed=0)
    cast = common.frozen_copy(policy)
    stored = common.frozen_copy(policy)
    launches.matmul_weights_in_bf16(stored)
    optimizer, _ = common.make_optimizer(policy, 1e-6)
    prompts, prompt_tokens, group, completion_tokens = (2, 8, 4, 8) if check.dry_run else (16, 40, 8, 32)
    generator = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(0, len(tokenizer), (prompts, prompt_tokens), generator=generator)
    completion_ids = torch.randint(
        0, len(tokenizer), (prompts * group, completion_tokens), generator=generator
    )
    sequences = (prompt_ids.to(device), torch.ones_like(prompt_ids).to(device), completion_ids.to(device))
    rows = prompts * group
    # the policy, its AdamW state and both references stay allocated throughout: 0.50 + 1.00 + 0.50 + 0.30 GiB
    record = {"rows": rows, "memory_gib_at_start_and_peak": {}}

    def reference_pass(reference, slices):
        with torch.no_grad():
            for s in slices:
                grpo.group_logprobs(reference, sequences, s, group, 1.0)

    def forward_backward(slices):
        for s in slices:
            logprobs, entropy = grpo.group_logprobs(policy, sequences, s, group, 1.0, True)
            (logprobs.mean() * (s.stop - s.start) / rows).backward()

    def optimizer_step():
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def timed(key: str, work) -> float:
        """Seconds of work(); on CUDA the GiB allocated when it starts and at its peak, recorded under `key`."""
        if check.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            at_start = torch.cuda.memory_allocated()
        synchronize(check.device)
        start = time.perf_counter()
        work()
        synchronize(check.device)
        if check.device == "cuda":
            pair = [round(at_start / 2**30, 3), round(torch.cuda.max_memory_allocated() / 2**30, 3)]
            record["memory_gib_at_start_and_peak"][key] = pair
        return time.perf_counter() - start

    for micro in (rows // 4, rows):
        slices = [slice(i, i + micro) for i in range(0, rows, micro)]
        times = collections.defaultdict(list)
        for _ in range(4):  # the first a warm-up
            for label, reference in (("float32 weights", cast), ("bf16 linear weights", stored)):
                key = f"reference, {label}, micro-batch {micro}"
                times[key].append(timed(key, lambda: reference_pass(reference, slices)))
            key = f"policy forward and backward, micro-batch {micro}"
            times[key].append(timed(key, lambda: forward_backward(slices)))
            times["AdamW step"].append(timed("AdamW step", optimizer_step))
        for key, seconds in times.items():
            record[f"{key} ms"] = round(1e3 * sorted(seconds[1:])[1], 2)
    return record


def ppo_precision(check: Check) -> dict:
    """PPO on the verifier at its defaults, seeds 0, 1, 2 in bf16-mixed (one seed on a dry run): each run's
    held-out accuracy at every evaluation and its KL per completion averaged over each third of its steps.
    A run that fails or meets the budget is recorded as such, and the others still run."""
    argv = DRY_PPO_PRECISION if check.dry_run else PPO_PRECISION
    seeds = (0,) if check.dry_run else (0, 1, 2)
    runs = {}
    for precision in ("bf16-mixed",):
        for seed in seeds:
            name = f"ppo-{precision}-{seed}"
            output_dir = check.work / name
            options = [
                "--precision",
                precision,
                "--seed",
                str(seed),
                "--device",
                check.device,
                "--no-save-model",
            ]
            try:
                check.run(name, [sys.executable, *argv, *options, "--output-dir", str(output_dir)], 240)
            except (RuntimeError, TimeoutError, subprocess.TimeoutExpired) as e:
                runs[name] = {"error": str(e)[-300:]}
                continue
            (run_dir,) = list(output_dir.iterdir())
            result = json.loads((run_dir / "eval.json").read_text())
            kl = [json.loads(line)["kl"] for line in open(run_dir / "metrics.jsonl")]
            third = max(1, len(kl) // 3)
            runs[name] = {
                "accuracy": [evaluation["accuracy"] for evaluation in result["evals"]],
                "kl_per_completion": [
                    round(sum(kl[i : i + third]) / third, 3) for i in range(0, len(kl), third)
                ],
                "wall_time_s": result["wall_time_s"],
            }
    return {"command": "python " + " ".join(argv) + " --precision P --seed S", "runs": runs}


def ppo_budget(check: Check) -> dict:
    """scripts/ppo_budget.py's search at one budget: each seed's accuracy, start and end, and its critic's explained
    variance over the last quarter of its steps."""
    argv = DRY_PPO_BUDGET + ["--pass-k", "1"] if check.dry_run else PPO_BUDGET
    out = check.work / "ppo-budget"
    check.run("ppo-budget", [sys.executable, *argv, "--device", check.device, "--out", str(out)], 470)
    rows = [json.loads(line) for line in open(out / "search.jsonl")]
    return {
        "command": "python " + " ".join(argv),
        "runs": [
            {
                "completions": row["completions"],
                "seed": row["seed"],
                "accuracy": f"{row['accuracy_before']:.3f} -> {row['accuracy']:.3f}",
                "explained_variance_last_quarter": row["explained_variance (last quarter)"],
                "wall_time_s": row["wall_time_s"],
            }
            for row in rows
        ],
    }


def mismatch(check: Check) -> dict:
    """scripts/mismatch.py on this device: the gap between the sampler's log-probs and the trainer's."""
    settings = ["fp32:off:1.0", "bf16-mixed:off:1.0", "bf16-mixed:off:0.9"]
    sizes = []
    if check.dry_run:
        settings = ["fp32:off:1.0", "fp32:off:0.9"]
        sizes = ["--model", "tiny", "--prompts", "2", "--group-size", "2", "--batches", "1"]
    out = check.work / "mismatch.json"
    command = [sys.executable, "scripts/mismatch.py", *sizes, "--device", check.device, "--out", str(out)]
    check.run("mismatch", [*command, "--settings", *settings], 240)
    return {"rows": json.loads(out.read_text())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", default=os.environ.get("OUT") or f"runs/gpu-check-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    parser.add_argument("--dry-run", action="store_true", help="the same steps on the CPU at tiny sizes")
    parser.add_argument("--part", choices=("all", *PARTS), default="all")
    parser.add_argument("--budget-s", type=float, default=900, help="stop starting runs when this is spent")
    options = parser.parse_args()
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    console = open(out / "check.log", "w")
    sys.stdout = Tee(sys.stdout, console)
    import torch

    if not options.dry_run and not torch.cuda.is_available():
        print("error: no CUDA device here; --dry-run runs the steps on the CPU", file=sys.stderr)
        return 2
    check = Check(out, options.dry_run, options.budget_s)
    check.bandwidth = math.nan
    steps = {
        "machine": lambda: machine(check),
        "copy": lambda: copy_bandwidth(check),
        "tier": lambda: tier(check),
        "convert": lambda: convert(check),
        "ppo-precision": lambda: ppo_precision(check),
        "ppo-budget": lambda: ppo_budget(check),
        "decode": lambda: decode(check),
        "decode-0.5b": lambda: decode(check, "configs/qwen2.5-0.5b.json"),
        "decode-1.5b": lambda: decode(check, "configs/qwen2.5-1.5b.json"),
        "update": lambda: update(check),
        "mismatch": lambda: mismatch(check),
        **{name: functools.partial(training_run, check, name) for name in GPU_RUNS},
    }
    parts = list(PARTS) if options.part == "all" else [options.part]
    for name in ["machine", "copy", *(name for part in parts for name in PARTS[part])]:
        if name in check.summary["steps"]:  # convert, once
            continue
        if (
            name != "convert"
            and "convert" in check.summary["steps"]
            and not check.summary["steps"]["convert"]["ok"]
        ):
            continue  # no embedded model: the steps on it cannot run
        check.step(name, steps[name])
    shutil.rmtree(check.work, ignore_errors=True)  # runs.tar.gz holds what it had; the weights go with it
    failed = [name for name, record in check.summary["steps"].items() if not record["ok"]]
    print(
        f"gpu check: {len(check.summary['steps']) - len(failed)} steps ok, failed: {failed or 'none'}; {out}"
    )
    return 1 if failed else 0


class Tee:
    """A stream that writes to several."""

    def __init__(self, *streams):
        self.streams = streams

    def write(self, text: str) -> None:
        for stream in self.streams:
            stream.write(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


if __name__ == "__main__":
    sys.exit(main())
