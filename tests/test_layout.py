"""The layout a reader relies on: each file within its budget of code tokens, imports running one way, lines of at
most 120 characters. Pure text, tokenize and ast, no imports of the project; one subprocess imports common.py alone."""

import ast
import io
import os
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ALGORITHMS = ("grpo", "dpo", "ppo", "reward_model", "sft", "variants", "prm", "rft")
# A budget is a reader's time: a file a newcomer reads top to bottom in one go. It counts code tokens (names,
# operators, numbers and strings outside docstrings and comments), so joining or widening lines gains nothing:
# let the code breathe. When new code would break one, find its right room rather than raising the number.
BUDGETS = {
    "grpo": 4065,
    "dpo": 2650,
    "ppo": 4200,
    "reward_model": 2130,
    "sft": 1690,
    "variants": 3550,
    "prm": 2490,
    "rft": 2000,
    "task/preferences": 1350,
    "task/tasks": 3870,
    "offpolicy": 492,
    "infra/models": 1980,
    "common": 3050,
    "infra/runs": 4175,
    "infra/kernels": 1160,
    "infra/distributed": 950,
    "infra/fsdp": 570,  # its torch imports inside the functions that shard: a second off every start
    "infra/hub": 520,
    "task/stepwise": 1245,
}
# Imports run one way, down these layers: a module imports only from layers below its own. common.py is the leaf
# (the mechanics: it imports nothing of the project, but for infra/kernels inside the kernels' two seams); the
# plumbing in infra/ sits on it, the task and its preference data on that, the algorithm files on top.
LAYERS = [
    ["common"],
    ["infra/fsdp", "infra/kernels", "infra/distributed", "infra/hub"],
    ["infra/runs"],
    ["infra/models"],
    ["task/tasks", "offpolicy"],
    ["task/preferences", "task/stepwise"],
    list(ALGORITHMS),
]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def project_imports(name: str, top_level_only: bool = True) -> set[str]:
    """The project modules `name` imports, as "common", "infra/runs", ...: at the top level, or anywhere."""
    tree = ast.parse((REPO / f"{name}.py").read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name.replace(".", "/") for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module in ("infra", "task"):
            found |= {f"{node.module}/{alias.name}" for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module.replace(".", "/"))
    return found & set(LAYER)


def longest_chain(name: str) -> list[str]:
    """The longest path of top-level imports from `name` down, `name` included."""
    below = [longest_chain(other) for other in project_imports(name)]
    return [name, *max(below, key=len, default=[])]


def code_tokens(text: str) -> int:
    """Python's tokens that are code: names, operators, numbers and strings, less every docstring (a string that
    is a statement of its own: a module's, a function's, a dataclass field's). Comments and line breaks are free."""
    docstrings = set()
    for node in ast.walk(ast.parse(text)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            docstrings.add((node.lineno, node.col_offset))
    counted = {tokenize.NAME, tokenize.OP, tokenize.NUMBER, tokenize.STRING}
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return sum(
        1 for t in tokens if t.type in counted and not (t.type == tokenize.STRING and t.start in docstrings)
    )


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


@pytest.mark.parametrize("name", sorted(LAYER))
def test_imports_run_one_way(name):
    upward = {other for other in project_imports(name) if LAYER[other] >= LAYER[name]}
    assert not upward, f"{name}.py imports {upward}, which are not below it"


def test_common_is_a_leaf_that_imports_alone(tmp_path):
    assert project_imports("common") == set()
    assert project_imports("common", top_level_only=False) == {"infra/kernels"}  # inside the seams only
    shutil.copy(REPO / "common.py", tmp_path / "common.py")
    proc = subprocess.run(
        [sys.executable, "-c", "import common"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert proc.returncode == 0, proc.stderr


def test_the_longest_import_chain_is_at_most_five_files():
    chains = [longest_chain(name) for name in ALGORITHMS]
    longest = max(chains, key=len)
    assert len(longest) <= 5, " -> ".join(longest)


def test_the_top_level_holds_the_algorithms_common_the_task_and_the_off_policy_math():
    modules = {p.stem for p in REPO.glob("*.py")}
    assert modules - set(ALGORITHMS) == {"common", "offpolicy"}


def test_lines_are_at_most_120_characters():
    files = [
        p
        for folder in ("", "infra", "task", "tests", "scripts", "dev")
        for p in sorted((REPO / folder).glob("*.py"))
    ]
    wide = [
        f"{p.relative_to(REPO)}:{i}"
        for p in files
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if len(line) > 120
    ]
    assert not wide, f"{len(wide)} lines over 120 characters, e.g. {wide[:5]}"


# What a formatter keeps and a reader should not meet: a statement that is a tuple of calls, a backslash
# continuation, a comment left trailing the bracket that closes a split statement (it goes above), and in the
# algorithm files a conditional dict splat (an `if` says it better).
def joins(text: str, algorithm: bool) -> list[str]:
    """Each join in `text` as "line: kind"."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Tuple):
            found.append(f"{node.lineno}: a tuple of calls as a statement")
        conditional_splat = isinstance(node, ast.Dict) and any(
            key is None and isinstance(value, ast.IfExp) for key, value in zip(node.keys, node.values)
        )
        if algorithm and conditional_splat:
            found.append(f"{node.lineno}: a conditional dict splat")
    inside_strings = set()  # lines a multi-line string continues past
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.STRING:
            inside_strings |= set(range(token.start[0], token.end[0]))
    for i, line in enumerate(text.splitlines(), 1):
        if line.endswith("\\") and i not in inside_strings:
            found.append(f"{i}: a backslash continuation")
    for i, line in enumerate(text.splitlines(), 1):
        if re.match(r"^\s*[)\]}][^#\"']*\s#", line):
            found.append(f"{i}: a comment trailing a closing bracket")
    return found


def test_joins_by_hand():
    text = 'a(), b()\nx = {**({"k": 1} if c else {})}\ny = 1 + \\\n    2\nz = f(\n    1\n)  # why\n'
    assert joins(text, algorithm=True) == [
        "1: a tuple of calls as a statement",
        "2: a conditional dict splat",
        "3: a backslash continuation",
        "7: a comment trailing a closing bracket",
    ]
    assert joins("a = 1  # why\nb, c = d()\n", algorithm=True) == []


@pytest.mark.parametrize("name", sorted(LAYER))
def test_no_joins_the_formatter_keeps(name):
    found = joins((REPO / f"{name}.py").read_text(), algorithm=name in ALGORITHMS)
    assert not found, f"{name}.py: {found}"


def test_the_readme_is_a_first_page():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move a section to docs/"
