"""Where a GRPO step's CPU time goes, by operator: `grpo.py` under torch's profiler, its operators grouped.

    python dev/profile_grpo.py --prompts-per-step 4 --beta 0 --steps 3 --eval-size 2 --eval-every 0 --no-save-model

(docs/performance.md's GRPO command against TRL, 3 steps; add --precision bf16-mixed where auto picks fp32.)

Every argument is grpo.py's own. The profiler records the whole run: keep the evaluations small (--eval-size 2),
and read the first step as a warm-up inside the sums. Printed: the operators with the most self time, and their
sum in groups: the matrix multiplications (the linear layers: bf16 under bf16-mixed), attention, the log-softmax
and sampling arithmetic, AdamW and the gradient norm, the copies and casts, the elementwise rest. The profiler adds
a few microseconds to each operator: the steps run slower under it, and the many small operators read larger.
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import torch
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import grpo  # noqa: E402

GROUPS = {  # the first group whose word an operator's name holds
    "matmul": ("mm", "linear", "matmul", "addmm", "bmm", "baddbmm"),
    "attention": ("attention", "sdpa", "flash"),
    "softmax, log-probs, sampling": (
        "softmax",
        "logsumexp",
        "cumsum",
        "searchsorted",
        "gather",
        "sort",
        "topk",
    ),
    "AdamW, gradient norm": ("adam", "norm", "foreach"),
    "copies, casts": ("copy_", "to", "_to_copy", "contiguous", "cat", "index", "clone"),
}


def group_of(name: str) -> str:
    bare = name.removeprefix("aten::").lower()
    for group, words in GROUPS.items():
        if any(word in bare for word in words):
            return group
    return "elementwise and the rest"


def main(argv: list[str]) -> None:
    args = tyro.cli(grpo.Args, args=argv, prog="dev/profile_grpo.py")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        grpo.main(args)
    events = [e for e in profiler.key_averages() if e.key.startswith("aten::")]
    total = sum(e.self_cpu_time_total for e in events)
    print(f"\n{'operator':<44}{'self s':>9}{'share':>8}{'calls':>9}")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:20]:
        print(
            f"{e.key:<44}{e.self_cpu_time_total / 1e6:>9.2f}{e.self_cpu_time_total / total:>8.1%}{e.count:>9}"
        )
    groups = collections.Counter()
    for e in events:
        groups[group_of(e.key)] += e.self_cpu_time_total
    print(f"\n{'group':<44}{'self s':>9}{'share':>8}")
    for group, time_us in groups.most_common():
        print(f"{group:<44}{time_us / 1e6:>9.2f}{time_us / total:>8.1%}")


if __name__ == "__main__":
    main(sys.argv[1:])
