"""scripts/compare.py, scripts/beta_sweep.py, scripts/accuracy_vs_time.py, scripts/prm_vs_orm.py and
scripts/sensitivity.py: the budget arithmetic, the tables, the uniform KL, the accuracy curves, majority vote and ORM
pairs, each study's rows, tiny runs end to end."""

import json
import re
import sys

import pytest
import torch

from infra import models
from infra import runs
from task import tasks
from conftest import PAIRS, REPO, args_of, assert_one_line_error, run_script, run_script_here

sys.path.insert(0, str(REPO / "scripts"))
import accuracy_vs_time  # noqa: E402
import beta_sweep  # noqa: E402
import compare  # noqa: E402
import policy_pairs  # noqa: E402
import prm_reward  # noqa: E402
import prm_vs_orm  # noqa: E402
import rm_agreement  # noqa: E402
import sensitivity  # noqa: E402


def test_mean_std_is_the_sample_std_over_seeds():
    assert compare.mean_std([0.5, 0.7]) == "0.600 ± 0.141"  # stdev([0.5, 0.7]) = 0.1 · sqrt(2) = 0.141421
    assert compare.mean_std([0.25]) == "0.250"


def test_completions_per_step_are_the_scripts_own_defaults():
    import dpo
    import grpo
    import ppo
    import rft
    import sft
    import variants

    per_step = {slug: n for slug, (_, _, n) in compare.ALGORITHMS.items()}
    # grpo.py, its catalogue and its variant for an asynchronous trainer
    grpo_scripts = ("grpo.py", "grpo_options.py", "grpo_async.py")
    grpo_rows = [
        command
        for slug, (_, command, _) in compare.ALGORITHMS.items()
        if command[0] in grpo_scripts and slug not in ("grpo-defaults", "grpo-options-defaults")
    ]
    # the table's shape; one row keeps grpo.py's own batch, for the study of its options at its defaults
    assert all(command[1:3] == ["--prompts-per-step", "4"] for command in grpo_rows)
    assert {command[0] for command in grpo_rows} == set(grpo_scripts)
    assert per_step["grpo"] == 4 * args_of(grpo.Args).group_size
    defaults = args_of(grpo.Args)
    assert compare.ALGORITHMS["grpo-defaults"][1] == ["grpo.py"]
    assert per_step["grpo-defaults"] == defaults.prompts_per_step * defaults.group_size == 128
    rft_args = args_of(rft.Args, prompts_per_round=4, steps_per_round=1)  # its row's command
    assert (
        per_step["rft"]
        == rft_args.prompts_per_round * rft_args.samples_per_prompt // rft_args.steps_per_round
    )
    # PPO's comparison rows pin the budget's shape, 8 a step in one minibatch; one row keeps ppo.py's own batch of
    # 128, for the PPO knobs' studies
    ppo_rows = [command for _, command, _ in compare.ALGORITHMS.values() if command[0].startswith("ppo")]
    assert sum(command[-4:] == compare.PPO_SHAPE for command in ppo_rows) == 3 and len(ppo_rows) == 4
    assert per_step["ppo-verifier-defaults"] == args_of(ppo.Args).batch_size == 128
    assert compare.ALGORITHMS["ppo-verifier-defaults"][1] == ["ppo.py", "--reward", "verifier"]
    shaped = args_of(ppo.Args, batch_size=8, minibatch_size=8)
    assert per_step["ppo-verifier"] == per_step["ppo-rm"] == shaped.batch_size != args_of(ppo.Args).batch_size
    assert (
        per_step["sft"] == args_of(sft.Args).batch_size
        and per_step["dpo"] == 2 * args_of(dpo.Args).batch_size
    )
    online = args_of(variants.Args, algo="rloo")
    assert (
        per_step["rloo"] == online.batch_size * online.group_size and per_step["remax"] == online.batch_size
    )
    assert all(
        per_step[a] == 2 * args_of(variants.Args, algo=a).batch_size for a in ("ipo", "kto", "simpo", "orpo")
    )
    with pytest.raises(SystemExit):
        compare.parse_args(["--extra", "--batch-size 16"])  # would break the equal budget silently


