"""The layout a reader relies on: each file within its budget of code tokens, imports running one way, lines of at
most 120 characters. Pure text, tokenize and ast, no imports of the project: well under a second."""

import ast
import io
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ALGORITHMS = ("grpo", "dpo", "ppo", "reward_model", "sft", "variants", "prm")
# A budget is a reader's time: a file a newcomer reads top to bottom in one go. It counts code tokens (names,
# operators, numbers and strings outside docstrings and comments), so joining or widening lines gains nothing:
# let the code breathe. When new code would break one, find its right room rather than raising the number.
BUDGETS = {"grpo": 3560, "dpo": 2470, "ppo": 4120, "reward_model": 2110, "sft": 1680, "variants": 3400,
           "prm": 3050, "preferences": 1340, "tasks": 3370, "models": 1550, "common": 3330, "runs": 3970,
           "kernels": 1160, "distributed": 930, "fsdp": 570}
# Imports run one way: scripts and dev -> algorithm files -> preferences -> tasks -> models -> common -> runs
# -> distributed; kernels from common only.
BELOW = {"preferences": {"tasks", "models", "common", "runs", "distributed"},
         "tasks": {"common", "runs", "distributed"}, "models": {"common", "runs"},
         "common": {"runs", "kernels", "distributed", "fsdp"}, "runs": {"distributed", "fsdp"}, "kernels": set(),
         "distributed": {"fsdp"}, "fsdp": set()}
MAY_IMPORT = {**{name: {"preferences", "tasks", "models", "common", "runs", "distributed", "fsdp"}
                 for name in ALGORITHMS},
              **BELOW}
PROJECT = set(MAY_IMPORT)


def project_imports(name: str) -> set[str]:
    tree = ast.parse((REPO / f"{name}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module.split(".")[0])
    return found & PROJECT


def code_tokens(text: str) -> int:
    """Python's tokens that are code: names, operators, numbers and strings, less every docstring (a string that
    is a statement of its own: a module's, a function's, a dataclass field's). Comments and line breaks are free."""
    docstrings = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            docstrings.add((node.lineno, node.col_offset))
    counted = {tokenize.NAME, tokenize.OP, tokenize.NUMBER, tokenize.STRING}
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return sum(1 for t in tokens if t.type in counted and not (t.type == tokenize.STRING and t.start in docstrings))


def test_code_tokens_by_hand():
    text = '''"""A module docstring."""
x = f(a, "s")  # a comment is free


def g():
    """A docstring."""
    return (
        x
    )
'''
    # x = f ( a , "s" ) : 8; def g ( ) : : 5; return ( x ) : 4
    assert code_tokens(text) == 17
    assert code_tokens(text.replace("(\n        x\n    )", "(x)")) == 17  # joining lines gains nothing


@pytest.mark.parametrize("name", sorted(BUDGETS))
def test_each_file_keeps_its_budget_of_code_tokens(name):
    tokens = code_tokens((REPO / f"{name}.py").read_text())
    assert tokens <= BUDGETS[name], f"{name}.py has {tokens} code tokens, its budget is {BUDGETS[name]}"


@pytest.mark.parametrize("name", sorted(MAY_IMPORT))
def test_imports_run_one_way(name):
    assert project_imports(name) <= MAY_IMPORT[name], f"{name}.py imports {project_imports(name) - MAY_IMPORT[name]}"


def test_lines_are_at_most_120_characters():
    files = [p for folder in ("", "tests", "scripts", "dev") for p in sorted((REPO / folder).glob("*.py"))]
    wide = [f"{p.relative_to(REPO)}:{i}" for p in files for i, line in enumerate(p.read_text().splitlines(), 1)
            if len(line) > 120]
    assert not wide, f"{len(wide)} lines over 120 characters, e.g. {wide[:5]}"
