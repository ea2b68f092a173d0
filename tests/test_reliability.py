"""Bad input, interrupts and poisoned checkpoints, as a user meets them: one line, exit status 2, nothing lost."""

import contextlib
import dataclasses
import importlib
import importlib.util
import io
import itertools
import json
import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import tyro

import common
import dpo
import grpo
import grpo_async
import grpo_prm
from infra import hub
from infra import models
import ppo
import prm
import reward_model
import rft
from infra import runs
from task import tasks
import sft
import variants
from conftest import (
    HAS_MATPLOTLIB,
    PAIRS,
    args_of,
    assert_one_line_error,
    digit_fraction,
    run_script,
    run_script_here,
    write,
)

# judge.py, rm_agreement.py and policy_pairs.py, for the out-of-memory line
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
TINY = ["--model", "tiny", "--steps", "1"]  # every case fails before the first step


@pytest.fixture(scope="module")
def broken_checkpoints(tmp_path_factory):
    """A tiny checkpoint with its weights file cut in half, one with only config.json, one causal LM."""
    root = tmp_path_factory.mktemp("checkpoints")
    tokenizer = models.make_tiny_tokenizer()
    lm = models.load_model("tiny", len(tokenizer), torch.device("cpu"))
    runs.save_checkpoint(lm, tokenizer, root / "lm")
    runs.save_checkpoint(lm, tokenizer, root / "truncated")
    weights = root / "truncated" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    (root / "config-only").mkdir()
    (root / "config-only" / "config.json").write_text((root / "lm" / "config.json").read_text())
    return root


CASES = [
    pytest.param(
        "grpo.py",
        ["--device", "cuda"],
        "CUDA is not available on this machine",  # only a CPU can show it
        marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA"),
    ),
    ("grpo.py", ["--device", "junk"], "--device must be auto, cpu, cuda or cuda:N"),
    ("grpo.py", ["--lr", "-1"], "--lr must be > 0"),
    ("dpo.py", ["--dataset", PAIRS, "--seed", "-1"], "--seed must be >= 0"),
    ("reward_model.py", ["--dataset", PAIRS, "--max-grad-norm", "-1"], "--max-grad-norm must be > 0"),
    ("ppo.py", ["--reward", "verifier", "--top-p", "0"], "--top-p must be in (0, 1]"),
    ("ppo.py", ["--reward", "verifier", "--top-p", "1.5"], "--top-p must be in (0, 1]"),
    ("grpo.py", ["--output-dir", "{file}"], "is not a writable directory"),
    # even for root
    ("dpo.py", ["--dataset", PAIRS, "--output-dir", "/proc/runs"], "is not a writable directory"),
    ("grpo.py", ["--dataset", "{latin1}"], "not UTF-8 text"),
    ("grpo.py", ["--max-new-tokens", "5000"], "exceeds the model's 512 positions"),
    ("variants.py", ["--algo", "rloo", "--max-new-tokens", "5000"], "exceeds the model's 512 positions"),
    ("grpo.py", ["--model", "{checkpoints}/truncated"], "is a file truncated?"),
    ("grpo.py", ["--model", "{checkpoints}/config-only"], "has a config.json but no"),
    ("ppo.py", ["--reward-model", "{checkpoints}/lm"], "has no trained score head"),
    ("ppo.py", ["--reward-model", "runs/no-such-run/model"], "no such directory"),
    ("grpo.py", ["--resume", "{tmp}"], "no checkpoint there"),
    (
        "grpo.py",
        ["--model", "tiny-gpt2", "--prompt-format", "chat"],
        "has no chat template; use --prompt-format plain",
    ),
    ("sft.py", ["--dataset", "{file}"], "the dataset is empty"),
]