def test_every_row_is_a_command_its_script_parses():
    import importlib

    import tyro

    for slug, (_, command, _) in compare.ALGORITHMS.items():
        script = importlib.import_module(command[0].removesuffix(".py"))
        # an option misspelled, or moved to a variant, would stop tyro here, hours into a comparison
        args = tyro.cli(script.Args, args=command[1:])
        for key, value in compare.command_settings(command).items():
            made = getattr(args, key)
            made = list(made) if isinstance(made, tuple) else made  # as args.json holds it
            assert compare.same_setting(made, value), (slug, key)


def test_every_algorithm_gets_the_same_budget_in_training_completions():
    args = compare.parse_args(["--budget", "320"])
    steps = {slug: args.budget // per_step for slug, (_, _, per_step) in compare.ALGORITHMS.items()}
    assert steps["grpo"] == 10 and steps["ppo-verifier"] == 40 and steps["dpo"] == 20 and steps["sft"] == 20
    with pytest.raises(SystemExit):
        compare.parse_args(["--budget", "16", "--algos", "grpo"])  # less than one GRPO step (32)


def test_table_rows(tmp_path):
    args = compare.parse_args(["--algos", "grpo", "dpo", "--seeds", "0", "1", "--budget", "320"])
    row = dict(accuracy_before=0.2, steps=10, kl=1.0, wall_time_s=60.0, peak_gb=4.0, **{"pass@8_before": 0.5})
    rows = [
        {**row, "algo": "grpo", "name": "GRPO", "seed": 0, "accuracy": 0.5, "pass@8": 0.75},
        # the starting model's pass@8 is sampled with each seed's random numbers
        {
            **row,
            "algo": "grpo",
            "name": "GRPO",
            "seed": 1,
            "accuracy": 0.7,
            "pass@8": 0.75,
            "kl": 3.0,
            "wall_time_s": 180.0,
            "pass@8_before": 0.7,
        },
        {
            **row,
            "algo": "dpo",
            "name": "DPO",
            "seed": 1,
            "accuracy": 0.4,
            "pass@8": 0.6,
            "pass@8_before": 0.7,
        },
    ]
    text = compare.table(rows, args)
    # one value per seed, not per run
    assert "| starting model | | 0.200 ± 0.000 | 0.600 ± 0.141 | 0 | | |" in text
    assert "| GRPO | 10 | 0.600 ± 0.141 | 0.750 ± 0.000 | 2.00 ± 1.41 | 2.0 ± 1.4 | 4.00 ± 0.00 |" in text
    assert "| DPO | 10 | 0.400 | 0.600 | 1.00 | 1.0 | 4.00 |" in text  # one seed: no spread
    # another prompt, another start: its accuracy and pass@8 before, measured on its own prompt, in its row
    r1 = {**rows[2], "algo": "r1-rewards", "name": "R1", "accuracy_before": 0.4, "pass@8_before": 0.3}
    text = compare.table(
        [*rows, r1], compare.parse_args(["--algos", "grpo", "dpo", "r1-rewards", "--seeds", "0", "1"])
    )
    assert "| starting model | | 0.200 ± 0.000 | 0.600 ± 0.141 |" in text
    assert "| R1 (from 0.400) | 10 | 0.400 | 0.600 (from 0.300) | 1.00 |" in text


def test_command_settings_are_named_as_args_json_names_them():
    dapo = compare.ALGORITHMS["dapo"][1]  # grpo.py --prompts-per-step 4 --loss-agg token-mean ... --beta 0
    assert compare.command_settings([*dapo, "--no-scale-by-std", "--kl-coef", "-1", "--output-dir", "x"]) == {
        "prompts_per_step": "4",
        "loss_agg": "token-mean",
        "eps_high": "0.28",
        "dynamic_sampling": True,
        "beta": "0",
        "scale_by_std": False,
        "kl_coef": "-1",
    }
    assert (
        compare.same_setting(0.0, "0")
        and compare.same_setting(0.28, "0.28")
        and not compare.same_setting(0.04, "0.4")
    )
    assert compare.same_setting(False, False) and not compare.same_setting(None, "runs/rm/model")
    # one reward model named from the repository and from / is one setting; another folder is not
    assert compare.same_setting(str(compare.REPO / "runs/rm/model"), "runs/rm/model")
    assert not compare.same_setting(str(compare.REPO / "runs/rm2/model"), "runs/rm/model")
    r1 = compare.command_settings(compare.ALGORITHMS["r1-rewards"][1])  # several values after one option
    assert r1 == {
        "prompts_per_step": "4",
        "rewards": ["correct", "format"],
        "reward_weights": ["1", "0.5"],
        "prompt_style": "r1",
    }
    assert compare.same_setting(["correct", "format"], r1["rewards"]) and compare.same_setting(
        [1.0, 0.5], ["1", "0.5"]
    )
    assert compare.same_setting(["correct"], "correct") and not compare.same_setting(
        ["correct", "format"], "correct"
    )


def test_a_finished_run_is_read_back_only_if_its_command_made_it(tmp_path):
    run_dir = tmp_path / "grpo-smollm2-0-20261122-000000"
    run_dir.mkdir()
    made = {
        "model": "smollm2",
        "seed": 0,
        "steps": 5,
        "eval_size": 50,
        "beta": 0.04,
        "verifier": "last-number",
        "scale_by_std": True,
        "output_dir": "elsewhere",
    }
    (run_dir / "args.json").write_text(json.dumps(made))
    command = [
        "grpo.py",
        "--model",
        "smollm2",
        "--seed",
        "0",
        "--steps",
        "5",
        "--eval-size",
        "50",
        "--beta",
        "0.04",
        "--output-dir",
        str(tmp_path),
    ]
    assert compare.finished_run(tmp_path, command) is None  # not finished: no eval.json
    (run_dir / "eval.json").write_text("{}")
    assert compare.finished_run(tmp_path, command) == run_dir  # the folder it was written to does not matter
    for other, wrong in [
        (["--steps", "10"], "steps=5 (not 10)"),  # another --budget into the same --out
        (["--verifier", "strict"], "verifier=last-number (not strict)"),  # another --extra
        (["--no-scale-by-std"], "scale_by_std=True (not False)"),
        (["--reward-model", "runs/rm/model"], "reward_model=None (not runs/rm/model)"),
    ]:
        with pytest.raises(SystemExit, match=re.escape(wrong)):
            compare.finished_run(tmp_path, [*command, *other])


def test_a_study_stage_is_read_back_only_if_its_command_made_it(tmp_path):
    """scripts/prm_reward.py's and prm_vs_orm.py's stages: a second call into the same --out with another --lr,
    --ppo-batch-size or --model once printed the first call's numbers under the new header."""
    run_dir = tmp_path / "ppo-seed0" / "ppo-smollm2-0-20261205-000000"
    run_dir.mkdir(parents=True)
    (run_dir / "args.json").write_text(json.dumps({"model": "smollm2", "lr": 1e-6, "batch_size": 64}))
    (run_dir / "eval.json").write_text("{}")
    command = ["ppo.py", "--model", "smollm2", "--lr", "1e-6", "--batch-size", "64"]
    assert prm_vs_orm.run_stage(tmp_path, "ppo-seed0", command) == run_dir
    for other, wrong in [
        (["--lr", "3e-6"], "lr=1e-06 (not 3e-6)"),
        (["--batch-size", "32"], "batch_size=64"),
    ]:
        with pytest.raises(SystemExit, match=re.escape(wrong)):
            prm_vs_orm.run_stage(tmp_path, "ppo-seed0", [*command, *other])


def test_sampled_kl_is_zero_to_itself_and_a_mean_per_completion(tmp_path, tokenizer):
    model = models.load_model("tiny", len(tokenizer), torch.device("cpu"))
    runs.save_checkpoint(model, tokenizer, tmp_path / "same")
    with torch.no_grad():  # a model trained away from the base "tiny"
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(3)) * 0.5)
    runs.save_checkpoint(model, tokenizer, tmp_path / "model")
    itself = compare.sampled_measures(
        str(tmp_path / "same"), "tiny", 8, seed=3, device="cpu", k=2, max_new_tokens=6
    )
    # the reference is scored too (a path is not the base name): exactly 0
    assert (itself["pass@2"], itself["kl"]) == (0.0, 0.0)
    assert 1 <= itself["length"] <= 6  # tokens a completion, EOS included, at most max_new_tokens
    one = compare.sampled_measures(
        str(tmp_path / "model"), "tiny", 8, seed=4, device="cpu", k=1, max_new_tokens=6
    )["kl"]
    four = compare.sampled_measures(
        str(tmp_path / "model"), "tiny", 8, seed=4, device="cpu", k=4, max_new_tokens=6
    )["kl"]
    assert one > 0.05  # two different near-uniform random tiny models; the reversed sign would give < 0
    # a mean per completion: summed over k samples but divided by the prompts only, it would be ~4×
    assert 0.5 < four / one < 2


