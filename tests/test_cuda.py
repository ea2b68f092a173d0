"""The cuda tier: what must hold on the GPU the scripts are written for, in bf16-mixed with the default --kernels.

`pytest -m cuda` on a CUDA machine runs it (dev/gpu_check.sh does); where CUDA is absent it is skipped. With
CUDA_TIER_DEVICE=cpu the same tests run on the CPU with the kernels off, the code CUDA runs by default: that is how
`dev/gpu_check.sh --dry-run` checks the tier itself on a machine without a GPU. Tolerances are bf16's where a number
is computed twice by different kernels, and none where the same kernels compute it the same way.
"""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

# cuBLAS's deterministic mode, before its first handle
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import common  # noqa: E402
import dpo  # noqa: E402
import grpo  # noqa: E402
from infra import kernels  # noqa: E402
from infra import models  # noqa: E402
from task import tasks  # noqa: E402
from test_dpo import tiny_args as dpo_tiny_args  # noqa: E402
from test_grpo import spy_on_loss  # noqa: E402
from test_grpo import tiny_args as grpo_tiny_args  # noqa: E402
from conftest import PAIRS, REPO, assert_resume_is_exact, digit_fraction, metrics_of, run_script  # noqa: E402

DEVICE = os.environ.get("CUDA_TIER_DEVICE", "cuda")
# auto is off on CUDA: the CPU stand-in takes that plain path too
KERNELS = "auto" if DEVICE == "cuda" else "off"
BF16 = dict(device=DEVICE, precision="bf16-mixed", kernels=KERNELS)
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="no CUDA on this machine"),
]


def grpo_args(tmp_path, **overrides) -> grpo.Args:
    """test_grpo.py's tiny run, in bf16-mixed on DEVICE."""
    return grpo_tiny_args(tmp_path, **BF16, **overrides)


def test_the_first_update_has_ratio_one_and_dpo_starts_at_ln_2(tmp_path, monkeypatch):
    # μ = 2: log π_θold comes from a forward of its own before the first update; the same weights, kernels and
    # batch give the same numbers, so ρ = 1 and nothing clips
    calls = spy_on_loss(monkeypatch)
    grpo.main(
        grpo_args(tmp_path / "grpo", steps=1, beta=0.1, num_iterations=2, temperature=0.7),
        reward_fn=digit_fraction,
    )
    log_ratio = calls[0]["logprobs"] - calls[0]["old"]
    assert log_ratio.abs().max().item() <= 1e-3, log_ratio.abs().max().item()
    # DPO: the policy is its reference at step 1, so every margin is 0 and the loss -log σ(0) = ln 2
    dpo_run = dpo.main(dpo_tiny_args(tmp_path / "dpo", steps=1, **BF16))
    assert metrics_of(dpo_run)[0]["loss"] == pytest.approx(math.log(2), abs=1e-3)