@pytest.mark.parametrize(
    "script, argv, message",
    CASES,
    ids=[f"{c[0]}{' '.join(c[1])}" for c in (getattr(c, "values", c) for c in CASES)],
)
def test_bad_input_is_one_line_exit_2_and_no_traceback(tmp_path, broken_checkpoints, script, argv, message):
    places = {
        "file": write(tmp_path, "a-file", ""),
        "latin1": str(tmp_path / "latin1.jsonl"),
        "checkpoints": str(broken_checkpoints),
        "tmp": str(tmp_path),
    }
    (tmp_path / "latin1.jsonl").write_bytes(
        b'{"prompt": "What is 1 + 1?", "answer": "2"}\n{"prompt": "caf\xe9", "answer": "3"}\n'
    )
    argv = [a.format(**places) for a in argv]
    out = ["--output-dir", str(tmp_path / "runs")] if "--output-dir" not in argv else []
    base = TINY[2:] if "--model" in argv else TINY
    proc = run_script_here(script, *base, *out, *argv)
    assert "Traceback" not in proc.stderr
    assert_one_line_error(proc, message)
    assert not (tmp_path / "runs").exists() or not os.listdir(tmp_path / "runs")  # no half-made run folder


@pytest.mark.parametrize(
    "script, argv", [("dpo.py", ["--dataset", PAIRS]), ("sft.py", ["--num-demonstrations", "40"])]
)
def test_a_nan_stop_ends_the_screen_with_the_error_not_the_progress_bar(tmp_path, script, argv):
    proc = run_script(
        script,
        *TINY,
        *argv,
        "--steps",
        "6",
        "--lr",
        "1e12",
        "--max-grad-norm",
        "1e30",
        "--eval-every",
        "0",
        "--eval-size",
        "4",
        "--max-new-tokens",
        "4",
        "--output-dir",
        str(tmp_path),
    )
    # what stays on the screen: \r redraws a line
    last = proc.stderr.rstrip("\n").split("\n")[-1].split("\r")[-1]
    assert proc.returncode == 2 and last.startswith("error: ") and "became nan" in last, proc.stderr


def test_bom_and_numeric_answers_are_accepted(tmp_path):
    path = tmp_path / "data.jsonl"
    rows = [{"prompt": f"What is {i} + 1?", "answer": i + 1} for i in range(12)]
    path.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in rows).encode())
    result = grpo.main(
        args_of(
            grpo.Args,
            model="tiny",
            dataset=str(path),
            steps=1,
            prompts_per_step=2,
            group_size=2,
            max_new_tokens=4,
            eval_size=4,
            output_dir=str(tmp_path / "runs"),
            save_model=False,
        ),
        reward_fn=digit_fraction,
    )
    assert result["steps"] == 1


def stopped_run(tmp_path, capsys, reward_fn=digit_fraction):
    """A tiny 4-step GRPO run under runs.run_main, a checkpoint every 2 steps, that must stop early:
    (its args, exit status, run folder, stderr)."""
    args = args_of(
        grpo.Args,
        model="tiny",
        steps=4,
        prompts_per_step=2,
        group_size=4,
        max_new_tokens=4,
        eval_size=4,
        save_every=2,
        output_dir=str(tmp_path / "runs"),
    )
    with pytest.raises(SystemExit) as exit:
        runs.run_main(lambda a: grpo.main(a, reward_fn=reward_fn), args)
    run_dir = next((tmp_path / "runs").iterdir())
    return args, exit.value.code, run_dir, capsys.readouterr().err


