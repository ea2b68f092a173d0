#!/usr/bin/env bash
# Reward over-optimisation and what mitigates it. The pipeline's case (SFT model -> reward model -> ppo.py,
# where held-out accuracy falls from 0.915 to 0.180 while the learned score rises) is run again with each
# mitigation option of ppo_overoptimisation.py (ppo.py's loop with them), one at a time, everything else equal
# (seed 0, 40 steps, the same two models):
#   bash scripts/pipeline.sh runs/pipeline                            # first: the SFT model, the reward model, plain PPO
#   bash scripts/mitigations.sh runs/pipeline [OUT_DIR] [options for every run]
# About 15 minutes per run on 2 CPU cores with the embedded model; the ensemble first trains two more reward
# models (seeds 1 and 2, each on its own sampled pairs). A finished run is not rerun. Prints one markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
PIPE=${1:?usage: bash scripts/mitigations.sh PIPELINE_OUT [OUT_DIR] [options]}
OUT=${2:-runs/mitigations}
shift 2 || shift $#
mkdir -p "$OUT"
last() { ls -d "$1"/*/ | tail -1; }
SFT=$(last "$PIPE/sft")model
RM=$(last "$PIPE/rm")model
run() {  # NAME OPTIONS...: one ppo_overoptimisation.py run into OUT/NAME, skipped when it has finished
  local name=$1; shift
  ls "$OUT/$name"/*/eval.json > /dev/null 2>&1 && return
  python ppo_overoptimisation.py --model "$SFT" --reward-model "$RM" --eval-every 20 --pass-k 0 --no-save-model --output-dir "$OUT/$name" "$@" "${EXTRA[@]}"
}
EXTRA=("$@")
run verifier-weight --verifier-weight 1        # composite reward: the learned score + 1 x the verifier's 0/1
run kl-budget --kl-budget 1                    # stop at the first batch whose KL exceeds 1 nat per completion
run reward-clip --reward-clip 1                # the score standardised on the starting policy, clipped to [-1, 1]
run length-penalty --length-penalty 0.05       # 0.05 per completion token
run clip-verifier --reward-clip 1 --verifier-weight 1   # both: the verifier's 1 against a score clipped to [-1, 1]
for seed in 1 2; do
  ls "$OUT/rm-$seed"/*/eval.json > /dev/null 2>&1 || python reward_model.py --model "$SFT" --seed $seed --output-dir "$OUT/rm-$seed" "${EXTRA[@]}"
done
run ensemble-min --ensemble "$(last "$OUT/rm-1")model" "$(last "$OUT/rm-2")model"   # the worst of three reward models

python - "$PIPE" "$OUT" <<'EOF'
import glob, json, sys
pipe, out = sys.argv[1:]
def run(folder):  # (eval.json, metrics rows) of the last finished run in folder, or None
    found = sorted(glob.glob(f"{folder}/*/eval.json"))
    if not found:
        return None
    return json.load(open(found[-1])), [json.loads(l) for l in open(found[-1].replace("eval.json", "metrics.jsonl"))]
print("| run | held-out accuracy, step 0 -> 20 -> end | learned score (held-out greedy), start -> end | last 5 steps: score | verifier | KL per completion | length | steps trained |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for name, folder in (("no mitigation (the pipeline's ppo.py)", f"{pipe}/ppo"), ("--verifier-weight 1", f"{out}/verifier-weight"),
                     ("--kl-budget 1", f"{out}/kl-budget"), ("--reward-clip 1", f"{out}/reward-clip"),
                     ("--length-penalty 0.05", f"{out}/length-penalty"), ("--reward-clip 1 --verifier-weight 1", f"{out}/clip-verifier"),
                     ("--ensemble (min of 3)", f"{out}/ensemble-min")):
    found = run(folder)
    if found is None:
        continue
    result, rows = found
    at20 = next((f"{e['accuracy']:.3f}" for e in result["evals"] if e["step"] == 20), "(stopped)")
    tail = rows[-5:]
    mean = lambda key: sum(r[key] for r in tail) / len(tail)
    print(f"| {name} | {result['accuracy_before']:.3f} -> {at20} -> {result['accuracy_after']:.3f} | "
          f"{result['score_before']:.2f} -> {result['score_after']:.2f} | {mean('score'):.2f} | {mean('verifier'):.2f} | "
          f"{mean('kl'):.2f} | {mean('completion_length'):.1f} | {result.get('steps_trained', result['steps'])} |")
EOF
