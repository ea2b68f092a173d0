#!/usr/bin/env bash
# The whole pipeline from a model that meets the task as a base model does (plain prompts, no chat
# template): SFT, then GRPO on the verifier; SFT -> reward model (on pairs sampled from the SFT model)
# -> PPO; and GRPO on the same reward model at PPO's number of samples. Prints one markdown table.
#   bash scripts/pipeline.sh [OUT_DIR] [options for every stage]
# About 2 hours on 2 CPU cores with the embedded model (PPO's 40 steps of 128 most of it). Extra options go to every stage (--device cuda, --seed 1).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/pipeline}
shift || true
mkdir -p "$OUT"
last() { ls -d "$1"/*/ | tail -1; }

python sft.py --prompt-format plain --output-dir "$OUT/sft" "$@"
SFT=$(last "$OUT/sft")model
# after SFT the policy is peaked: a 5x lower lr and 10 steps of 16 prompts (grpo.py's docstring says why)
python grpo.py --model "$SFT" --lr 2e-6 --prompts-per-step 16 --steps 10 --output-dir "$OUT/grpo" "$@"
python reward_model.py --model "$SFT" --output-dir "$OUT/rm" "$@"
RM=$(last "$OUT/rm")model
python ppo.py --model "$SFT" --reward-model "$RM" --output-dir "$OUT/ppo" "$@"
# PPO samples 128 completions per step for 40 steps = 5,120; GRPO's defaults sample as many (16 x 8 x 40)
python grpo.py --model "$SFT" --reward-model "$RM" --eval-every 0 --output-dir "$OUT/grpo-rm" "$@"

python - "$OUT" <<'EOF'
import glob, json, sys
out = sys.argv[1]
def result(stage):  # None for a stage that has not finished
    found = sorted(glob.glob(f"{out}/{stage}/*/eval.json"))
    return json.load(open(found[-1])) if found else None
def metrics(stage):
    found = sorted(glob.glob(f"{out}/{stage}/*/metrics.jsonl"))
    return [json.loads(l) for l in open(found[-1])] if found else []
def passk(r):
    return f"{r['pass@8_before']:.3f} -> {r['pass@8_after']:.3f}" if "pass@8_after" in r else ""
sft, grpo, rm, ppo, grpo_rm = (result(s) for s in ("sft", "grpo", "rm", "ppo", "grpo-rm"))
print("| stage | held-out accuracy | pass@8 | wall time |")
print("| --- | --- | --- | --- |")
if sft:
    at = lambda key: f"{sft[key]:.3f}" if key in sft else ""
    print(f"| base model, plain prompts | {sft['accuracy_before']:.3f} | {at('pass@8_before')} | |")
    print(f"| sft.py | {sft['accuracy_after']:.3f} | {at('pass@8_after')} | {sft['wall_time_s'] / 60:.1f} min |")
for name, r, key in (("sft.py -> grpo.py (verifier)", grpo, "accuracy"), ("sft.py -> reward_model.py", rm, "pair_accuracy"),
                     ("sft.py -> reward_model.py -> ppo.py", ppo, "accuracy"),
                     ("sft.py -> reward_model.py -> grpo.py --reward-model (PPO's 5,120 samples)", grpo_rm, "accuracy")):
    if r:
        label = "pair accuracy " if key == "pair_accuracy" else ""
        print(f"| {name} | {label}{r[key + '_before']:.3f} -> {r[key + '_after']:.3f} | {passk(r)} | {r['wall_time_s'] / 60:.1f} min |")
print()
print("| on the learned reward, 5,120 samples | score, first -> last 2 steps | verifier, first -> last 2 steps | KL, last 2 steps (PPO: k1 per completion; GRPO: k3 per token) |")
print("| --- | --- | --- | --- |")
for name, rows in (("ppo.py", metrics("ppo")), ("grpo.py --reward-model", metrics("grpo-rm"))):
    if rows:
        head, tail = rows[:2], rows[-2:]
        mean = lambda rs, k: sum(r[k] for r in rs if k in r) / max(1, sum(k in r for r in rs))
        print(f"| {name} | {mean(head, 'score'):.3f} -> {mean(tail, 'score'):.3f} | {mean(head, 'verifier'):.3f} -> {mean(tail, 'verifier'):.3f} | {mean(tail, 'kl'):.4f} |")
EOF