def test_ctrl_c_abandons_the_step_and_names_the_folder_to_resume(tmp_path, capsys):
    calls = []

    def interrupt_at_step_3(completion, answer):
        calls.append(1)
        if len(calls) > 2 * 8:  # steps 1 and 2 score 8 completions each
            raise KeyboardInterrupt
        return digit_fraction(completion, answer)

    args, code, run_dir, stderr = stopped_run(tmp_path, capsys, interrupt_at_step_3)
    assert (
        code == 130
        and f"interrupted: the current step was abandoned; continue with --resume {run_dir}\n" in stderr
    )
    assert [json.loads(line)["step"] for line in open(run_dir / "metrics.jsonl")] == [1, 2]
    resumed = grpo.main(
        args_of(grpo.Args, **{**args.__dict__, "resume": str(run_dir)}), reward_fn=digit_fraction
    )
    assert [json.loads(line)["step"] for line in open(run_dir / "metrics.jsonl")] == [1, 2, 3, 4] and resumed[
        "steps"
    ] == 4


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.88 GiB"),
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 9"),
    ],
)
def test_out_of_memory_in_a_step_is_one_line_naming_what_to_lower_and_keeps_the_checkpoint(
    tmp_path, capsys, monkeypatch, error
):
    calls = []
    loss = grpo.grpo_loss

    def out_of_memory_at_step_3(*args, **kwargs):
        calls.append(1)
        if len(calls) > 2:  # one loss a step (one micro-batch, μ = 1): steps 1 and 2 train
            raise error
        return loss(*args, **kwargs)

    monkeypatch.setattr(grpo, "grpo_loss", out_of_memory_at_step_3)
    args, code, run_dir, stderr = stopped_run(tmp_path, capsys)
    where = "CUDA" if isinstance(error, torch.OutOfMemoryError) else "the machine"
    assert code == 2 and "Traceback" not in stderr
    # --batch-size is grpo.py's micro-batch: the same run goes on with a lower one; a shorter completion is another
    assert stderr.endswith(
        f"\nerror: out of memory on {where}; continue with --resume {run_dir} and --gradient-checkpointing or a "
        "lower --batch-size, or start again with a lower --max-new-tokens (the run changes)\n"
    )
    # the last good one
    assert torch.load(run_dir / "model" / "trainer_state.pt", weights_only=False)["step"] == 2

    # any other RuntimeError is a bug to show whole, not a line to hide it behind
    def a_bug(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(grpo, "grpo_loss", a_bug)
    with pytest.raises(RuntimeError, match="a bug"):
        runs.run_main(lambda a: grpo.main(a, reward_fn=digit_fraction), args)


def help_of(script: str) -> str:
    """A script's --help text, as its command line prints it (tyro's Args, or a script's argparse parser)."""
    module = importlib.import_module(script)
    out = io.StringIO()
    with pytest.raises(SystemExit), contextlib.redirect_stdout(out):
        if hasattr(module, "Args"):
            tyro.cli(module.Args, args=["--help"])
        else:
            module.parse_args(["--help"])
    return out.getvalue()


OUT_OF_MEMORY_SCRIPTS = {
    "grpo": args_of(grpo.Args),
    "grpo_async": args_of(grpo_async.Args),
    "grpo_prm": args_of(grpo_prm.Args),
    "ppo": args_of(ppo.Args),
    "dpo": args_of(dpo.Args),
    "sft": args_of(sft.Args),
    "reward_model": args_of(reward_model.Args),
    "variants": args_of(variants.Args, algo="rloo"),
    "rft": args_of(rft.Args),
    "prm": args_of(prm.Args),
    "judge": SimpleNamespace(judge_model="smollm2", max_pairs=0),
    "rm_agreement": SimpleNamespace(max_new_tokens=32, reward_model="x"),
    "policy_pairs": SimpleNamespace(max_new_tokens=32, policy="x"),
}


@pytest.mark.parametrize("script", OUT_OF_MEMORY_SCRIPTS)
@pytest.mark.parametrize("saved", [False, True])
def test_the_out_of_memory_line_names_only_the_options_its_script_has(script, saved, tmp_path, monkeypatch):
    if saved:  # a run folder with a checkpoint: a --resume is offered only with an option that keeps the run
        (tmp_path / "model").mkdir()
        (tmp_path / "model" / "trainer_state.pt").write_bytes(b"")
        monkeypatch.setattr(runs, "_RUN_DIR", tmp_path)
    line = runs._out_of_memory(MemoryError(), OUT_OF_MEMORY_SCRIPTS[script])
    named = re.findall(r"--[a-z][a-z-]+", line)
    text = help_of(script)
    assert all(re.search(rf"(?<![\w-]){flag}(?![\w-])", text) for flag in named), (script, line)
    resumes = "--resume" in named
    assert resumes == (saved and script not in ("prm", "judge", "rm_agreement", "policy_pairs")), line
    # only grpo.py's --batch-size (and its variants') is a micro-batch: elsewhere it sets the samples a step, and so
    # changes the run
    micro_batch = script in ("grpo", "grpo_async", "grpo_prm")
    assert ("--resume" in line and "a lower --batch-size, or start" in line) == (saved and micro_batch)


def test_a_nan_gradient_with_a_finite_loss_stops_before_the_update(tmp_path, monkeypatch):
    # The NaN guard used to check only the loss: a finite loss with a NaN gradient went into the weights.
    real = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(
        torch.nn.utils, "clip_grad_norm_", lambda params, max_norm: real(params, max_norm) * float("nan")
    )
    with pytest.raises(
        runs.InputError, match=r"gradient norm became nan at step 1; stopped without saving it"
    ):
        grpo.main(
            args_of(
                grpo.Args,
                model="tiny",
                steps=2,
                prompts_per_step=2,
                group_size=2,
                max_new_tokens=4,
                eval_size=4,
                output_dir=str(tmp_path / "runs"),
            ),
            reward_fn=digit_fraction,
        )


def test_non_finite_weights_are_never_saved(tmp_path):
    tokenizer = models.make_tiny_tokenizer()
    model = models.load_model("tiny", len(tokenizer), torch.device("cpu"))
    runs.save_checkpoint(model, tokenizer, tmp_path / "model")
    good = (tmp_path / "model" / "model.safetensors").read_bytes()
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("nan")
    with pytest.raises(runs.InputError, match="refusing to save non-finite weights"):
        runs.save_checkpoint(model, tokenizer, tmp_path / "model")
    assert (tmp_path / "model" / "model.safetensors").read_bytes() == good and not (
        tmp_path / "model.tmp"
    ).exists()


def test_results_are_written_before_the_final_save(tmp_path, monkeypatch):
    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(runs, "save_checkpoint", disk_full)
    with pytest.raises(OSError):
        grpo.main(
            args_of(
                grpo.Args,
                model="tiny",
                steps=1,
                prompts_per_step=2,
                group_size=2,
                max_new_tokens=4,
                eval_size=4,
                output_dir=str(tmp_path / "runs"),
            ),
            reward_fn=digit_fraction,
        )
    run_dir = next((tmp_path / "runs").iterdir())
    assert "accuracy_after" in json.loads((run_dir / "eval.json").read_text())


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib (optional) not installed")
def test_a_run_draws_its_curves(tmp_path):
    result = grpo.main(
        args_of(
            grpo.Args,
            model="tiny",
            steps=2,
            prompts_per_step=2,
            group_size=2,
            max_new_tokens=4,
            eval_size=4,
            eval_every=1,
            output_dir=str(tmp_path / "runs"),
            save_model=False,
        ),
        reward_fn=digit_fraction,
    )
    png = os.path.join(result["run_dir"], "curves.png")
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and not os.path.exists(
        png.replace("curves", "curves.tmp")
    )


def test_without_matplotlib_the_picture_is_skipped_with_one_note(tmp_path, monkeypatch, capsys):
    import builtins

    real_import = builtins.__import__
    monkeypatch.setattr(
        builtins,
        "__import__",
        lambda name, *a, **k: (
            (_ for _ in ()).throw(ImportError(name))
            if name.startswith("matplotlib")
            else real_import(name, *a, **k)
        ),
    )
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n')
    runs.plot_curves(tmp_path, [{"step": 0, "accuracy": 0.1}])
    assert (
        capsys.readouterr().err == "note: curves.png skipped (pip install matplotlib to draw it)\n"
        and not (tmp_path / "curves.png").exists()
    )


@pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is None, reason="tensorboard (optional) not installed"
)
def test_report_to_tensorboard_writes_the_logged_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = grpo.main(
        args_of(
            grpo.Args,
            model="tiny",
            steps=2,
            prompts_per_step=2,
            group_size=2,
            max_new_tokens=4,
            eval_size=4,
            output_dir=str(tmp_path / "runs"),
            save_model=False,
            report_to="tensorboard",
        ),
        reward_fn=digit_fraction,
    )
    events = EventAccumulator(os.path.join(result["run_dir"], "tensorboard")).Reload()
    rows = [json.loads(line) for line in open(os.path.join(result["run_dir"], "metrics.jsonl"))]
    # TRL's names, under train/ as TRL's Trainer logs them
    for key in ("reward", "loss", "kl", "completion_length", "time/step"):
        logged = [(e.step, e.value) for e in events.Scalars(f"train/{key}")]
        assert logged == [(r["step"], pytest.approx(r[key], rel=1e-6, abs=1e-6)) for r in rows]
    assert [(e.step, e.value) for e in events.Scalars("eval/accuracy")] == [
        (0, result["accuracy_before"]),
        (2, result["accuracy_after"]),
    ]


