#!/usr/bin/env bash
# DeepSeek-R1's multi-stage recipe (arXiv:2501.12948, §2.3) on the arithmetic task, each stage one of the project's
# scripts starting from the one before, measured stage by stage on the same held-out problems:
#   1. cold start: a little SFT on demonstrations                 sft.py --steps 20 (320 demonstrations)
#   2. reasoning RL on the verifier                               grpo.py (10 steps of 16 prompts x 8)
#   3. rejection sampling from the RL policy, then SFT on it      rft.py, one round (64 prompts x 8, 8 steps)
#   4. RL again                                                   grpo.py (10 steps of 16 prompts x 8)
# R1 fine-tunes the base model on its 800k rejection samples and adds non-reasoning data; here stage 3 fine-tunes
# the RL policy itself (its kept samples are in OUT/rft/<run>/kept.jsonl for `sft.py --dataset`).
#   bash scripts/r1_recipe.sh [OUT_DIR] [options for every stage]
#   MODEL=tiny bash scripts/r1_recipe.sh /tmp/r1 --eval-size 4 --max-new-tokens 8     # the plumbing, in seconds
# MODEL is the starting model (default smollm2). Extra options go to every stage (--device cuda, --seed 1). Prints one markdown table, also in OUT/stages.md.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/r1-recipe}
shift || true
mkdir -p "$OUT"
last() { ls -d "$1"/*/ | tail -1; }

python sft.py --model "${MODEL:-smollm2}" --steps 20 --output-dir "$OUT/sft" "$@"
SFT=$(last "$OUT/sft")model
# after SFT the policy is peaked: a 5x lower lr and 10 steps of 16 prompts (grpo.py's docstring says why)
python grpo.py --model "$SFT" --lr 2e-6 --prompts-per-step 16 --steps 10 --output-dir "$OUT/grpo" "$@"
GRPO=$(last "$OUT/grpo")model
python rft.py --model "$GRPO" --steps 8 --steps-per-round 8 --lr 2e-6 --output-dir "$OUT/rft" "$@"
RFT=$(last "$OUT/rft")model
python grpo.py --model "$RFT" --lr 2e-6 --prompts-per-step 16 --steps 10 --output-dir "$OUT/grpo-2" "$@"

python - "$OUT" <<'EOF' | tee "$OUT/stages.md"
import glob, json, sys

out = sys.argv[1]
stages = [
    ("1. cold-start SFT", "sft"),
    ("2. GRPO", "grpo"),
    ("3. rejection sampling + SFT (RFT, one round)", "rft"),
    ("4. GRPO again", "grpo-2"),
]
print("| stage | held-out accuracy before -> after | pass@8 before -> after | wall time |")
print("| --- | --- | --- | --- |")
for name, folder in stages:
    found = sorted(glob.glob(f"{out}/{folder}/*/eval.json"))
    if not found:
        continue
    r = json.load(open(found[-1]))
    passk = f"{r['pass@8_before']:.3f} -> {r['pass@8_after']:.3f}" if "pass@8_after" in r else ""
    print(f"| {name} | {r['accuracy_before']:.3f} -> {r['accuracy_after']:.3f} | {passk} | {r['wall_time_s'] / 60:.1f} min |")
EOF
