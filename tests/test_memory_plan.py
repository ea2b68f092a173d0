"""scripts/memory_plan.py: parameter counts of published configs, activations by hand, and the plan against the
live bytes the CPU allocator reports and against loaded models."""

import re
import sys
import types
from pathlib import Path

import pytest
import torch
import transformers

import common
from infra import fsdp
from infra import models
import prm
from infra import runs
from task import stepwise
import variants
from conftest import args_of, policy_args, run_script

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dev"))
import memory_plan  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
from live_memory import peak_live_bytes  # noqa: E402


LLAMAS = {  # published parameter counts: SmolLM2-135M (tied embeddings), TinyLlama-1.1B, Llama-2-7B
    "135M": (
        dict(
            hidden_size=576,
            num_hidden_layers=30,
            intermediate_size=1536,
            num_attention_heads=9,
            num_key_value_heads=3,
            vocab_size=49152,
            tie_word_embeddings=True,
        ),
        134_515_008,
    ),
    "1.1B": (
        dict(
            hidden_size=2048,
            num_hidden_layers=22,
            intermediate_size=5632,
            num_attention_heads=32,
            num_key_value_heads=4,
            vocab_size=32000,
        ),
        1_100_048_384,
    ),
    "7B": (
        dict(
            hidden_size=4096,
            num_hidden_layers=32,
            intermediate_size=11008,
            num_attention_heads=32,
            num_key_value_heads=32,
            vocab_size=32000,
        ),
        6_738_415_616,
    ),
}


@pytest.mark.parametrize("size", LLAMAS)
def test_parameter_counts_of_llama_configs_built_on_the_meta_device(size):
    kwargs, published = LLAMAS[size]
    assert memory_plan.parameter_counts(transformers.LlamaConfig(**kwargs), "lm", common.LoraOptions()) == (
        published,
        published,
    )


@pytest.mark.parametrize(
    "path, published",  # Qwen2.5-0.5B and -1.5B, tied embeddings: their model cards' 0.49B and 1.54B
    [
        ("configs/qwen2.5-0.5b.json", 494_032_768),
        ("configs/qwen2.5-1.5b.json", 1_543_714_304),
        ("configs/llama-2-7b.json", 6_738_415_616),  # Llama-2-7B's published shape
    ],
)
def test_the_config_only_models_have_their_published_parameter_counts(path, published):
    config = memory_plan.model_config(str(REPO / path), vocab_size=49152)
    assert memory_plan.parameter_counts(config, "lm", common.LoraOptions()) == (published, published)


def test_lora_trainable_parameters_of_llama_7b():
    config = transformers.LlamaConfig(**LLAMAS["7B"][0])
    # per layer r·(in + out): q, k, v, o 4 × 16 · (4096 + 4096) = 524,288; gate, up 2 × 16 · (4096 + 11008) = 483,328;
    # down 16 · (11008 + 4096) = 241,664; sum 1,249,280 × 32 layers = 39,976,960
    # (what peft reports for r = 16, all-linear)
    total, trainable = memory_plan.parameter_counts(config, "lm", common.LoraOptions(lora_r=16))
    assert trainable == 39_976_960 and total == 6_738_415_616 + 39_976_960
    # a reward model: the score head (4096 × 1) trains in full beside the adapters
    assert (
        memory_plan.parameter_counts(config, "score", common.LoraOptions(lora_r=16))[1] == 39_976_960 + 4096
    )
    assert (
        memory_plan.parameter_counts(
            config, "lm", common.LoraOptions(lora_r=16, lora_targets="q_proj,v_proj")
        )[1]
        == 2 * 16 * 8192 * 32
    )