def test_sampled_measures_ask_the_questions_as_the_run_did(tmp_path, tokenizer, monkeypatch):
    asked = []
    tokenize_prompts = tasks.tokenize_prompts

    def recording(tokenizer, questions, device):
        asked.extend(questions)
        return tokenize_prompts(tokenizer, questions, device)

    monkeypatch.setattr(tasks, "tokenize_prompts", recording)
    compare.sampled_measures(
        "tiny", "tiny", 4, seed=0, device="cpu", k=2, max_new_tokens=4, prompt_style="r1"
    )
    assert len(asked) == 4 and all(q.endswith(tasks.R1_INSTRUCTION) for q in asked)
    asked.clear()
    compare.sampled_measures("tiny", "tiny", 4, seed=0, device="cpu", k=2, max_new_tokens=4)
    assert asked == [p.prompt for p in tasks.heldout_problems(4)]


def test_a_tiny_comparison_end_to_end_and_a_rerun_reads_it_back(tmp_path):
    argv = [
        "--model",
        "tiny",
        "--algos",
        "grpo",
        "r1-rewards",
        "--seeds",
        "0",
        "--budget",
        "32",
        "--eval-size",
        "4",
        "--pass-k",
        "2",
        "--out",
        str(tmp_path),
        "--extra",
        "--max-new-tokens 6",
    ]
    proc = run_script("scripts/compare.py", *argv)
    assert proc.returncode == 0, proc.stderr
    row, r1_row = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert row["algo"] == "grpo" and row["steps"] == 1 and row["completions"] == 32 and "pass@2" in row
    run_dir = tmp_path / "grpo" / "seed-0"
    # the model is measured, then deleted
    assert not list(run_dir.glob("*/model")) and list(run_dir.glob("*/sampled-k2.json"))
    # the script does not sample pass@k twice
    assert json.loads(next(run_dir.glob("*/args.json")).read_text())["pass_k"] == 0
    # measured once per seed
    assert list((tmp_path / "starting-model").glob("seed-0-k2-4-problems-6-tokens.json"))
    # the R1 run's columns, its start's pass@k too, on R1 prompts (read from its args.json)
    assert list((tmp_path / "starting-model").glob("seed-0-k2-4-problems-6-tokens-r1-prompts.json"))
    assert r1_row["algo"] == "r1-rewards" and "pass@2" in r1_row
    log = (run_dir / "log.txt").stat().st_mtime
    again = run_script_here("scripts/compare.py", *argv)
    assert again.returncode == 0 and (run_dir / "log.txt").stat().st_mtime == log  # not rerun
    assert (tmp_path / "comparison.md").read_text().count("| GRPO | 1 |") == 1