def test_shared_prompt_log_probs_equal_the_concatenated_forward(tokenizer):
    model = models.load_model("tiny", len(tokenizer), torch.device(DEVICE), "bf16-mixed", seed=0)
    ids, mask = tasks.tokenize_prompts(tokenizer, ["What is 3 + 4?", "What is 12 + 45? Think."], DEVICE)
    completions = torch.randint(10, 60, (4, 5), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    repeats = torch.tensor([1, 3], device=DEVICE)
    shared, _ = common.completion_logprobs(model, ids, mask, completions, repeats, share_prompt=True)
    concatenated, _ = common.completion_logprobs(model, ids, mask, completions, repeats, share_prompt=False)
    assert torch.allclose(shared, concatenated, atol=3e-2), (shared - concatenated).abs().max().item()


def test_one_micro_batch_of_8_and_8_of_1_give_the_same_gradient(tmp_path, monkeypatch):
    grads = []
    clip = torch.nn.utils.clip_grad_norm_

    def record_then_clip(parameters, max_norm):  # the gradient the loop hands to the optimizer
        parameters = list(parameters)
        grads.append(torch.cat([p.grad.flatten().float() for p in parameters]))
        return clip(parameters, max_norm)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", record_then_clip)
    for batch_size in (None, 1):
        grpo.main(
            grpo_args(tmp_path, steps=1, beta=0.1, batch_size=batch_size, save_model=False),
            reward_fn=digit_fraction,
        )
    assert grads[0].norm() > 1e-2  # a real policy gradient
    relative = ((grads[0] - grads[1]).norm() / grads[0].norm()).item()
    assert relative < 2e-2, relative  # bf16 matmuls over rows of 8 or of 1


def test_sampling_is_reproducible_for_a_seed(tokenizer):
    model = models.load_model("tiny", len(tokenizer), torch.device(DEVICE), "bf16-mixed", seed=0)
    ids, mask = tasks.tokenize_prompts(tokenizer, ["What is 3 + 4?", "What is 12 + 45? Think."], DEVICE)
    draws = []
    for _ in range(2):
        generator = torch.Generator(device=DEVICE).manual_seed(7)
        draws.append(
            common.sample_completions(
                model,
                ids,
                mask,
                4,
                16,
                tokenizer.eos_token_id,
                tokenizer.pad_token_id,
                temperature=1.0,
                generator=generator,
            )
        )
    assert torch.equal(draws[0], draws[1])
    assert len({tuple(row) for row in draws[0].tolist()}) > 1  # sampled, not greedy


def test_resume_is_exact_with_deterministic_algorithms(tmp_path):
    # warn_only would leave cuDNN attention's backward non-deterministic
    torch.use_deterministic_algorithms(True)
    try:
        assert_resume_is_exact(
            tmp_path,
            grpo.main,
            lambda out, **kw: grpo_args(out, beta=0.1, eval_every=2, **kw),
            reward_fn=digit_fraction,
        )
    finally:
        torch.use_deterministic_algorithms(False)


def test_the_plain_log_prob_path_is_the_one_that_runs(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a kernel ran")

    pieces = []
    real = common._piece_logprobs

    def record(logits, *args, **kwargs):
        pieces.append(logits.device.type)
        return real(logits, *args, **kwargs)

    monkeypatch.setattr(kernels, "token_logprobs", refuse)
    monkeypatch.setattr(kernels, "cpu_bf16_decoding", refuse)
    monkeypatch.setattr(common, "_piece_logprobs", record)
    grpo.main(grpo_args(tmp_path, steps=1, save_model=False), reward_fn=digit_fraction)
    assert pieces and set(pieces) == {torch.device(DEVICE).type}


TINY = (
    "--model",
    "tiny",
    "--steps",
    "2",
    "--device",
    DEVICE,
    "--precision",
    "bf16-mixed",
    "--kernels",
    KERNELS,
)
EVAL = ("--eval-size", "8")
SMOKE_RUNS = {
    "grpo": ("grpo.py", *EVAL),
    "dpo": ("dpo.py", "--dataset", PAIRS, *EVAL),
    "ppo-verifier": ("ppo.py", "--reward", "verifier", *EVAL),
    "sft": ("sft.py", "--num-demonstrations", "20", *EVAL),
    "reward_model": ("reward_model.py", "--dataset", PAIRS),  # held-out pairs, no --eval-size
    "variants-ipo": ("variants.py", "--algo", "ipo", "--dataset", PAIRS, *EVAL),
    "variants-rloo": ("variants.py", "--algo", "rloo", "--max-new-tokens", "8", *EVAL),
    "prm": ("prm.py", *EVAL),
}


def assert_finite_run(output_dir) -> None:
    """One run folder, whose every logged number is finite, with its eval.json."""
    (run_dir,) = list(output_dir.iterdir())
    rows = metrics_of({"run_dir": str(run_dir)})
    assert rows
    for row in rows:
        numbers = [v for v in row.values() if isinstance(v, (int, float))]
        assert all(math.isfinite(v) for v in numbers), row
    assert json.loads((run_dir / "eval.json").read_text())["steps"] == 2


@pytest.mark.parametrize("name", list(SMOKE_RUNS))
def test_every_scripts_tiny_run_ends_with_finite_metrics(tmp_path, name):
    script, *options = SMOKE_RUNS[name]
    proc = run_script(
        script, *options, *TINY, "--output-dir", str(tmp_path / "runs"), RLHF_CACHE=str(tmp_path / "cache")
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_finite_run(tmp_path / "runs")


def test_torchrun_with_one_rank_and_fsdp_runs(tmp_path):
    # one rank joins a group of one (nccl on CUDA, gloo on a CPU) and shards over it
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "1",
        "grpo.py",
        *TINY,
        *EVAL,
        "--prompts-per-step",
        "2",
        "--group-size",
        "4",
        "--fsdp",
        "--output-dir",
        str(tmp_path / "runs"),
    ]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_finite_run(tmp_path / "runs")