def test_a_missing_tracker_package_is_one_line_before_anything_loads(tmp_path, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real_find_spec(name, *a)
    )
    with pytest.raises(
        runs.InputError, match=r"^--report-to wandb needs the wandb package: pip install wandb$"
    ):
        runs.check_options(args_of(grpo.Args, report_to="wandb", output_dir=str(tmp_path)))


@pytest.mark.parametrize(
    "version, refused",
    [("5.17.0", True), ("5.22.2", True), ("5.23.0", False), ("5.24.0.dev0", False), ("6.0.0", False)],
)
def test_a_transformers_older_than_5_23_is_one_line_before_anything_loads(
    tmp_path, monkeypatch, version, refused
):
    # a CUDA image's transformers 5.17 failed at the first step: no activation_checkpointing_enable before 5.23.
    # The module runs.py holds (importing peft can put another `transformers` into sys.modules).
    monkeypatch.setattr(runs.transformers, "__version__", version)
    args = args_of(grpo.Args, output_dir=str(tmp_path))
    if refused:
        with pytest.raises(
            runs.InputError, match=rf"^transformers {version} is older than the 5.23 these scripts"
        ):
            runs.check_options(args)
    else:
        runs.check_options(args)


SCRIPTS = {
    "grpo": grpo,
    "grpo_async": grpo_async,
    "grpo_prm": grpo_prm,
    "dpo": dpo,
    "ppo": ppo,
    "reward_model": reward_model,
    "variants": variants,
    "sft": sft,
}


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_shows_the_shared_groups_in_boxes_with_flat_flags_and_one_default_per_option(name, capsys):
    with pytest.raises(SystemExit):
        tyro.cli(SCRIPTS[name].Args, args=["--help"])
    text = capsys.readouterr().out
    headers = [line.strip() for line in text.splitlines() if line.strip().endswith("options")]
    assert headers[:3] == ["options", "run options", "lora options"]
    assert "{None}" not in text and "--device {auto,cpu,cuda,cuda:N}" in text
    assert "--precision {auto,fp32,bf16-mixed,bf16-true}" in text and "--kernels {auto,on,off}" in text
    assert text.lower().count("default") == text.count("(default:")  # no option states its default twice
    groups = (SCRIPTS[name].Args, runs.RunOptions, common.LoraOptions)
    for field in [f for group in groups for f in dataclasses.fields(group) if f.name not in ("run", "lora")]:
        flag = f"--{field.name.replace('_', '-')}"
        assert f"{flag} " in text or f"{flag}," in text  # flat: --lr and --device, not --run.device