# ---- scripts/beta_sweep.py ------------------------------------------------------------------------------------------


def test_beta_sweep_table_shows_the_learned_score_only_for_ppo():
    rows = [
        {
            "beta": 0.04,
            "accuracy_before": 0.2,
            "accuracy": 0.6,
            "score_before": -1.0,
            "score": 2.5,
            "kl": 3.25,
            "distinct": 0.5,
            "entropy": 0.75,
        }
    ]
    grpo = beta_sweep.table(rows, beta_sweep.parse_args(["grpo"]))
    assert (
        "| starting model | 0 | 0.200 | | |\n| 0.04 | 3.25 | 0.600 | 0.50 | 0.75 |" in grpo
        and "learned" not in grpo
    )
    ppo = beta_sweep.table(rows, beta_sweep.parse_args(["ppo", "--reward-model", "x"]))
    assert "| starting model | 0 | 0.200 | -1.000 | | |\n| 0.04 | 3.25 | 0.600 | 2.500 | 0.50 | 0.75 |" in ppo
    with pytest.raises(SystemExit):
        beta_sweep.parse_args(["ppo"])  # no reward model


def test_a_tiny_grpo_beta_sweep_runs_each_beta_with_its_flag(tmp_path):
    proc = run_script_here(
        "scripts/beta_sweep.py",
        "grpo",
        "--model",
        "tiny",
        "--betas",
        "0",
        "0.5",
        "--steps",
        "1",
        "--eval-size",
        "4",
        "--out",
        str(tmp_path),
        "--extra",
        "--max-new-tokens 6 --prompts-per-step 2 --group-size 2",
    )
    assert proc.returncode == 0, proc.stderr
    for beta in ("0", "0.5"):
        run_args = json.loads(next((tmp_path / f"beta-{beta}").glob("*/args.json")).read_text())
        assert run_args["beta"] == float(beta) and run_args["steps"] == 1
    assert (tmp_path / "sweep.md").read_text().count("\n| 0") == 2