def test_activation_bytes_by_hand():
    config = transformers.LlamaConfig(
        hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=16, vocab_size=10
    )
    # 2 sequences of 4 tokens: per layer s·b·h·(34 + 5·a·s/h) = 8·8·(34 + 5·2·4/8) = 2496 bytes at 16 bits,
    # 4992 in fp32; 2 layers 9984, plus the logits of 6 scored positions, 60 numbers, on the plain path: the logits
    # and their gradient in the compute dtype, 2·60·4 = 480 bytes in fp32 (2·60·2 = 240 in bf16), and three float32
    # tensors of the one piece (both sequences, far below common.LOGPROB_PIECE): 3·60·4 = 720
    assert memory_plan.activation_bytes(config, 2, 8, 6, "fp32", checkpointing=False) == 9984 + 480 + 720
    assert (
        memory_plan.activation_bytes(config, 2, 8, 6, "bf16-mixed", checkpointing=False) == 4992 + 240 + 720
    )
    # with the kernel, 2 tensors (the logits and their gradient): 2·6·10·4 = 480 bytes in fp32, 2·6·10·2 = 240 in bf16
    assert (
        memory_plan.activation_bytes(config, 2, 8, 6, "fp32", checkpointing=False, kernels_on=True)
        == 9984 + 480
    )
    assert (
        memory_plan.activation_bytes(config, 2, 8, 6, "bf16-mixed", checkpointing=False, kernels_on=True)
        == 4992 + 240
    )
    # checkpointing keeps each layer's input 2·(s·b·h) = 2·64 = 128 bytes (×2 in fp32) and one layer's full set
    assert memory_plan.activation_bytes(config, 2, 8, 6, "fp32", checkpointing=True) == 2 * 256 + 4992 + 1200


def test_autocast_copies_and_a_bf16_reference_by_hand():
    config = transformers.LlamaConfig(
        hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=16, vocab_size=10
    )
    # a layer's linear maps: q, k, v, o 8×8 each and gate, up, down 8×16 each, 4·64 + 3·128 = 640; the untied
    # output layer 10×8 = 80
    assert memory_plan.matmul_parameters(config) == (2 * 640, 80, False)
    # bf16-mixed: 2 bytes for each of them, (1280 + 80)·2; a score head has no vocabulary layer; checkpointing
    # keeps one layer's
    assert memory_plan.autocast_copies_bytes(config, "lm", "bf16-mixed", False) == 2720
    assert memory_plan.autocast_copies_bytes(config, "score", "bf16-mixed", False) == 2560
    assert memory_plan.autocast_copies_bytes(config, "lm", "bf16-mixed", True) == (640 + 80) * 2
    assert memory_plan.autocast_copies_bytes(config, "lm", "fp32", False) == 0
    assert memory_plan.autocast_copies_bytes(config, "lm", "bf16-true", False) == 0
    # a trained model's row: its activations and the copies
    policy = [("policy", config, "lm", True)]
    (row,) = memory_plan.memory_plan(policy, "bf16-mixed", common.LoraOptions(), False, 2, 8, 6)[
        "memory_plan"
    ]
    assert (
        row["activations_gb"] * 2**30 == 4992 + 240 + 720 + 2720
    )  # test_activation_bytes_by_hand's, + copies
    # the reference under bf16-mixed: float32 embeddings, norms; bf16 linear maps and output layer
    params, _ = memory_plan.parameter_counts(config, "lm", common.LoraOptions())
    held = [("reference", config, "lm", False)]
    (row,) = memory_plan.memory_plan(held, "bf16-mixed", common.LoraOptions(), False, 1, 1, 1)["memory_plan"]
    assert row["weights_gb"] * 2**30 == 4 * params - 2 * (1280 + 80)
    (row,) = memory_plan.memory_plan(held, "bf16-mixed", common.LoraOptions(), False, 1, 1, 1, ranks=2)[
        "memory_plan"
    ]
    assert row["weights_gb"] * 2**30 == 4 * params / 2  # --fsdp: float32, as models.load_policy leaves it