def test_the_command_line_builds_the_same_flat_args_as_python():
    argv = [
        "--lr",
        "3e-5",
        "--batch-size",
        "4",
        "--no-scale-by-std",
        "--save-every",
        "None",
        "--max-new-tokens",
        "8",
        "--report-to",
        "tensorboard",
    ]
    assert tyro.cli(grpo.Args, args=argv) == args_of(
        grpo.Args, lr=3e-5, batch_size=4, scale_by_std=False, max_new_tokens=8, report_to="tensorboard"
    )
    assert tyro.cli(variants.Args, args=["--algo", "kto", "--beta", "0.2"]) == args_of(
        variants.Args, algo="kto", beta=0.2
    )
    assert tyro.cli(ppo.Args, args=["--critic-init", "policy"]).critic_init == "policy"
    for bad in (["--precision", "fp16"], ["--report-to", "mlflow"], ["--grpo.lr", "1"]):
        with pytest.raises(SystemExit):
            tyro.cli(grpo.Args, args=bad)
    with pytest.raises(SystemExit):
        tyro.cli(variants.Args, args=[])  # --algo is required


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb (optional) not installed")
def test_report_to_wandb_goes_offline_without_a_network(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setattr(hub, "reachable", lambda host: False)
    result = grpo.main(
        args_of(
            grpo.Args,
            model="tiny",
            steps=1,
            prompts_per_step=2,
            group_size=2,
            max_new_tokens=4,
            eval_size=4,
            output_dir=str(tmp_path / "runs"),
            save_model=False,
            report_to="wandb",
        ),
        reward_fn=digit_fraction,
    )
    (offline_run,) = (p for p in (tmp_path / "runs").glob("*/wandb/offline-run-*"))
    assert (
        offline_run.parent.parent == Path(result["run_dir"])
        and next(offline_run.glob("*.wandb")).stat().st_size > 0
    )


@pytest.mark.parametrize("name", ["grpo", "grpo_async", "grpo_prm", "dpo", "ppo", "variants", "sft"])
def test_evaluation_is_scaled_to_the_model_unless_set(name):
    """A tiny random model answers nothing right: 16 problems and no pass@k keep its smoke run to seconds."""
    Args = SCRIPTS[name].Args
    extra = {"algo": "ipo"} if name == "variants" else {}

    def chosen(**kw):
        return tasks.evaluation_for_model(args_of(Args, **extra, **kw))

    assert (chosen(model="tiny").eval_size, chosen(model="tiny").pass_k) == (16, 0)
    assert (chosen(model="tiny-gpt2").eval_size, chosen(model="tiny-gpt2").pass_k) == (16, 0)
    assert (chosen(model="smollm2").eval_size, chosen(model="smollm2").pass_k) == (200, 8)
    assert (
        chosen(model="tiny", eval_size=40, pass_k=2).eval_size,
        chosen(model="tiny", pass_k=2).pass_k,
    ) == (40, 2)
    assert chosen(model="gpt2", eval_size=8, pass_k=0).pass_k == 0  # an explicit 0 stays off


@pytest.mark.parametrize("name", ["grpo", "grpo_async", "grpo_prm", "dpo", "ppo", "variants", "sft", "rft"])
def test_every_policy_script_reports_the_forgetting_measure_before_and_after(tmp_path, request, name):
    """The general text's NLL, of the starting policy and of the trained one (the reward models have no LM head)."""
    script = rft if name == "rft" else SCRIPTS[name]
    options = {
        "grpo": dict(prompts_per_step=2, group_size=2),
        "grpo_async": dict(prompts_per_step=2, group_size=2, staleness=1),
        "grpo_prm": dict(prompts_per_step=2, group_size=2),
        "dpo": dict(dataset=PAIRS, batch_size=2),
        "ppo": dict(reward="verifier", batch_size=2, minibatch_size=2),
        "variants": dict(algo="ipo", dataset=PAIRS, batch_size=2),
        "sft": dict(batch_size=2, num_demonstrations=8),
        "rft": dict(prompts_per_round=2, samples_per_prompt=2),
    }[name]
    if name == "grpo_prm":  # a reward model's score head reads the steps' ends as a PRM's does
        options["prm"] = request.getfixturevalue("tiny_reward_model_path")
    args = args_of(
        script.Args,
        model="tiny",
        steps=1,
        max_new_tokens=4,
        eval_size=4,
        lr=0.05,
        output_dir=str(tmp_path),
        **options,
    )
    # rewards that move the tiny policy, which answers nothing right: GRPO's alternate within a group, RFT keeps all
    calls = itertools.count()
    rewards = {
        "grpo": lambda completion, answer: float(next(calls) % 2),
        "grpo_async": lambda completion, answer: float(next(calls) % 2),
        "rft": lambda completion, answer: 1.0,
    }
    result = script.main(args, **({"reward_fn": rewards[name]} if name in rewards else {}))
    tokenizer = models.make_tiny_tokenizer()
    start = tasks.general_text_nll(
        models.load_model("tiny", len(tokenizer), torch.device("cpu"), seed=0), tokenizer
    )
    assert result["general_nll_before"] == pytest.approx(start, rel=1e-4)
    assert result["general_nll_after"] != result["general_nll_before"]  # measured on the trained policy


def test_a_tiny_run_records_the_evaluation_it_chose(tmp_path):
    result = grpo.main(
        args_of(
            grpo.Args,
            model="tiny",
            steps=1,
            prompts_per_step=2,
            group_size=2,
            max_new_tokens=4,
            output_dir=str(tmp_path),
            save_model=False,
        ),
        reward_fn=digit_fraction,
    )
    recorded = json.loads((Path(result["run_dir"]) / "args.json").read_text())
    assert (recorded["eval_size"], recorded["pass_k"]) == (16, 0) and not any(
        k.startswith("pass@") for k in result
    )


def test_the_expected_duration_is_printed_after_the_first_step_and_the_second(tmp_path, capsys):
    args = args_of(
        grpo.Args,
        model="tiny",
        steps=5,
        eval_every=2,
        prompts_per_step=2,
        group_size=2,
        max_new_tokens=4,
        eval_size=4,
        output_dir=str(tmp_path),
        save_model=False,
    )
    grpo.main(args, reward_fn=digit_fraction)
    lines = [line for line in capsys.readouterr().out.splitlines() if " to go " in line]
    # after step 1: 4 steps left, evaluations at steps 2 and 4 and the final one at step 5; after step 2 (its own
    # time, without the first step's warm-up): 3 steps left, the evaluations at steps 4 and 5
    assert (
        len(lines) == 2
        and lines[0].startswith("grpo: step 1 took ")
        and "(steps: 4, evaluations: 3)" in lines[0]
    )
    assert lines[1].startswith("grpo: step 2 took ") and "(steps: 3, evaluations: 2)" in lines[1]


def test_the_expected_duration_counts_pass_at_k_in_the_last_evaluation_only(monkeypatch, capsys):
    # 10 steps, an evaluation every 4: greedy at steps 4 and 8, then the last one, which draws pass@k again.
    # The starting evaluation took 30 s, 20 of them pass@k; step 1 took 5 s: 9 · 5 + 3 · 10 + 20 = 95 s to go
    # (counting pass@k in every evaluation would say 9 · 5 + 3 · 30 = 135 s).
    # the attributes log() reads, set by hand; a clock that says step 1 took 5 s
    run = object.__new__(runs.Run)
    vars(run).update(
        args=SimpleNamespace(steps=10, eval_every=4),
        algo="grpo",
        main=True,
        first_step=1,
        loop_start=100.0,
        eval_seconds=30.0,
        before={"accuracy": 0.5, "pass_k_seconds": 20.0},
        metrics=SimpleNamespace(write=lambda step, stats: None),
        device=torch.device("cpu"),
        bar=SimpleNamespace(update=lambda n: None, set_postfix=lambda postfix: None, write=print),
    )
    clock = iter([105.0, 105.0, 108.0, 108.0])  # step 1 ends at 105 s, step 2 (3 s on its own) at 108 s
    monkeypatch.setattr(runs.time, "time", lambda: next(clock))
    run.log(1, {"loss": 0.0})
    run.log(2, {"loss": 0.0})  # 8 · 3 + 3 · 10 + 20 = 74 s
    assert capsys.readouterr().out.splitlines() == [
        "grpo: step 1 took 5.0 s; about 1.6 min to go (steps: 9, evaluations: 3)",
        "grpo: step 2 took 3.0 s; about 1.2 min to go (steps: 8, evaluations: 3)",
    ]


def test_two_runs_started_in_the_same_second_take_two_folders_even_racing(tmp_path, monkeypatch):
    """A run folder is named by the second it starts; a second run in that second takes `-1`. Two processes at once
    both see the name free before either creates it: the folder is taken by mkdir alone, which one of them fails."""
    args = grpo.Args(model="tiny")
    first = runs.make_run_dir(str(tmp_path), "grpo", "tiny", 0, args)
    # the other process's view: the name looked free an instant ago
    monkeypatch.setattr(Path, "exists", lambda self: False)
    monkeypatch.setattr(runs.datetime, "datetime", FrozenClock(first.name.removeprefix("grpo-tiny-0-")))
    second = runs.make_run_dir(str(tmp_path), "grpo", "tiny", 0, args)
    assert second.name == f"{first.name}-1" and (second / "args.json").is_file()


class FrozenClock:
    """datetime.datetime with now() fixed at a stamp (%Y%m%d-%H%M%S), the same second for every run."""

    def __init__(self, stamp: str):
        self.stamp = stamp

    def now(self):
        return self

    def strftime(self, _format: str) -> str:
        return self.stamp