def test_accuracy_is_drawn_against_the_elapsed_time_of_its_step(tmp_path):
    run = tmp_path / "grpo-run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "time/elapsed": 30.0 * s}) + "\n" for s in (1, 2, 3, 4))
    )
    (run / "eval.json").write_text(
        json.dumps(
            {
                "evals": [
                    {"step": 0, "accuracy": 0.2},
                    {"step": 2, "accuracy": 0.5},
                    {"step": 4, "accuracy": 0.6},
                ]
            }
        )
    )
    # 60 s at step 2, 120 s at step 4
    assert accuracy_vs_time.curve(run) == ([0.0, 1.0, 2.0], [0.2, 0.5, 0.6])
    pytest.importorskip("matplotlib")
    accuracy_vs_time.main(
        [str(run), str(run), "--label", "a", "--label", "b", "--out", str(tmp_path / "c.png")]
    )
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(SystemExit):
        accuracy_vs_time.main([str(run), "--label", "a", "--label", "b"])  # two labels for one run


def test_majority_vote_picks_the_first_solution_of_the_most_frequent_final_number():
    # final numbers 5, 7, 7, none, 5, 7: 7 wins three to two; its first solution is index 1
    texts = ["2 + 3 = 5", "3 + 4 = 7", "7", "no idea", "5", "1 + 6 = 7"]
    assert prm_vs_orm.majority_pick(texts) == 1
    assert prm_vs_orm.majority_pick(["= 9", "= 4", "= 4", "= 9"]) == 0  # a tie: the number seen first
    assert prm_vs_orm.majority_pick(["none", "", "nothing"]) == 0  # no number at all


def test_prm_reward_runs_grpo_and_ppo_on_the_same_number_of_samples():
    args = prm_reward.parse_args(["--steps", "10", "--prompts-per-step", "16", "--ppo-batch-size", "32"])
    commands = {
        row: prm_reward.rl_command(row, "SFT", "PRM", REPO / "chains.jsonl", 60, 1, args)
        for row in prm_reward.ROWS
    }

    def option(command, name):
        return command[command.index(name) + 1]

    # GRPO: 10 steps × 16 chains × 8 samples = 1,280; PPO: 1,280 / 32 = 40 steps of 32 completions
    for row in ("grpo-outcome", "grpo-process"):
        assert option(commands[row], "--steps") == "10"
        assert option(commands[row], "--prompts-per-step") == "16"
        assert option(commands[row], "--lr") == "2e-06"
    for row in ("ppo-outcome", "ppo-dense"):
        assert option(commands[row], "--steps") == "40"
        assert option(commands[row], "--batch-size") == "32"
        assert option(commands[row], "--reward") == "verifier"
        assert "--lr" not in commands[row]  # PPO's own learning rate
    # the PRM reaches exactly the two rows that train on it; everything else is shared
    assert [row for row, command in commands.items() if "--prm" in command] == ["grpo-process", "ppo-dense"]
    assert {command[0] for command in commands.values()} == {"grpo.py", "grpo_prm.py", "ppo.py", "ppo_prm.py"}
    for command in commands.values():
        assert option(command, "--model") == "SFT"
        assert option(command, "--seed") == "1"
        assert option(command, "--eval-size") == "60"
    with pytest.raises(SystemExit, match="must divide GRPO's 1280 samples"):
        prm_reward.ppo_steps(prm_reward.parse_args(["--ppo-batch-size", "48"]))


def test_orm_pairs_put_a_right_solution_over_a_wrong_one_of_the_same_prompt():
    rows = [
        {"prompt": "p", "completion": c, "correct": ok}
        for c, ok in (("r1", 1), ("w1", 0), ("w2", 0), ("w3", 0))
    ]
    rows += [{"prompt": "q", "completion": c, "correct": 1} for c in ("r2", "r3")]  # all right: no pair
    pairs = prm_vs_orm.right_wrong_pairs(rows, per_problem=2)
    assert pairs == [
        {"prompt": "p", "chosen": "r1", "rejected": "w1"},
        {"prompt": "p", "chosen": "r1", "rejected": "w2"},
    ]
    assert len(prm_vs_orm.right_wrong_pairs(rows, per_problem=8)) == 3  # at most max(rights, wrongs) pairs