@pytest.mark.parametrize("share_prompt", [True, False])
def test_activation_plan_matches_the_allocators_live_bytes(tokenizer, share_prompt):
    """The plan's activations + gradients against the peak of live bytes the CPU allocator reports (torch's
    profiler) through one forward and backward. Measured here: 0.88 (shared prompt) and 0.81 of the plan. The
    bound catches a factor-2 slip (fp32 activations counted as 16-bit, or the layers counted once)."""

    model = models.load_model("tiny", len(tokenizer), torch.device("cpu"))
    model.train()
    P, G, S, T = 2, 4, 6, 10
    generator = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(3, len(tokenizer), (P, S), generator=generator)
    completion_ids = torch.randint(3, len(tokenizer), (P * G, T), generator=generator)

    def forward_backward():
        logprobs, _ = common.completion_logprobs(
            model,
            prompt_ids,
            torch.ones_like(prompt_ids),
            completion_ids,
            torch.full((P,), G),
            share_prompt=share_prompt,
        )
        logprobs.sum().backward()

    peak = peak_live_bytes(forward_backward)
    tokens = P * S + P * G * T if share_prompt else P * G * (S + T)
    planned = memory_plan.activation_bytes(model.config, P * G, tokens, P * G * T, "fp32", False) + 4 * sum(
        p.numel() for p in model.parameters()
    )
    assert 0.75 < peak / planned < 1.25, peak / planned


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed", "bf16-true"])
@pytest.mark.parametrize("name", ["tiny", "tiny-gpt2"])
def test_memory_plan_matches_the_loaded_models(tokenizer, precision, name):
    device = torch.device("cpu")
    args = policy_args(name, fsdp=False)
    policy, reference = models.load_policy(args, tokenizer, device, precision, False, None, True)
    critic = models.load_model(name, len(tokenizer), device, precision, head="score")
    measured = memory_plan.loaded_table(
        {"policy": policy, "reference": reference, "critic": critic}, {"policy", "critic"}
    )
    config = memory_plan.model_config(name, len(tokenizer))
    plan = memory_plan.memory_plan(
        [
            ("policy", config, "lm", True),
            ("reference", config, "lm", False),
            ("critic", config, "score", True),
        ],
        precision,
        common.LoraOptions(),
        False,
        2,
        16,
        8,
    )["memory_plan"]
    for planned, real in zip(plan, measured):
        for key in ("parameters", "weights_gb", "gradients_gb", "optimizer_gb"):
            assert planned[key] == pytest.approx(real[key], rel=1e-9), (planned["model"], key)


@pytest.mark.parametrize(
    "algo, argv",
    [
        ("grpo", []),
        ("dpo", []),
        ("ppo", ["--reward", "verifier"]),
        ("sft", []),
        ("reward_model", []),
        ("variants", ["--algo", "kto"]),
        ("prm", []),
    ],
)
def test_the_planner_prints_each_scripts_plan_and_starts_nothing(tmp_path, capsys, algo, argv):
    memory_plan.main([algo, "--model", "tiny", "--output-dir", str(tmp_path), *argv])
    printed = capsys.readouterr().out
    assert "memory plan: precision fp32" in printed
    # the first row: the trained model
    assert re.search(r"^(policy|reward model|PRM) ", printed, re.MULTILINE)
    assert not list(tmp_path.iterdir())  # no run folder: nothing was started


def test_the_planner_runs_from_its_command_line(tmp_path):
    proc = run_script("scripts/memory_plan.py", "ppo", "--model", "tiny", "--output-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^policy ", proc.stdout, re.MULTILINE) and "critic" in proc.stdout


