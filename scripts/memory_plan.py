"""The memory plan: what each model of a training run will hold, from its config alone, before any weight loads.

    python scripts/memory_plan.py grpo                               # the defaults, on the embedded model
    python scripts/memory_plan.py ppo --reward-model runs/rm-.../model --lora-r 16
    python scripts/memory_plan.py grpo --model meta-llama/Llama-2-7b-hf --prompt-tokens 512 --precision bf16-true

The first word names the script (grpo, grpo_options, dpo, ppo, sft, reward_model, variants, prm); the rest are that
script's own options, parsed by its Args. Each row is one model the algorithm holds through its training loop (policy,
reference, reward models, critic, PRM): its weights and, for a trained model, its gradients, AdamW state and one
micro-batch's activations. prm.py's labelling policy (--policy) samples before the PRM loads and is freed first: it is
no row. --prompt-tokens sets the prompt length the plan assumes (default: the longest held-out prompt, arithmetic or,
for prm, the multi-step chains).
--ranks N plans one rank of `torchrun --nproc_per_node N script.py --fsdp`: each model's weights, gradients and AdamW
state are split over the N ranks (FSDP2 shards every parameter); the activations are one rank's micro-batch, as given.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import torch
import transformers
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import common  # noqa: E402
from infra import models  # noqa: E402
from infra import runs  # noqa: E402
from infra import shapes  # noqa: E402
from task import tasks  # noqa: E402


def model_config(name: str, vocab_size: int) -> transformers.PretrainedConfig:
    """The architecture of `name` without its weights: tiny, smollm2, a config file, a LoRA run's base, a local folder
    or a hub id."""
    if name in common.TINY_MODELS:
        return models.make_tiny_model(vocab_size, "gpt2" if name == "tiny-gpt2" else "llama").config
    if models.is_config_only(name):
        return shapes.config_of(name)
    if os.path.isfile(os.path.join(name, "adapter_config.json")):
        name = json.loads(Path(name, "adapter_config.json").read_text())["base_model_name_or_path"]
    path = models.model_path(name)
    if os.path.isfile(os.path.join(path, "config.json")):
        return transformers.AutoConfig.from_pretrained(path)
    return models.from_pretrained(transformers.AutoConfig, path)


def parameter_counts(
    config: transformers.PretrainedConfig, head: str, lora: common.LoraOptions
) -> tuple[int, int]:
    """(parameters, trainable parameters) of the model built on the meta device. With LoRA only the adapters,
    r·(in + out) for each targeted linear layer, and a score head train."""
    config = copy.deepcopy(config)
    config.num_labels = 1
    auto = (
        transformers.AutoModelForCausalLM if head == "lm" else transformers.AutoModelForSequenceClassification
    )
    with torch.device("meta"):
        model = auto.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    if not lora.lora_r:
        return total, total
    targets = None if lora.lora_targets == "all-linear" else set(lora.lora_targets.split(","))
    adapters = sum(
        lora.lora_r * sum(m.weight.shape)
        for n, m in model.named_modules()  # GPT-2's Conv1D holds (in, out)
        if isinstance(m, (torch.nn.Linear, transformers.pytorch_utils.Conv1D))
        and n.split(".")[-1] not in ("lm_head", "score")
        and (targets is None or n.split(".")[-1] in targets)
    )
    score = (
        sum(p.numel() for n, p in model.named_parameters() if n.startswith("score.")) if head != "lm" else 0
    )
    return total + adapters, adapters + score


def matmul_parameters(config: transformers.PretrainedConfig) -> tuple[int, int, bool]:
    """(parameters of the layers' linear maps, GPT-2's Conv1D among them; of the output layer; whether the output
    layer is tied to the embeddings), counted on the meta device."""
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    output = model.get_output_embeddings()
    tied = output.weight is model.get_input_embeddings().weight
    layers = sum(
        p.numel()
        for m in model.modules()
        if isinstance(m, (torch.nn.Linear, transformers.pytorch_utils.Conv1D)) and m is not output
        for p in m.parameters()
    )
    return layers, sum(p.numel() for p in output.parameters()), tied


def autocast_copies_bytes(config, head: str, precision: str, checkpointing: bool) -> int:
    """bf16-mixed: the bfloat16 copy autocast makes of each linear map's float32 weight, which the matmul saves for
    the backward (the gradient of its input needs it): 2 bytes a parameter of the layers' linear maps and of the
    output layer (a score head's is a few numbers), alive together at the end of the forward; with checkpointing,
    one layer's. None in fp32 or bf16-true, where the matmul saves the weight itself."""
    if precision != "bf16-mixed":
        return 0
    layers, output, _ = matmul_parameters(config)
    if checkpointing:
        layers = layers // config.num_hidden_layers
    return 2 * (layers + (output if head == "lm" else 0))


def activation_bytes(
    config,
    sequences: int,
    tokens: int,
    logit_tokens: int,
    precision: str,
    checkpointing: bool,
    kernels_on: bool = False,
) -> int:
    """What one micro-batch's forward keeps for the backward. A transformer layer keeps s·b·h·(34 + 5·a·s/h)
    bytes of 16-bit activations (Korthikanti et al. 2022, arXiv:2205.05198, eq. 1; float32 doubles it);
    with checkpointing, only each layer's input (2·s·b·h bytes) and one layer's full set. tokens = s·b.
    Plus the scored positions' logits, logit_tokens·V numbers a tensor, alive together in the backward:
    - with kernels.token_logprobs: two in the compute dtype (float32, or bfloat16 under autocast and bf16-true),
      the logits and their gradient;
    - plain token_logprobs: the same two, three float32 tensors of one piece (its work, a few sequences at a time:
      common.LOGPROB_PIECE), and with more than one piece a second gradient while autograd adds each piece's in.
    Measured with the CPU allocator's live bytes (tests/test_memory_plan.py, one piece) and on many pieces
    (tests/test_common.py).
    An estimate: eq. 1 is for a GPT layer (GeLU MLP of 4h, dropout masks, attention scores kept); fused
    attention (SDPA) keeps no s×s scores, and SwiGLU and grouped-query attention shift the constant."""
    h, layers = config.hidden_size, config.num_hidden_layers
    heads, s = config.num_attention_heads, tokens / sequences
    scale = 2 if precision == "fp32" else 1  # float32 activations, or bfloat16 under autocast / bf16-true
    per_layer = tokens * h * (34 + 5 * heads * s / h) * scale
    kept = (layers * 2 * tokens * h * scale + per_layer) if checkpointing else layers * per_layer
    logits = 2 * logit_tokens * config.vocab_size * 2 * scale
    if not kernels_on and logit_tokens:
        per_sequence = logit_tokens // sequences * config.vocab_size
        rows = min(sequences, max(1, common.LOGPROB_PIECE // per_sequence))  # sequences a piece
        logits += 3 * rows * per_sequence * 4
        if rows < sequences:
            logits += logit_tokens * config.vocab_size * 2 * scale
    return int(kept + logits)


def kv_cache_bytes(config, rows: int, tokens: int, precision: str) -> int:
    """The key/value cache sampling fills: a key and a value of every layer's key/value heads for each of `rows`
    sequences of `tokens` positions (prompt and completion), 2 · layers · kv_heads · head_dim · rows · tokens
    numbers, float32 in fp32, else bfloat16 (autocast's projections, or bf16-true's). Freed before the update: the
    peak is the larger of sampling (weights and cache) and training (the plan's rows)."""
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    width = 4 if precision == "fp32" else 2
    return 2 * config.num_hidden_layers * kv_heads * head_dim * rows * tokens * width


def sampled_rows(algo: str, args) -> int:
    """The sequences a training step samples at once (its key/value cache's rows), 0 for a script that samples
    none while it trains."""
    if algo in ("grpo", "grpo_options"):
        return args.prompts_per_step * args.group_size
    if algo == "ppo":
        return args.batch_size
    if algo == "variants" and args.algo not in ("ipo", "kto", "simpo", "orpo"):
        return args.batch_size * (1 if args.algo == "remax" else args.group_size)
    return 0


def memory_plan(
    held: list[tuple],
    precision: str,
    lora: common.LoraOptions,
    checkpointing: bool,
    sequences: int,
    tokens: int,
    logit_tokens: int,
    kernels_on: bool = False,
    ranks: int = 1,
) -> dict:
    """Print and return the plan: one row per model (name, config, head "lm" or "score", trained?) with its
    parameters and GiB of weights, and for a trained model its gradients, AdamW state (two moments in the
    weights' dtype) and one micro-batch's activations (`activation_bytes`; a score head has no vocabulary
    logits; under bf16-mixed, autocast's bf16 copies of the weights too: `autocast_copies_bytes`). Weights are
    float32 (the master copy under bf16-mixed) unless bf16-true; a bf16-mixed reference's linear maps are bf16.
    With `ranks` > 1 (--fsdp), one rank's: weights, gradients and AdamW state divided by the ranks, the
    activations whole.
    Returns {"memory_plan": rows, "total_gb": total}."""
    width = 2 if precision == "bf16-true" else 4
    rows = []
    for name, config, head, trained in held:
        # a frozen model has no adapter
        params, trainable = parameter_counts(config, head, lora if trained else common.LoraOptions())
        trainable = trainable if trained else 0
        activations = (
            activation_bytes(
                config,
                sequences,
                tokens,
                logit_tokens if head == "lm" else 0,
                precision,
                checkpointing,
                kernels_on,
            )
            + autocast_copies_bytes(config, head, precision, checkpointing)
            if trained
            else 0
        )
        weight_bytes = params * width
        # a bf16-mixed reference stores its linear layers in bf16 (infra/launches.py); not under --fsdp
        if name == "reference" and precision == "bf16-mixed" and ranks == 1:
            layers, output, tied = matmul_parameters(config)
            weight_bytes = weight_bytes - 2 * (layers + (0 if tied else output))
        rows.append(
            {
                "model": name,
                "parameters": params,
                "weights_gb": weight_bytes / ranks / 2**30,
                "gradients_gb": trainable * width / ranks / 2**30,
                "optimizer_gb": 2 * trainable * width / ranks / 2**30,
                "activations_gb": activations / 2**30,
            }
        )
    columns = ("weights_gb", "gradients_gb", "optimizer_gb", "activations_gb")
    total = sum(r[c] for r in rows for c in columns)
    print(
        f"memory plan: precision {precision}, LoRA r = {lora.lora_r or 'off'}, "
        f"gradient checkpointing {'on' if checkpointing else 'off'}, "
        f"one micro-batch = {sequences} sequences, {tokens} token positions"
        + (
            f"; one of {ranks} ranks (--fsdp): weights, gradients and AdamW state / {ranks}"
            if ranks > 1
            else ""
        )
    )
    print(
        f"{'model':<16}{'parameters':>15}{'weights':>10}{'gradients':>11}{'AdamW state':>13}{'activations':>13}   (GiB)"
    )
    for r in rows:
        print(
            f"{r['model']:<16}{r['parameters']:>15,}"
            + "".join(f"{r[c]:>{w}.2f}" for c, w in zip(columns, (10, 11, 13, 13)))
        )
    print(
        f"{'total':<16}{total:>62.2f}\n(these are the tensors alive at the peak. The process adds its own: "
        "on CPU about 0.25 GiB for Python, torch and transformers, and up to 2 GiB of freed memory that glibc keeps "
        "(MALLOC_MMAP_THRESHOLD_=65536 returns it, at some speed); on CUDA the context and the caching allocator's "
        "reserve)"
    )
    return {"memory_plan": rows, "total_gb": total}


def offline_tokens(args) -> int:
    """The completion length bound of offline data: a --dataset's completions are cut at --max-completion-tokens,
    the model's own samples end within --max-new-tokens and an EOS."""
    return (
        args.max_completion_tokens
        if args.dataset
        else min(args.max_completion_tokens, args.max_new_tokens + 1)
    )


def models_held(algo: str, args, vocab_size: int, prompt_tokens: int) -> tuple[list[tuple], int, int, int]:
    """(rows of (name, config, head, trained?), sequences, token positions, scored positions) of one micro-batch,
    as `algo` holds them. With LoRA the reference is the policy with its adapter off: no second copy."""
    config, S, lora = model_config(args.model, vocab_size), prompt_tokens, args.lora.lora_r
    policy, reference = ("policy", config, "lm", True), ("reference", config, "lm", False)
    if algo in (
        "grpo",
        "grpo_options",
    ):  # one micro-batch shares each prompt's forward among its G completions
        batch = args.prompts_per_step * args.group_size
        micro = min(args.batch_size or batch, batch)
        T = args.max_new_tokens
        rows = [policy] + [reference] * (args.beta != 0 and not lora)
        # grpo.py's one reward model, or the catalogue's several: an ensemble, each model held
        paths = (args.reward_model,) if isinstance(args.reward_model, str) else args.reward_model or ()
        for i, path in enumerate(paths):
            name = f"reward model {i + 1}" if len(paths) > 1 else "reward model"
            rows.append((name, model_config(path, vocab_size), "score", False))
        return rows, micro, -(-micro // args.group_size) * S + micro * T, micro * T
    if algo == "dpo":  # chosen and rejected in one forward
        B, T = 2 * args.batch_size, offline_tokens(args)
        return [policy] + [reference] * (not args.precompute_ref_logprobs and not lora), B, B * (S + T), B * T
    if algo == "ppo":  # the policy and the critic train on the same minibatch
        m, T = args.minibatch_size, args.max_new_tokens
        rm_configs = (
            [model_config(p, vocab_size) for p in (args.reward_model, *args.ensemble)]
            if args.reward_model
            else []
        )
        critic = rm_configs[0] if rm_configs and args.critic_init != "policy" else config
        names = [
            f"reward model {i + 1}" if len(rm_configs) > 1 else "reward model" for i in range(len(rm_configs))
        ]
        rows = [
            policy,
            *[reference] * (not lora),
            *[(n, c, "score", False) for n, c in zip(names, rm_configs)],
            ("critic", critic, "score", True),
        ]
        return rows, m, m * (S + T), m * T
    if algo == "sft":  # completions at their length bound
        B = args.batch_size
        T = (
            args.max_completion_tokens
            if args.dataset
            else min(args.max_completion_tokens, args.max_new_tokens)
        )
        return [policy], B, B * (S + T), B * T
    if algo == "reward_model":  # chosen and rejected in one forward, a score head: no vocabulary logits
        B = 2 * args.batch_size
        return [("reward model", config, "score", True)], B, B * (S + offline_tokens(args)), 0
    if algo == "prm":  # every token of B solutions through the backbone, a score head: no vocabulary logits
        B = args.batch_size
        return [("PRM", config, "score", True)], B, B * (S + args.max_new_tokens), 0
    # variants: offline a pair's two completions; online k samples a prompt (ReMax one, and a greedy one not scored)
    offline = args.algo in ("ipo", "kto", "simpo", "orpo")
    per_prompt = 2 if offline else (1 if args.algo == "remax" else args.group_size)
    B, T = args.batch_size * per_prompt, offline_tokens(args) if offline else args.max_new_tokens
    # SimPO, ORPO: no reference
    rows = [policy] + [reference] * (args.algo not in ("simpo", "orpo") and not lora)
    return rows, B, args.batch_size * S * (per_prompt if offline else 1) + B * T, B * T


def main(argv: list[str]) -> dict:
    scripts = ("grpo", "grpo_options", "dpo", "ppo", "sft", "reward_model", "variants", "prm")
    runs.require(
        bool(argv) and argv[0] in scripts, f"usage: scripts/memory_plan.py {{{','.join(scripts)}}} [options]"
    )
    algo, rest = argv[0], argv[1:]
    numbers = {"--prompt-tokens": None, "--ranks": 1}  # this script's own options, the rest the script's
    for flag in numbers:
        if flag in rest:
            i = rest.index(flag)
            runs.require(
                i + 1 < len(rest) and rest[i + 1].isdigit() and int(rest[i + 1]) >= 1,
                f"{flag} needs a whole number >= 1",
            )
            numbers[flag], rest = int(rest[i + 1]), rest[:i] + rest[i + 2 :]
    prompt_tokens, ranks = numbers["--prompt-tokens"], numbers["--ranks"]
    module = __import__(algo)
    args = tyro.cli(module.Args, args=rest, prog=f"scripts/memory_plan.py {algo}")
    device = models.resolve_device(args.run.device)
    precision = models.resolve_precision(args.run.precision, device, args.model)
    tokenizer = models.load_tokenizer(args.model, args.run.prompt_format)
    eval_size = getattr(args, "eval_size", None) or tasks.DEFAULT_EVAL_SIZE
    family = tasks.make_multistep_problem if algo == "prm" else tasks.make_problem
    S = prompt_tokens or tasks.longest_prompt(tokenizer, tasks.heldout_problems(eval_size, make=family))
    rows, sequences, tokens, logit_tokens = models_held(algo, args, len(tokenizer), S)
    checkpointing = getattr(args, "gradient_checkpointing", False)  # prm.py has no such option
    plan = memory_plan(
        rows,
        precision,
        args.lora,
        checkpointing,
        sequences,
        tokens,
        logit_tokens,
        models.resolve_kernels(args.run.kernels, device),
        ranks,
    )
    sampled = sampled_rows(algo, args)
    if sampled:
        cache = kv_cache_bytes(rows[0][1], sampled, S + args.max_new_tokens, precision) / 2**30
        shape = f"{sampled} sequences × {S + args.max_new_tokens} positions"
        print(f"sampling: a key/value cache of {cache:.2f} GiB ({shape}), freed before the update")
        plan["kv_cache_gb"] = cache
    return plan


def loaded_table(held: dict[str, torch.nn.Module], trainable: set[str]) -> list[dict]:
    """Parameters and bytes of weights, and of gradients and AdamW state (two fp32 moments) of the trained
    parameters (with LoRA: the adapters and heads only), for each model."""
    rows = []
    for name, model in held.items():
        params = sum(p.numel() for p in model.parameters())
        trained = [p for p in model.parameters() if p.requires_grad] if name in trainable else []
        rows.append(
            {
                "model": name,
                "parameters": params,
                "weights_gb": sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30,
                "gradients_gb": sum(p.numel() * p.element_size() for p in trained) / 2**30,
                # two moments in the weights' dtype
                "optimizer_gb": 2 * sum(p.numel() * p.element_size() for p in trained) / 2**30,
            }
        )
    return rows


if __name__ == "__main__":
    runs.run_main(main, sys.argv[1:])
