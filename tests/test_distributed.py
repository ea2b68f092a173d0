"""torchrun: N ranks with a share of the batch each train the weights one process trains on the whole batch.

Each test launches the real command line, `python -m torch.distributed.run --nproc_per_node 2 ...` (gloo, 2 CPU
processes), through tests/fixed_completions.py: each rank samples from its own generator, so the completions are
fixed by the prompts there and one process and two ranks train on the same batch. Compared: every logged number
but timings (to float tolerance: the ranks' gradients are summed in another order) and the final weights.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from conftest import REPO, TIMING, args_of
from safetensors.torch import load_file

from infra import models
from infra import distributed
import grpo
from infra import runs
from task import tasks

ENTRY = str(REPO / "tests" / "fixed_completions.py")
TINY = ("--model", "tiny", "--steps", "3", "--eval-size", "4", "--max-new-tokens", "12")
# The tiny model's verifier pays 0, so PPO's returns are its KL penalty alone: at ppo.py's β = 0.001 and λ = 1 they
# vary by ~1e-8 against the random head's values, and the explained variance is a ratio of rounding (-6e5); at
# β = 0.05 and λ = 0.95 (the returns then carry the values too) the ranks' numbers compare to tolerance.
PPO_KL = ("--kl-coef", "0.05", "--lam", "0.95")
# PPO on the verifier, 4 completions a step in one minibatch
PPO_FOUR = (*TINY, "--reward", "verifier", *PPO_KL, "--batch-size", "4", "--minibatch-size", "4")
# see below
NEAR_ZERO = ("loss", "pg_loss", "policy_loss", "kl", "kl_coef", "non_score_reward", "rlhf_reward", "margin")


def start(ranks: int, output_dir, script: str, *argv, entry: str = ENTRY, **env) -> subprocess.Popen:
    """`script argv` as one process (ranks = 1) or under torchrun, started; `finish` waits for it. Runs that do
    not depend on each other are started together: their processes (one thread each) wait on one another's
    start-up, collectives and files less than they would one after the other, and the suite is a quarter quicker."""
    command = (
        [sys.executable, entry, script]
        if ranks == 1
        else [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(ranks),
            entry,
            script,
        ]
    )
    output_dir.mkdir(parents=True, exist_ok=True)  # --resume runs into the folder again
    # a file, not a pipe: two runs at once would each wait on the other's full pipe
    log = open(output_dir.parent / f"{output_dir.name}.log", "w+")
    proc = subprocess.Popen(
        [*command, *argv, "--output-dir", str(output_dir)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=log,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
    )
    proc.log = log
    return proc


def finish(proc: subprocess.Popen):
    """Wait for a started run; its one run folder."""
    returncode = proc.wait(timeout=300)
    proc.log.seek(0)
    stderr = proc.log.read()
    proc.log.close()
    errors = [
        line
        for line in stderr.splitlines()  # not the progress bars
        if any(word in line for word in ("Error", "error:", "Exception", "terminate", "what()", "test:"))
    ]
    assert returncode == 0, "\n".join(errors[-20:]) or stderr[-3000:]
    output_dir = Path(proc.args[-1])
    folders = list(output_dir.iterdir())
    assert len(folders) == 1, folders  # rank 0 alone made a run folder
    return folders[0]


def launch(ranks: int, output_dir, script: str, *argv, entry: str = ENTRY, **env):
    """`script argv` as one process (ranks = 1) or under torchrun; returns its one run folder."""
    return finish(start(ranks, output_dir, script, *argv, entry=entry, **env))


def metrics(run_dir) -> list[dict]:
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    return [
        {k: v for k, v in row.items() if not k.startswith(TIMING) and k != "time/elapsed"} for row in rows
    ]


def assert_same_training(one, two, ties=()) -> None:
    """The same numbers logged at each step and the same final weights (and a critic's), to float tolerance. `ties`:
    metrics that count which of two numbers is larger, where one process computes both alike and the other does not."""
    rows_one, rows_two = metrics(one), metrics(two)
    assert [r["step"] for r in rows_two] == [1, 2, 3]  # each step logged once
    for a, b in zip(rows_one, rows_two):
        assert a.keys() == b.keys()
        # metrics.jsonl keeps 6 significant digits: a last digit may round the other
        for k in set(a) - set(ties):
            # way. DPO's rewards are β × a difference of two sums of ~30 log-probs, a policy-gradient loss a mean of
            # advantages of mean 0 (PPO's, REINFORCE++'s whitened), PPO's KL (in rlhf_reward, and in β through
            # --target-kl) a sum of log-prob differences, a reward model's margin a mean of score differences near 0
            # at its start: float32 leaves them ~1e-6 absolute
            tolerance = 1e-5 if k.startswith("rewards/") or k in NEAR_ZERO else 1e-8
            assert b[k] == pytest.approx(a[k], rel=1e-5, abs=tolerance), (a["step"], k, a[k], b[k])
    for model in ("model", "model/critic") if (one / "model" / "critic").exists() else ("model",):
        file = (
            "model.safetensors"
            if (one / model / "model.safetensors").exists()
            else "adapter_model.safetensors"
        )
        weights = [load_file(run / model / file) for run in (one, two)]
        for name, w in weights[0].items():
            torch.testing.assert_close(weights[1][name], w, rtol=1e-6, atol=1e-7, msg=f"{model}: {name}")


def assert_same_training_sharded_or_not(tmp_path, script: str, argv, ties=()) -> None:
    """One process, 2 ranks each holding the whole model, and 2 ranks each holding half of it (--fsdp): one run.
    A sharded model's log-probs come from one forward of [prompt, completion], not from the prompt's cache
    (common.completion_logprobs): the same function, rounded differently, so `ties` may break the other way."""
    one = start(1, tmp_path / "one", script, *argv)
    two = start(2, tmp_path / "two", script, *argv)
    fsdp = launch(2, tmp_path / "fsdp", script, *argv, "--fsdp")
    one = finish(one)
    assert_same_training(one, finish(two))
    assert_same_training(one, fsdp, ties)


@pytest.fixture(scope="module")
def grpo_runs(tmp_path_factory):
    """GRPO, token-mean over a batch whose two halves hold different numbers of tokens, micro-batches of 4."""
    tmp = tmp_path_factory.mktemp("grpo")
    argv = (
        *TINY,
        "--prompts-per-step",
        "4",
        "--group-size",
        "4",
        "--batch-size",
        "4",
        "--loss-agg",
        "token-mean",
    )
    one = start(1, tmp / "one", "grpo.py", *argv)
    two = launch(2, tmp / "two", "grpo.py", *argv)
    return finish(one), two


def test_grpo_two_ranks_train_the_weights_one_process_trains(grpo_runs):
    assert_same_training(*grpo_runs)


def test_only_rank_0_writes(grpo_runs):
    _, two = grpo_runs  # launch() checked there is one run folder; here, what it holds
    assert sorted(p.name for p in two.iterdir() if p.name != "curves.png") == [
        "args.json",
        "eval.json",
        "metrics.jsonl",
        "model",
    ]
    assert [json.loads(line)["step"] for line in open(two / "metrics.jsonl")] == [1, 2, 3]
    model = transformers.AutoModelForCausalLM.from_pretrained(two / "model")  # an ordinary checkpoint
    weights = load_file(two / "model" / "model.safetensors")
    assert all(torch.equal(p, weights[name]) for name, p in model.named_parameters() if name in weights)


def test_dpo_two_ranks_train_the_weights_one_process_trains(tmp_path):
    argv = (*TINY, "--dataset", "tests/data/pairs.jsonl", "--batch-size", "4", "--beta", "0.5")
    # at step 1 the policy is the reference: every margin is 0 in one process, ±1e-8 sharded (after the cached ones)
    assert_same_training_sharded_or_not(tmp_path, "dpo.py", argv, ties=("rewards/accuracies",))


def test_sft_two_ranks_train_the_weights_one_process_trains(tmp_path):
    argv = (*TINY, "--batch-size", "4", "--num-demonstrations", "64")
    assert_same_training_sharded_or_not(tmp_path, "sft.py", argv)


def test_ppo_two_ranks_train_the_weights_one_process_trains(tmp_path):
    """Policy and critic. Advantages whitened over the whole batch, the two token-mean losses over the whole
    minibatch, the KL that steers the adaptive controller and the explained variance over every rank's completions."""
    # KL error unclipped: β moves by it in full
    argv = (*PPO_FOUR, "--target-kl", "0.005", "--kl-horizon", "8")
    assert_same_training_sharded_or_not(tmp_path, "ppo.py", argv)


def test_ppo_penalty_two_ranks_adapt_one_beta_on_every_ranks_kl(tmp_path):
    """PPO-Penalty's β_old moves on d, the updated policy's KL over every rank's tokens: both ranks keep the one
    process's β (logged as their mean, `penalty`), and so train its weights. Each rank's own d would part them."""
    argv = (*PPO_FOUR, "--policy-loss", "penalty", "--kl-old-target", "2e-6")
    one = start(1, tmp_path / "one", "ppo.py", *argv)
    two = launch(2, tmp_path / "two", "ppo.py", *argv)
    assert_same_training(finish(one), two)


@pytest.mark.parametrize(
    "algo, options",
    [
        # advantages whitened over every rank's tokens; a token mean
        ("reinforce_pp_baseline", ("--group-size", "4")),
        ("rloo", ("--group-size", "4")),  # a mean over sequences
        ("ipo", ("--dataset", "tests/data/pairs.jsonl")),  # offline: a mean over pairs
    ],
)
def test_variants_two_ranks_train_the_weights_one_process_trains(tmp_path, algo, options):
    argv = (*TINY, "--algo", algo, "--batch-size", "4", *options)
    if algo == "reinforce_pp_baseline":
        assert_same_training_sharded_or_not(tmp_path, "variants.py", argv)
    else:
        one = start(1, tmp_path / "one", "variants.py", *argv)
        two = launch(2, tmp_path / "two", "variants.py", *argv)
        assert_same_training(finish(one), two)


def test_lora_sharded_over_two_ranks_trains_the_adapters_one_process_trains(tmp_path):
    """--fsdp with LoRA, in PPO: the frozen bases are sharded too, the reference is the policy with its adapter off,
    the critic's backbone and head are reached through its wrapper, and the saved adapters are one process's."""
    argv = (
        *TINY,
        "--reward",
        "verifier",
        *PPO_KL,
        "--batch-size",
        "4",
        "--minibatch-size",
        "4",
        "--lora-r",
        "8",
    )
    one = start(1, tmp_path / "one", "ppo.py", *argv)
    fsdp = launch(2, tmp_path / "fsdp", "ppo.py", *argv, "--fsdp")
    assert_same_training(finish(one), fsdp)


def test_prm_two_ranks_train_the_weights_one_process_trains(tmp_path):
    """The PRM's loss is a mean over the batch's steps, which the ranks' halves split unevenly; rank 0 labels."""
    argv = (
        "--model",
        "tiny",
        "--steps",
        "3",
        "--eval-size",
        "4",
        "--max-new-tokens",
        "12",
        "--batch-size",
        "4",
        "--num-problems",
        "8",
        "--num-solutions",
        "2",
        "--num-rollouts",
        "2",
    )
    one = start(1, tmp_path / "one", "prm.py", *argv, RLHF_CACHE=str(tmp_path / "cache-one"))
    two = launch(2, tmp_path / "two", "prm.py", *argv, RLHF_CACHE=str(tmp_path / "cache-two"))
    assert_same_training(finish(one), two)


def test_reward_model_two_ranks_train_the_weights_one_process_trains(tmp_path):
    argv = ("--model", "tiny", "--steps", "3", "--dataset", "tests/data/pairs.jsonl", "--batch-size", "4")
    assert_same_training_sharded_or_not(tmp_path, "reward_model.py", argv)


@pytest.mark.parametrize(
    "script, argv",
    [
        ("grpo.py", ("--prompts-per-step", "2", "--group-size", "4")),
        ("grpo.py", ("--prompts-per-step", "2", "--group-size", "4", "--fsdp")),
        ("ppo.py", ("--reward", "verifier", *PPO_KL, "--batch-size", "4", "--minibatch-size", "2", "--fsdp")),
    ],
    ids=["grpo", "grpo-fsdp", "ppo-fsdp"],
)
def test_a_run_of_two_ranks_resumes_exactly_with_two(tmp_path, script, argv):
    """2 steps, then --resume to 3, under torchrun with the ranks' own sampling (SAMPLE=1): each rank's generator
    comes back from the checkpoint, so the run is the one of 3 steps straight, to the bit; one process refuses it.
    With --fsdp the ranks also decode until every rank's rows end, and each AdamW's state (PPO's two: the policy's,
    the critic's) is gathered with its own model's shards and re-sharded."""
    straight = start(2, tmp_path / "straight", script, *argv, *TINY, SAMPLE="1")
    split = launch(2, tmp_path / "split", script, *argv, *TINY[:2], "--steps", "2", *TINY[4:], SAMPLE="1")
    launch(2, tmp_path / "split", script, *argv, *TINY, "--resume", str(split), SAMPLE="1")
    straight = finish(straight)
    assert metrics(straight) == metrics(split)
    for model in ("model", "model/critic") if script == "ppo.py" else ("model",):
        weights = [load_file(run / model / "model.safetensors") for run in (straight, split)]
        assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])
    with pytest.raises(runs.InputError, match="saved by 2 process"):
        runs.load_trainer_state(str(split), 4)