@pytest.mark.parametrize("kernels_on", [False, True])
@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_the_plans_logits_term_matches_the_allocators_live_bytes(precision, kernels_on):
    """As above where the vocabulary dominates (32,768 tokens, hidden size 64), in float32 and under bf16 autocast:
    the peak of live bytes through a forward and backward was 0.87 and 1.01 of the plan (activations + gradients)
    on the plain path (one piece), 0.89 and 1.00 with kernels.token_logprobs. Three float32 tensors for both (an
    earlier plan) gave 0.64 and 0.44 with the kernel."""

    model = models.make_tiny_model(32768, "llama").train()
    model.bf16_mixed, model.kernels_on = precision == "bf16-mixed", kernels_on
    P, G, S, T = 2, 4, 6, 15
    generator = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(3, 32768, (P, S), generator=generator)
    completion_ids = torch.randint(3, 32768, (P * G, T), generator=generator)

    def forward_backward():
        logprobs, _ = common.completion_logprobs(
            model,
            prompt_ids,
            torch.ones_like(prompt_ids),
            completion_ids,
            torch.full((P,), G),
            with_entropy=True,
        )
        logprobs.sum().backward()

    forward_backward()  # a warm-up; then the gradients are freed, as after each optimizer step
    model.zero_grad(set_to_none=True)
    peak = peak_live_bytes(forward_backward)
    gradients = 4 * sum(p.numel() for p in model.parameters())
    planned = memory_plan.activation_bytes(
        model.config, P * G, P * S + P * G * T, P * G * (T + 1), precision, False, kernels_on
    )
    assert 0.8 < peak / (planned + gradients) < 1.2, peak / (planned + gradients)


def test_grpo_plan_counts_a_reward_model_and_the_prompt_length_can_be_set(dropout_checkpoint):
    plan = memory_plan.main(["grpo", "--model", "tiny", "--reward-model", dropout_checkpoint])
    assert [row["model"] for row in plan["memory_plan"]] == ["policy", "reference", "reward model"]
    assert plan["memory_plan"][2]["gradients_gb"] == 0 and plan["memory_plan"][2]["weights_gb"] > 0
    longer = memory_plan.main(["grpo", "--model", "tiny", "--prompt-tokens", "400"])
    assert longer["memory_plan"][0]["activations_gb"] > plan["memory_plan"][0]["activations_gb"]
    # the catalogue's ensemble: each of its reward models held
    two = memory_plan.main(
        ["grpo_options", "--model", "tiny", "--reward-model", dropout_checkpoint, dropout_checkpoint]
    )
    assert [row["model"] for row in two["memory_plan"]][2:] == ["reward model 1", "reward model 2"]


def test_one_rank_of_fsdp_holds_a_quarter_of_the_weights_gradients_and_adamw_state_and_all_its_activations():
    whole = memory_plan.main(["grpo", "--model", "tiny", "--prompt-tokens", "40"])["memory_plan"]
    rank = memory_plan.main(["grpo", "--model", "tiny", "--prompt-tokens", "40", "--ranks", "4"])[
        "memory_plan"
    ]
    for one, shard in zip(whole, rank):
        for column in ("weights_gb", "gradients_gb", "optimizer_gb"):
            assert shard[column] == pytest.approx(one[column] / 4, rel=1e-12)
        assert shard["activations_gb"] == one["activations_gb"]  # FSDP splits no activation
    with pytest.raises(runs.InputError, match="--ranks needs a whole number >= 1"):
        memory_plan.main(["grpo", "--model", "tiny", "--ranks", "0"])


def held_through_the_loop(monkeypatch, script, forward: tuple, args) -> tuple[list[tuple], list[int]]:
    """What `script.main(args)` really holds and trains: (head, trained?, parameters) of each model it gives
    fsdp.shard (every model its loop holds), and the rows of each call of `forward` (module, name: a function whose
    result's first element is (B, ...)) that carries a gradient: one micro-batch's sequences."""
    held, sequences = [], []

    def shard(on, *sharded):
        for model in filter(None, sharded):
            head = "score" if hasattr(common.unwrap(model), "score") else "lm"
            trained = any(p.requires_grad for p in model.parameters())
            held.append((head, trained, sum(p.numel() for p in model.parameters())))

    module, name = forward
    real = getattr(module, name)

    def watched(*call_args, **call_kwargs):
        out = real(*call_args, **call_kwargs)
        if out[0].requires_grad:  # the trained forward, not the reference's or an evaluation's
            sequences.append(out[0].shape[0])
        return out

    monkeypatch.setattr(fsdp, "shard", shard)
    monkeypatch.setattr(module, name, watched)
    script.main(args)
    return held, sequences


