"""torchrun: N ranks with a share of the batch each train the weights one process trains on the whole batch.

Each test launches the real command line, `python -m torch.distributed.run --nproc_per_node 2 ...` (gloo, 2 CPU
processes), through tests/fixed_completions.py: each rank samples from its own generator, so the completions are
fixed by the prompts there and one process and two ranks train on the same batch. Compared: every logged number
but timings (to float tolerance: the ranks' gradients are summed in another order) and the final weights.
"""

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
from conftest import REPO, TIMING
from safetensors.torch import load_file

ENTRY = str(REPO / "tests" / "fixed_completions.py")
TINY = ("--model", "tiny", "--steps", "3", "--eval-size", "4", "--max-new-tokens", "12")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(ranks: int, output_dir, script: str, *argv, entry: str = ENTRY, **env):
    """`script argv` as one process (ranks = 1) or under torchrun; returns its one run folder."""
    command = [sys.executable, entry, script] if ranks == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_port",
        str(free_port()), entry, script]
    proc = subprocess.run([*command, *argv, "--output-dir", str(output_dir)], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    folders = list(output_dir.iterdir())
    assert len(folders) == 1, folders  # rank 0 alone made a run folder
    return folders[0]


def metrics(run_dir) -> list[dict]:
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    return [{k: v for k, v in row.items() if not k.startswith(TIMING) and k != "time/elapsed"} for row in rows]


def assert_same_training(one, two) -> None:
    """The same numbers logged at each step and the same final weights, to float tolerance."""
    rows_one, rows_two = metrics(one), metrics(two)
    assert [r["step"] for r in rows_two] == [1, 2, 3]  # each step logged once
    for a, b in zip(rows_one, rows_two):
        assert a.keys() == b.keys()
        for k in a:  # metrics.jsonl keeps 6 significant digits: a last digit may round the other way. DPO's
            # rewards are β × a difference of two sums of ~30 log-probs: float32 leaves them ~1e-6 absolute
            tolerance = 1e-5 if k.startswith("rewards/") else 1e-8
            assert b[k] == pytest.approx(a[k], rel=1e-5, abs=tolerance), (a["step"], k, a[k], b[k])
    weights = [load_file(run / "model" / "model.safetensors") for run in (one, two)]
    for name, w in weights[0].items():
        torch.testing.assert_close(weights[1][name], w, rtol=1e-6, atol=1e-7, msg=name)


@pytest.fixture(scope="module")
def grpo_runs(tmp_path_factory):
    """GRPO, token-mean over a batch whose two halves hold different numbers of tokens, micro-batches of 4."""
    tmp = tmp_path_factory.mktemp("grpo")
    argv = (*TINY, "--prompts-per-step", "4", "--group-size", "4", "--batch-size", "4", "--loss-agg", "token-mean")
    return launch(1, tmp / "one", "grpo.py", *argv), launch(2, tmp / "two", "grpo.py", *argv)


def test_grpo_two_ranks_train_the_weights_one_process_trains(grpo_runs):
    assert_same_training(*grpo_runs)


def test_only_rank_0_writes(grpo_runs):
    _, two = grpo_runs  # launch() checked there is one run folder; here, what it holds
    assert sorted(p.name for p in two.iterdir() if p.name != "curves.png") == [
        "args.json", "eval.json", "metrics.jsonl", "model"]
    assert [json.loads(line)["step"] for line in open(two / "metrics.jsonl")] == [1, 2, 3]


def test_dpo_two_ranks_train_the_weights_one_process_trains(tmp_path):
    argv = (*TINY, "--dataset", "tests/data/pairs.jsonl", "--batch-size", "4", "--beta", "0.5")
    assert_same_training(launch(1, tmp_path / "one", "dpo.py", *argv), launch(2, tmp_path / "two", "dpo.py", *argv))


def test_sft_two_ranks_train_the_weights_one_process_trains(tmp_path):
    argv = (*TINY, "--batch-size", "4", "--num-demonstrations", "64")
    assert_same_training(launch(1, tmp_path / "one", "sft.py", *argv), launch(2, tmp_path / "two", "sft.py", *argv))