def test_rm_agreement_samples_every_policy_with_the_same_seed(tmp_path, digits_are_correct, capsys):
    import reward_model

    trained = reward_model.main(
        args_of(
            reward_model.Args,
            model="tiny",
            dataset=PAIRS,
            steps=1,
            batch_size=4,
            output_dir=str(tmp_path),
            save_model=True,
        )
    )
    out = tmp_path / "agreement.json"
    rows = rm_agreement.main(
        rm_agreement.parse_args(
            [
                "--reward-model",
                f"{trained['run_dir']}/model",
                "--policies",
                "tiny",
                "tiny",
                "--eval-size",
                "6",
                "--samples-per-prompt",
                "3",
                "--max-new-tokens",
                "4",
                "--out",
                str(out),
            ]
        )
    )
    first, second = ({k: v for k, v in row.items() if k != "policy"} for row in rows)
    # the same samples, labels of both kinds
    assert first == second and 0 < first["agreement/sample_accuracy"] < 1
    assert json.loads(out.read_text()) == rows
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| tiny |")]
    assert len(table) == 2 and f"| {first['agreement/auc']:.3f} |" in table[0]
    missing = run_script_here(
        "scripts/rm_agreement.py", "--reward-model", str(tmp_path / "none"), "--policies", "tiny"
    )
    assert_one_line_error(missing, str(tmp_path / "none"))


def test_policy_pairs_puts_the_earlier_rounds_first_then_the_policys_own(
    tmp_path, digits_are_correct, capsys
):
    out = tmp_path / "round2" / "pairs.jsonl"
    pairs = policy_pairs.main(
        policy_pairs.parse_args(
            [
                "--policy",
                "tiny",
                "--num-prompts",
                "16",
                "--samples-per-prompt",
                "4",
                "--max-new-tokens",
                "6",
                "--out",
                str(out),
                "--add",
                PAIRS,
            ]
        )
    )
    earlier = [json.loads(line) for line in open(PAIRS)]
    assert [json.loads(line) for line in open(out)] == pairs and pairs[: len(earlier)] == earlier
    own = pairs[len(earlier) :]
    # digits_are_correct: a right answer holds a digit
    assert own and all(
        any(c.isdigit() for c in p["chosen"]) and not any(c.isdigit() for c in p["rejected"]) for p in own
    )
    assert (
        f"{len(pairs)} pairs in {out}: {len(earlier)} from --add, {len(own)} from tiny"
        in capsys.readouterr().out
    )
    assert_one_line_error(
        run_script_here(
            "scripts/policy_pairs.py",
            "--policy",
            "tiny",
            "--out",
            str(out),
            "--add",
            str(tmp_path / "none.jsonl"),
        ),
        "--add",
    )


# ---- scripts/sensitivity.py ------------------------------------------------------------------------------------------
def test_every_sensitivity_row_is_a_command_its_script_parses():
    import importlib

    import tyro

    for study, spec in sensitivity.STUDIES.items():
        for setting, extra, *base in spec.rows:
            command = [*compare.ALGORITHMS[base[0] if base else spec.base][1], *extra]
            script = importlib.import_module(command[0].removesuffix(".py"))
            # a misspelled option would stop tyro here, hours into a study
            args = tyro.cli(script.Args, args=command[1:])
            options = compare.command_settings(command)
            for key, value in options.items():
                made = getattr(args, key, None)
                made = getattr(args.lora, key) if made is None and hasattr(args.lora, key) else made
                assert compare.same_setting(made, value), (study, setting, key)
        assert len({setting for setting, *_ in spec.rows}) == len(spec.rows), study  # one folder a setting


