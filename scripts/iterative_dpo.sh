#!/usr/bin/env bash
# Iterative DPO: rounds of sample -> label -> DPO, each round from the policy the round before left, which is also
# that round's reference (the online, iterative form: Xiong et al. 2024, arXiv:2312.11456; Meta's Llama 3 post-training
# ran six such rounds). A round: the policy samples PROMPTS training problems x 8 (scripts/policy_pairs.py, the
# verifier's labels, each right answer paired with a wrong one of the same prompt), then dpo.py trains on those
# pairs alone. Prints one markdown table (a row per round, its pairs and held-out accuracy), also in OUT/rounds.md.
#   bash scripts/iterative_dpo.sh [OUT_DIR] [options for every dpo.py round]
#   ROUNDS=3 PROMPTS=256 bash scripts/iterative_dpo.sh runs/iterative-dpo --seed 1
# MODEL is the starting model (default smollm2), ROUNDS the rounds (default 3), PROMPTS the problems a round
# (default 256); round r samples with seed r + 1000 x the run's --seed, so rounds and seeds draw different problems.
# PASSES=N sets each round's --steps to pass each of its training pairs at most N times (N x pairs / --batch-size,
# at least 1): a round of few pairs and dpo.py's 60 steps would otherwise memorise them.
#   PASSES=2 ROUNDS=3 PROMPTS=64 bash scripts/iterative_dpo.sh runs/iterative-dpo --batch-size 2
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/iterative-dpo}
shift || true
mkdir -p "$OUT"
last() { ls -d "$1"/*/ | tail -1; }
# the run's --seed and --batch-size as dpo.py reads them: `--seed 1` or `--seed=1`; --steps only without PASSES
read -r SEED BATCH <<<"$(python3 - "${PASSES:-}" "$@" <<'PY'
import argparse, sys
parser = argparse.ArgumentParser(allow_abbrev=False)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--steps")
args = parser.parse_known_args(sys.argv[2:])[0]
if sys.argv[1] and args.steps is not None:
    sys.exit("error: PASSES sets each round's --steps; give one or the other")
print(args.seed, args.batch_size)
PY
)"
[ -n "$SEED" ] || exit 2
POLICY=${MODEL:-smollm2}
for round in $(seq 1 "${ROUNDS:-3}"); do
    python scripts/policy_pairs.py --policy "$POLICY" --num-prompts "${PROMPTS:-256}" \
        --seed $((round + 1000 * SEED)) --out "$OUT/pairs-$round.jsonl"
    STEPS=()
    if [ -n "${PASSES:-}" ]; then
        STEPS=(--steps "$(python - "$OUT/pairs-$round.jsonl" "$PASSES" "$BATCH" <<'PY'
import sys
from task import preferences

pairs = sum(1 for line in open(sys.argv[1]) if line.strip())
train = pairs - preferences.heldout_count(pairs)
print(max(1, int(sys.argv[2]) * train // int(sys.argv[3])))
PY
)")
    fi
    python dpo.py --model "$POLICY" --dataset "$OUT/pairs-$round.jsonl" --output-dir "$OUT/round-$round" "$@" \
        "${STEPS[@]}"
    POLICY=$(last "$OUT/round-$round")model
done

python - "$OUT" <<'PY' | tee "$OUT/rounds.md"
import glob, json, sys

out = sys.argv[1]
print("| round | labelled pairs (in all) | held-out accuracy before -> after | wall time |")
print("| --- | --- | --- | --- |")
total = 0
for pairs in sorted(glob.glob(f"{out}/pairs-*.jsonl"), key=lambda p: int(p.rsplit("-", 1)[1].split(".")[0])):
    round_ = pairs.rsplit("-", 1)[1].split(".")[0]
    count = sum(1 for line in open(pairs) if line.strip())
    total += count
    found = sorted(glob.glob(f"{out}/round-{round_}/*/eval.json"))
    if not found:
        continue
    r = json.load(open(found[-1]))
    print(f"| {round_} | {count} ({total}) | {r['accuracy_before']:.3f} -> {r['accuracy_after']:.3f} | {r['wall_time_s'] / 60:.1f} min |")
PY