@pytest.mark.parametrize(
    "script, options, message",
    [
        ("grpo", {"prompts_per_step": 3}, "--prompts-per-step 3 does not divide over 2 torchrun ranks"),
        ("grpo", {"dynamic_sampling": True}, "--dynamic-sampling does not run under torchrun yet"),
        ("grpo_async", {"prompts_per_step": 3}, "--prompts-per-step 3 does not divide over 2 torchrun ranks"),
        (
            "grpo_prm",
            {"prm": "runs/p", "dynamic_sampling": True},
            "--dynamic-sampling does not run under torchrun",
        ),
        ("dpo", {"batch_size": 5}, "--batch-size 5 does not divide over 2 torchrun ranks"),
        ("sft", {"batch_size": 7}, "--batch-size 7 does not divide over 2 torchrun ranks"),
        ("reward_model", {"batch_size": 3}, "--batch-size 3 does not divide over 2 torchrun ranks"),
        (
            "ppo",
            {"batch_size": 6, "minibatch_size": 3},
            "--minibatch-size 3 does not divide over 2 torchrun ranks",
        ),
        ("variants", {"algo": "kto"}, "--algo kto does not run under torchrun yet"),
        ("ppo_prm", {"prm": "runs/p"}, "ppo_prm.py does not run under torchrun yet: run it alone"),
        (
            "variants",
            {"algo": "rloo", "batch_size": 3},
            "--batch-size 3 does not divide over 2 torchrun ranks",
        ),
    ],
)
def test_a_set_up_the_ranks_cannot_share_is_one_line(monkeypatch, tmp_path, script, options, message):
    module = __import__(script)
    # as torchrun --nproc_per_node 2 sets it, checked before anything loads
    monkeypatch.setenv("WORLD_SIZE", "2")
    args = args_of(module.Args, model="tiny", output_dir=str(tmp_path), **options)
    args = tasks.evaluation_for_model(args) if hasattr(args, "eval_size") else args
    with pytest.raises(runs.InputError, match=message):
        module.check_args(args)