def test_a_setting_several_studies_share_is_run_once(monkeypatch):
    assert sensitivity.run_slug("ppo-clip", "ε = 0.1") == "ppo-clip/row-0"
    for study, setting in [
        ("ppo-clip", "ε = 0.2 (ppo.py's)"),
        ("ppo-gae", "γ = 1, λ = 1 (ppo.py's, verl's)"),
        ("ppo-coefficients", "c_v = 0.1, c_e = 0 (ppo.py's)"),
        ("ppo-kl", "fixed β = 0.001 (ppo.py's, verl's)"),
    ]:
        assert sensitivity.run_slug(study, setting) == "ppo-clip/row-1"
    assert sensitivity.run_slug("ppo-kl", "fixed β = 0.02 (InstructGPT's)") == "ppo-kl/row-1"
    assert sensitivity.run_slug("simpo-gamma", "DPO, β = 0.1") == "dpo-beta/row-1"
    assert sensitivity.run_slug("ppo-ensemble", "one reward model") == "ppo-critic-init/row-0"
    # the same command as ppo-clip's shared row, at another budget, is another run
    clip = sensitivity.STUDIES["ppo-clip"]
    longer = sensitivity.Study("", clip.base, clip.budget * 2, (("ε = 0.2 (ppo.py's)", ()),))
    monkeypatch.setitem(sensitivity.STUDIES, "ppo-longer", longer)
    assert sensitivity.run_slug("ppo-longer", "ε = 0.2 (ppo.py's)") == "ppo-longer/row-0"


def test_ppo_on_a_learned_reward_trains_its_reward_models_first():
    assert compare.reward_model_seeds(["grpo.py"], 1) == []
    assert compare.reward_model_seeds(["ppo.py", "--reward", "verifier"], 1) == []
    assert compare.reward_model_seeds(["ppo.py", "--reward", "model"], 1) == [1]
    ensemble = ["ppo_overoptimisation.py", "--reward", "model", "--ensemble-agg", "min"]
    assert compare.reward_model_seeds(ensemble, 2) == [2, 1002, 2002]


class Stop(Exception):
    pass


def test_an_ensemble_run_is_given_its_members(monkeypatch, tmp_path):
    pairs_of = {}

    def trained(args, seed, out, pairs_of_seed=None):
        pairs_of[seed] = pairs_of_seed
        folder = tmp_path / f"rm-{seed}"
        folder.mkdir()
        (folder / "eval.json").write_text('{"wall_time_s": 1.0}')
        return folder

    commands = []

    def run(command, log):
        commands.append(command)
        raise Stop  # the command is all this test is about

    monkeypatch.setattr(compare, "reward_model_run", trained)
    monkeypatch.setattr(compare, "run", run)
    ensemble = ["ppo_overoptimisation.py", "--reward", "model", "--ensemble-agg", "min"]
    monkeypatch.setitem(compare.ALGORITHMS, "ppo-ensemble", ("PPO, an ensemble", ensemble, 8))
    args = compare.parse_args(["--out", str(tmp_path / "out")])
    with pytest.raises(Stop):
        compare.one_run(args, "ppo-ensemble", 2, tmp_path / "out")
    settings = compare.command_settings(commands[0])
    assert settings["reward_model"] == str(tmp_path / "rm-2" / "model")
    assert settings["ensemble"] == [str(tmp_path / "rm-1002" / "model"), str(tmp_path / "rm-2002" / "model")]
    assert settings["ensemble_agg"] == "min"
    # the first samples its own pairs; the others train on them
    assert pairs_of == {2: None, 1002: 2, 2002: 2}


def test_an_ensemble_member_trains_on_the_pairs_the_first_sampled(monkeypatch, tmp_path):
    out = tmp_path / "out"
    first = out / "reward-model" / "seed-2"
    first.mkdir(parents=True)
    # the line preferences.load_preference_pairs prints
    log = "preference pairs: 247 train, 32 held-out, from /cache/preference-data/v2-seed2\nstep 0: ...\n"
    (first / "log.txt").write_text(log)
    commands = []

    def run(command, log):
        commands.append(command)
        raise Stop

    monkeypatch.setattr(compare, "run", run)
    args = compare.parse_args(["--out", str(out)])
    with pytest.raises(Stop):
        compare.reward_model_run(args, 1002, out, pairs_of=2)
    member = compare.command_settings(commands[0])
    assert member["dataset"] == "/cache/preference-data/v2-seed2/train.jsonl"
    assert member["seed"] == "1002"
    with pytest.raises(Stop):
        compare.reward_model_run(args, 2, out)
    assert "dataset" not in compare.command_settings(commands[1])
    (first / "log.txt").write_text("step 0: ...\n")
    with pytest.raises(SystemExit, match="names no sampled preference pairs"):
        compare.reward_model_run(args, 1002, out, pairs_of=2)


