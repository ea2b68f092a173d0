#!/usr/bin/env bash
# An offline method most of the way, then PPO on a reward model for the last mile, against each stage alone:
#   1. DPO on the verifier's pairs of the starting model's samples          dpo.py
#   2. a reward model on pairs of the same kind                             reward_model.py
#   3. PPO from the DPO policy on that reward model                         ppo.py --model <1> --reward-model <2>
#   4. PPO alone: from the starting model, on the same reward model         ppo.py --reward-model <2>
# Prints one markdown table (held-out accuracy before -> after each run), also in OUT/stages.md.
#   bash scripts/dpo_then_ppo.sh [OUT_DIR] [options for every stage]      # e.g. --seed 1
#   PPO_OPTIONS="--lr 2e-6" bash scripts/dpo_then_ppo.sh runs/dpo-ppo    # options for the PPO stages alone
#   DPO_OPTIONS="--pass-k 0" bash scripts/dpo_then_ppo.sh runs/dpo-ppo    # options for the DPO stage alone
# MODEL is the starting model (default smollm2).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/dpo-then-ppo}
shift || true
mkdir -p "$OUT"
last() { ls -d "$1"/*/ | tail -1; }
START=${MODEL:-smollm2}
read -r -a PPO_EXTRA <<< "${PPO_OPTIONS:-}"
read -r -a DPO_EXTRA <<< "${DPO_OPTIONS:-}"

python dpo.py --model "$START" --output-dir "$OUT/dpo" "${DPO_EXTRA[@]}" "$@"
DPO=$(last "$OUT/dpo")model
python reward_model.py --model "$START" --output-dir "$OUT/rm" "$@"
RM=$(last "$OUT/rm")model
python ppo.py --model "$DPO" --reward-model "$RM" --output-dir "$OUT/dpo-ppo" "${PPO_EXTRA[@]}" "$@"
python ppo.py --model "$START" --reward-model "$RM" --output-dir "$OUT/ppo" "${PPO_EXTRA[@]}" "$@"

python - "$OUT" <<'PY' | tee "$OUT/stages.md"
import glob, json, sys

out = sys.argv[1]
stages = [("DPO alone", "dpo"), ("DPO, then PPO on the reward model", "dpo-ppo"), ("PPO alone", "ppo")]
print("| run | held-out accuracy before -> after | wall time |")
print("| --- | --- | --- |")
for name, folder in stages:
    found = sorted(glob.glob(f"{out}/{folder}/*/eval.json"))
    if found:
        r = json.load(open(found[-1]))
        print(f"| {name} | {r['accuracy_before']:.3f} -> {r['accuracy_after']:.3f} | {r['wall_time_s'] / 60:.1f} min |")
PY