def planned(algo: str, args, vocab_size: int) -> tuple[list[tuple], int]:
    """(head, trained?, parameters) of each model the plan holds, and its micro-batch's sequences."""
    rows, sequences, _, _ = memory_plan.models_held(algo, args, vocab_size, 8)
    models_planned = [
        (head, trained, memory_plan.parameter_counts(config, head, common.LoraOptions())[0])
        for _, config, head, trained in rows
    ]
    return models_planned, sequences


@pytest.mark.parametrize("algo", ["reinforce_pp", "reinforce_pp_baseline", "rloo", "remax"])
def test_variants_plan_holds_and_samples_what_variants_py_does(tmp_path, monkeypatch, tokenizer, algo):
    """The online variants hold the policy and the reference, and train on k = 3 samples of each of 2 prompts
    (ReMax on one, its greedy one only scored): 6 sequences, or 2."""
    args = args_of(
        variants.Args,
        algo=algo,
        model="tiny",
        steps=1,
        batch_size=2,
        group_size=3,
        max_new_tokens=4,
        eval_size=2,
        output_dir=str(tmp_path / "runs"),
    )
    held, sequences = held_through_the_loop(monkeypatch, variants, (common, "completion_logprobs"), args)
    models_planned, planned_sequences = planned("variants", args, len(tokenizer))
    assert models_planned == held and len(held) == 2
    assert sequences == [planned_sequences] == [2 if algo == "remax" else 6]


def test_prm_plan_holds_and_trains_what_prm_py_does(tmp_path, monkeypatch, tokenizer, preference_cache):
    """prm.py trains one model with a score head on --batch-size solutions (its labelling policy is gone by then),
    and the planner plans it from the command line."""
    args = args_of(
        prm.Args,
        model="tiny",
        steps=1,
        batch_size=3,
        num_problems=4,
        eval_size=2,
        num_solutions=2,
        num_rollouts=2,
        max_new_tokens=8,
        output_dir=str(tmp_path / "runs"),
    )
    held, sequences = held_through_the_loop(monkeypatch, prm, (stepwise, "score_steps"), args)
    models_planned, planned_sequences = planned("prm", args, len(tokenizer))
    assert models_planned == held == [("score", True, held[0][2])]
    assert sequences == [planned_sequences] == [3]
    plan = memory_plan.main(["prm", "--model", "tiny", "--batch-size", "3"])["memory_plan"]
    assert [row["model"] for row in plan] == ["PRM"] and plan[0]["activations_gb"] > 0


def test_kv_cache_bytes_by_hand_and_against_a_real_cache():
    # the tiny Llama: 2 layers, 2 key/value heads of 16 dims; 3 sequences of 10 positions:
    # 2 (key, value) · 2 · 2 · 16 · 3 · 10 = 3,840 numbers, 15,360 bytes in float32, 7,680 in bfloat16
    model = models.make_tiny_model(100, "llama")
    assert memory_plan.kv_cache_bytes(model.config, 3, 10, "fp32") == 15_360
    assert memory_plan.kv_cache_bytes(model.config, 3, 10, "bf16-mixed") == 7_680
    # what transformers' cache holds after a forward of those 3 × 10 positions
    with torch.no_grad():
        cache = model(torch.zeros(3, 10, dtype=torch.long), use_cache=True).past_key_values
    held = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert held == 15_360
    # the sampling scripts' rows: grpo samples P·G at once, ppo its batch, an offline variant none
    assert memory_plan.sampled_rows("grpo", types.SimpleNamespace(prompts_per_step=16, group_size=8)) == 128
    assert memory_plan.sampled_rows("dpo", None) == 0