@pytest.mark.parametrize(
    "world, options, message",
    [
        (None, {}, "--fsdp shards the model over torchrun's ranks"),
        ("2", {"eval_size": 5}, "--fsdp: --eval-size 5 must divide over 2 torchrun ranks"),
        ("2", {"lora_r": 8, "merge_lora": True}, "--merge-lora does not run with --fsdp"),
    ],
)
def test_an_fsdp_set_up_that_cannot_run_is_one_line(monkeypatch, tmp_path, world, options, message):
    if world:  # as torchrun sets them; a plain run (None) has neither
        monkeypatch.setenv("WORLD_SIZE", world)
        monkeypatch.setenv("LOCAL_RANK", "0")
    args = tasks.evaluation_for_model(
        args_of(grpo.Args, model="tiny", output_dir=str(tmp_path), fsdp=True, **options)
    )
    with pytest.raises(runs.InputError, match=message):
        grpo.check_args(args)


def test_fsdp_under_torchrun_with_one_rank_is_let_through(monkeypatch, tmp_path):
    """torchrun --nproc_per_node 1 sets LOCAL_RANK and WORLD_SIZE=1: a group of one rank that --fsdp can shard over."""
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    args = tasks.evaluation_for_model(args_of(grpo.Args, model="tiny", output_dir=str(tmp_path), fsdp=True))
    grpo.check_args(args)


