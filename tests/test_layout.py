"""The layout a reader relies on: each file within its line budget, imports running one way, lines of at most
120 characters. Pure text and ast, no imports of the project: well under a second."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ALGORITHMS = ("grpo", "dpo", "ppo", "reward_model", "sft", "variants", "prm")
# A budget is a reader's time: a file a newcomer reads top to bottom in one go. When new code would break one,
# find its right room rather than raising the number.
BUDGETS = {"grpo": 480, "dpo": 360, "ppo": 520, "reward_model": 300, "sft": 260, "variants": 450, "prm": 350,
           "preferences": 200, "tasks": 450, "models": 250, "common": 450, "runs": 450, "kernels": 150,
           "distributed": 150, "fsdp": 100}
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


@pytest.mark.parametrize("name", sorted(BUDGETS))
def test_each_file_keeps_its_line_budget(name):
    lines = len((REPO / f"{name}.py").read_text().splitlines())
    assert lines <= BUDGETS[name], f"{name}.py has {lines} lines, its budget is {BUDGETS[name]}"


@pytest.mark.parametrize("name", sorted(MAY_IMPORT))
def test_imports_run_one_way(name):
    assert project_imports(name) <= MAY_IMPORT[name], f"{name}.py imports {project_imports(name) - MAY_IMPORT[name]}"


def test_lines_are_at_most_120_characters():
    files = [p for folder in ("", "tests", "scripts", "dev") for p in sorted((REPO / folder).glob("*.py"))]
    wide = [f"{p.relative_to(REPO)}:{i}" for p in files for i, line in enumerate(p.read_text().splitlines(), 1)
            if len(line) > 120]
    assert not wide, f"{len(wide)} lines over 120 characters, e.g. {wide[:5]}"
