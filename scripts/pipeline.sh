#!/usr/bin/env bash
# The whole pipeline from a model that meets the task as a base model does (plain prompts, no chat
# template): SFT, then GRPO on the verifier; SFT -> reward model (on pairs sampled from the SFT model)
# -> PPO; and GRPO on the same reward model at PPO's number of samples. Prints one markdown table.
#   bash scripts/pipeline.sh [OUT_DIR] [options for every stage]
# About 1 hour on 2 CPU cores with the embedded model. Extra options go to every stage (--device cuda, --seed 1).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/pipeline}
shift || true
mkdir -p "$OUT"
last() { ls -d "$1"/*/ | tail -1; }

python sft.py --prompt-format plain --output-dir "$OUT/sft" "$@"
SFT=$(last "$OUT/sft")model
python grpo.py --model "$SFT" --output-dir "$OUT/grpo" "$@"
python reward_model.py --model "$SFT" --output-dir "$OUT/rm" "$@"
RM=$(last "$OUT/rm")model
python ppo.py --model "$SFT" --reward-model "$RM" --output-dir "$OUT/ppo" "$@"
# PPO samples 8 completions per step for 40 steps = 320; GRPO samples 4 x 8 = 32 per step: 10 steps
python grpo.py --model "$SFT" --reward-model "$RM" --steps 10 --eval-every 0 --output-dir "$OUT/grpo-rm" "$@"

python - "$OUT" <<'EOF'
import glob, json, sys
out = sys.argv[1]
def result(stage):
    return json.load(open(sorted(glob.glob(f"{out}/{stage}/*/eval.json"))[-1]))
def metrics(stage):
    return [json.loads(l) for l in open(sorted(glob.glob(f"{out}/{stage}/*/metrics.jsonl"))[-1])]
sft, grpo, rm, ppo, grpo_rm = (result(s) for s in ("sft", "grpo", "rm", "ppo", "grpo-rm"))
print("| stage | held-out accuracy | wall time |")
print("| --- | --- | --- |")
print(f"| base model, plain prompts | {sft['accuracy_before']:.3f} | |")
print(f"| sft.py | {sft['accuracy_after']:.3f} | {sft['wall_time_s'] / 60:.1f} min |")
print(f"| sft.py -> grpo.py (verifier) | {grpo['accuracy_after']:.3f} | {grpo['wall_time_s'] / 60:.1f} min |")
print(f"| sft.py -> reward_model.py | pair accuracy {rm['pair_accuracy_after']:.3f} | {rm['wall_time_s'] / 60:.1f} min |")
print(f"| sft.py -> reward_model.py -> ppo.py | {ppo['accuracy_after']:.3f} | {ppo['wall_time_s'] / 60:.1f} min |")
print(f"| sft.py -> reward_model.py -> grpo.py --reward-model (PPO's 320 samples) | {grpo_rm['accuracy_after']:.3f} | {grpo_rm['wall_time_s'] / 60:.1f} min |")
print()
print("| on the learned reward, 320 samples | score, first -> last 2 steps | verifier, first -> last 2 steps | KL, last 2 steps (PPO: k1 per completion; GRPO: k3 per token) |")
print("| --- | --- | --- | --- |")
for name, rows in (("ppo.py", metrics("ppo")), ("grpo.py --reward-model", metrics("grpo-rm"))):
    head, tail = rows[:2], rows[-2:]
    mean = lambda rs, k: sum(r[k] for r in rs if k in r) / max(1, sum(k in r for r in rs))
    print(f"| {name} | {mean(head, 'score'):.3f} -> {mean(tail, 'score'):.3f} | {mean(head, 'verifier'):.3f} -> {mean(tail, 'verifier'):.3f} | {mean(tail, 'kl'):.4f} |")
EOF