def test_a_backend_this_torch_lacks_is_one_line(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(torch.distributed, "is_gloo_available", lambda: False)
    with pytest.raises(runs.InputError, match="needs torch.distributed's gloo backend"):
        models.resolve_device("cpu")


def test_alone_every_helper_returns_its_input():
    """A plain run is rank 0 of 1: no collective call, nothing changed (one process stays bit-identical)."""
    stats, x = {"reward": 0.25, "skipped": 1}, torch.tensor([1.5, 2.0])
    assert distributed.world_size() == 1 and distributed.is_main()
    assert (
        distributed.mean_over_ranks(stats) is stats
        and distributed.all_sum(x) is x
        and distributed.all_sum(3) == 3
    )
    assert distributed.share([1, 2, 3]) == [1, 2, 3] and distributed.share_of(7) == 1.0


def test_each_rank_takes_a_contiguous_share(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    shares = []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        shares.append(distributed.share(list(range(8))))
    # in rank order they are the list; sizes differ by one at most
    assert shares == [[0, 1], [2, 3, 4], [5, 6, 7]]


def test_grpo_sharded_over_two_ranks_trains_the_weights_one_process_trains(grpo_runs, tmp_path):
    """--fsdp (FSDP2 on gloo): each rank holds half of every weight, gradient and AdamW moment; the same run."""
    argv = (
        *TINY,
        "--prompts-per-step",
        "4",
        "--group-size",
        "4",
        "--batch-size",
        "4",
        "--loss-agg",
        "token-mean",
    )
    assert_same_training(grpo_runs[0], launch(2, tmp_path / "fsdp", "grpo.py", *argv, "--fsdp"))