def test_sensitivity_reads_a_metric_as_its_mean_over_steps_its_last_value_or_a_quarter_s_mean(tmp_path):
    lines = [
        {"step": 1, "kl": 0.5, "rewards/margins": 1.0},
        {"step": 2, "rewards/margins": 3.0},
        {"step": 3, "kl": 1.5},
        {"step": 4, "kl": float("nan")},  # undefined at that step
    ]
    lines += [{"step": step, "loss": float(step)} for step in range(5, 13)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert sensitivity.logged(tmp_path, "kl", "mean") == 1.0  # the steps that logged it: (0.5 + 1.5) / 2
    assert sensitivity.logged(tmp_path, "rewards/margins", "last") == 3.0
    assert sensitivity.logged(tmp_path, "entropy", "mean") is None
    # losses 5..12 at 8 steps: a quarter is 2 steps; with 2 steps logged, a quarter is 1
    assert sensitivity.logged(tmp_path, "loss", "first quarter") == 5.5
    assert sensitivity.logged(tmp_path, "loss", "last quarter") == 11.5
    assert sensitivity.logged(tmp_path, "rewards/margins", "first quarter") == 1.0


def test_a_study_column_named_like_a_measure_of_compare_leaves_it_as_it_was(monkeypatch, tmp_path):
    """PPO logs a "kl" of its own (its training batches' KL to the reference), and compare.py's "kl" is the KL
    to the starting model on held-out samples: the row keeps both."""
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "kl": 5.0}\n{"step": 2, "kl": 7.0}\n')
    (tmp_path / "sampled-k4.json").write_text('{"length": 12.0}')

    def one_run(args, slug, seed, out):
        return {"kl": 0.25, "run_dir": str(tmp_path)}

    monkeypatch.setattr(sensitivity.compare, "one_run", one_run)
    # one_row adds its row to the table of runs
    monkeypatch.setattr(sensitivity.compare, "ALGORITHMS", dict(sensitivity.compare.ALGORITHMS))
    args = sensitivity.parse_args([])
    row = sensitivity.STUDIES["ppo-clip"].rows[0]
    result = sensitivity.one_row(args, "ppo-clip", row, 0, tmp_path)
    assert result["kl"] == 0.25 and result["kl (mean)"] == 6.0 and result["length"] == 12.0


def test_sensitivity_table_by_hand():
    def row(setting, seed, accuracy, nll_after):
        return {
            "setting": setting,
            "seed": seed,
            "completions": 160,
            "accuracy_before": 0.3,
            "accuracy": accuracy,
            "kl": 1.0,
            "length": 10.0,
            "general_nll_before": 3.0,
            "general_nll_after": nll_after,
            "wall_time_s": 60.0,
            "completion_length (mean)": 20.0,
            "completion_truncated (mean)": 0.5,
        }

    rows = [row("no overlong penalty", 0, 0.4, 3.1), row("no overlong penalty", 1, 0.6, 3.3)]
    args = sensitivity.parse_args(["--seeds", "0", "1"])
    lines = sensitivity.table("dapo-overlong", rows, args).splitlines()
    assert lines[2] == (
        "| setting | held-out accuracy | KL to start | sampled length | general NLL change | "
        "completion_length (mean) | completion_truncated (mean) | wall time (min) |"
    )
    assert lines[4] == "| starting model | 0.300 ± 0.000 | 0 |  | (NLL 3.000 ± 0.000) |  |  |  |"
    # NLL change per seed: 0.1 and 0.3, mean 0.2, sample std 0.141
    cells = "0.500 ± 0.141 | 1.00 ± 0.00 | 10.0 ± 0.0 | 0.200 ± 0.141 | 20.000 ± 0.000 | 0.500 ± 0.000 | 1.0 ± 0.0"
    assert lines[5] == f"| no overlong penalty | {cells} |"
    assert len(lines) == 6  # the row not yet run is left out


def test_a_claim_column_defined_on_some_seeds_says_how_many_it_averages():
    # explained variance is NaN on a step whose returns are all equal; a run where every step was so logs none
    assert sensitivity.claim_cell([0.5, None, 0.7]) == "0.600 ± 0.141 (2 of 3 seeds)"
    assert sensitivity.claim_cell([None, 0.25, None]) == "0.250 (1 of 3 seeds)"
    assert sensitivity.claim_cell([0.5, 0.7]) == "0.600 ± 0.141"
    assert sensitivity.claim_cell([None, None]) == ""
