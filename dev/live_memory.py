"""The memory plan against the tensors that are really alive: one GRPO-shaped training step, measured.

Peak RSS overstates what a run needs on CPU: glibc keeps memory that freed tensors gave back, so
RSS measures the allocator as much as the program. This script counts what the plan counts, the
bytes of live tensors, from the CPU allocator's own events (torch's profiler with
profile_memory=True, the CPU counterpart of torch.cuda.max_memory_allocated):
- one warm-up step first, so that AdamW's moments exist, as from step 2 of a run;
- then a profiled step: the reference's log-probs (with LoRA, the adapter switched off), the
  policy's log-probs with entropy, backward and AdamW.
Its peak above the step's start, plus the weights and the AdamW state already there, is compared
with the memory plan (scripts/memory_plan.py, as `python scripts/memory_plan.py grpo` prints it) at this batch: P
prompts of S tokens, G completions of T tokens.

Run:
    python dev/live_memory.py                 # the embedded model, full fine-tuning
    python dev/live_memory.py --lora-r 16
    python dev/live_memory.py --logprobs      # common.token_logprobs alone: 4 × 1,024 positions × 16,384 tokens
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import common  # noqa: E402
import memory_plan  # noqa: E402
from infra import launches  # noqa: E402
from infra import models  # noqa: E402


def peak_live_bytes(fn) -> int:
    """The highest sum of live bytes the CPU allocator reaches while fn() runs, above where it started."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    allocations = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
        key=lambda e: e.start_ns(),
    )
    live = peak = 0
    for event in allocations:  # +bytes on allocation, -bytes on free
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def logprob_path(rows: int, positions: int, vocabulary: int) -> None:
    """The peak of live bytes of common.token_logprobs, plain and with the kernel, on random float32 logits of
    (rows, positions + 1, vocabulary): a scoring call (no gradient), and a forward and backward."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(rows, positions + 1, vocabulary, generator=generator)
    labels = torch.randint(0, vocabulary, (rows, positions), generator=generator)
    size = rows * positions * vocabulary * 4
    for fast in (False, True):

        def scoring():
            with torch.no_grad():
                common.token_logprobs(logits, labels, kernels_on=fast)

        def forward_backward():
            leaf = logits.detach().requires_grad_()
            logprobs, _ = common.token_logprobs(leaf, labels, kernels_on=fast)
            logprobs.sum().backward()

        path = "kernel" if fast else "plain "
        for name, fn in (("scoring", scoring), ("forward and backward", forward_backward)):
            peak = peak_live_bytes(fn)
            print(
                f"{path} {name}: {peak / 1e6:.0f} MB above the logits' {size / 1e6:.0f} MB ({peak / size:.2f}×)"
            )


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--lora-r", type=int, default=0)
    parser.add_argument("--prompts", type=int, default=4, help="P (grpo.py's --prompts-per-step)")
    parser.add_argument("--group-size", type=int, default=8, help="G")
    parser.add_argument(
        "--prompt-tokens",
        type=int,
        default=30,
        help="S, prompt tokens (the plan's default is the longest held-out chat prompt, 40)",
    )
    parser.add_argument("--completion-tokens", type=int, default=32, help="T (--max-new-tokens)")
    parser.add_argument("--logprobs", action="store_true", help="measure common.token_logprobs alone instead")
    parser.add_argument(
        "--precision",
        choices=["fp32", "bf16-mixed"],
        default="fp32",
        help="bf16-mixed with --kernels off is what runs on CUDA",
    )
    parser.add_argument("--kernels", choices=["auto", "on", "off"], default="auto")
    args = parser.parse_args(argv)
    if args.logprobs:
        logprob_path(4, 1024, 16384)
        return {}
    P, G, S, T = args.prompts, args.group_size, args.prompt_tokens, args.completion_tokens
    tokenizer = models.load_tokenizer(args.model)
    lora = common.LoraOptions(lora_r=args.lora_r)
    kernels = models.resolve_kernels(args.kernels, torch.device("cpu"))
    policy = models.load_model(
        args.model, len(tokenizer), torch.device("cpu"), args.precision, kernels_on=kernels
    )
    reference = None if args.lora_r else common.frozen_copy(policy)
    if reference is not None and args.precision == "bf16-mixed":  # as models.load_policy stores it
        launches.matmul_weights_in_bf16(reference)
    if args.lora_r:
        policy = common.add_lora(policy, args.model, lora)
    policy.train()
    optimizer, _ = common.make_optimizer(policy, 1e-6)
    generator = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(0, len(tokenizer), (P, S), generator=generator)
    completion_ids = torch.randint(0, len(tokenizer), (P * G, T), generator=generator)
    batch = (prompt_ids, torch.ones_like(prompt_ids), completion_ids, torch.full((P,), G))

    def step():
        with torch.no_grad(), common.reference(policy, reference) as ref:
            common.completion_logprobs(ref, *batch)
        logprobs, _ = common.completion_logprobs(policy, *batch, with_entropy=True)
        logprobs.mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    held = sum(
        t.numel() * t.element_size() for m in (policy, reference) if m is not None for t in m.parameters()
    )
    held += sum(
        s.numel() * s.element_size()
        for state in optimizer.state.values()
        for s in state.values()
        if torch.is_tensor(s)
    )
    live = held + peak_live_bytes(step)
    config = memory_plan.model_config(args.model, len(tokenizer))
    held = [("policy", config, "lm", True)] + [("reference", config, "lm", False)] * (not args.lora_r)
    tokens = P * S + P * G * T
    plan = memory_plan.memory_plan(held, args.precision, lora, False, P * G, tokens, P * G * T, kernels)[
        "total_gb"
    ]
    print(
        f"live tensors at the peak: {live / 2**30:.2f} GiB; "
        f"the plan: {plan:.2f} GiB ({(plan - live / 2**30) / (live / 2**30):+.0%})"
    )
    return {"live_gb": live / 2**30, "plan_gb": plan}


if __name__ == "__main__":
    main()
