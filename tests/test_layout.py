"""The layout a reader relies on: each file within its budget of code tokens, imports running one way, lines of at
most 120 characters. Pure text, tokenize and ast, no imports of the project; one subprocess imports common.py alone."""

import ast
import difflib
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
ALGORITHMS = ("grpo", "dpo", "ppo", "reward_model", "sft", "variants", "prm", "rft", "distill")
# A variant is a study beside its reference (as CleanRL keeps ppo_atari.py beside ppo.py): it imports the
# reference's pure functions and copies the loop it changes. It imports no algorithm file but its reference.
VARIANTS = {
    "grpo_options": "grpo",
    "grpo_async": "grpo",
    "grpo_prm": "grpo",
    "grpo_adaptive": "grpo",
    "grpo_tools": "grpo",
    "ppo_overoptimisation": "ppo",
    "ppo_prm": "ppo",
    "dpo_online": "dpo",
}
# Caps, not ratchets. A budget is a reader's time: a file a newcomer reads top to bottom in one go. It counts code
# tokens (names, operators, numbers and strings outside docstrings and comments), so joining or widening lines
# gains nothing: let the code breathe. Each cap is its file's size when the caps were last set, rounded up to the
# next 50: the allowance for upkeep (a fix, a clearer name), not for growth. A cap is raised only by an issue;
# new code that would break one goes to the room it belongs in (another module, a variant file), and a module
# that would overflow is split by concern into a new file, which gets its cap here when it is created.
# `python -m pytest tests/test_layout.py -v` shows each file's count beside its cap.
BUDGETS = {
    # the references: their algorithm and the options its paper family defines
    # grpo.py holds GRPO's paper family (DeepSeekMath, DAPO, Dr. GRPO, R1's weighted rewards); a later paper's
    # option goes to its catalogue, grpo_options.py, and this cap is never raised for one
    "grpo": 3000,
    "ppo": 3800,
    "dpo": 2100,
    "reward_model": 2150,
    "sft": 1700,
    "variants": 3450,
    "prm": 2500,
    "rft": 2000,
    "distill": 1800,
    # the catalogue of the later papers' GRPO options, and the variants
    "grpo_options": 3900,
    "grpo_async": 2350,
    "grpo_prm": 1750,
    "grpo_adaptive": 2550,
    "grpo_tools": 2650,
    "ppo_overoptimisation": 2750,
    "ppo_prm": 2150,
    "dpo_online": 1300,
    # what is learned
    "task/preferences": 1350,
    "task/tasks": 3800,
    "task/rewards": 200,
    "task/tools": 400,
    "task/stepwise": 1250,
    # the mechanics and the plumbing
    "common": 3050,
    "infra/models": 2000,
    "infra/runs": 3750,
    # PPO's minibatch means and step stats (from ppo.py) and GRPO's clip fractions (from grpo.py) came here
    "infra/stepmetrics": 1000,
    # a batch's reward metrics and a step's speeds came here from task/batch_rewards.py and grpo.py
    "infra/metrics": 1400,
    "infra/tiny": 300,
    "infra/shapes": 250,
    "infra/launches": 100,
    "infra/decoding": 1150,
    "infra/kernels": 1200,
    "infra/distributed": 950,
    "infra/fsdp": 600,
    "infra/hub": 550,
}
# The lines of each reference's main(): one loop, its phases in order. grpo.py's holds no nested function.
MAIN_LINES = {"grpo": 200, "ppo": 220, "dpo": 180}
# Imports run one way, down these layers: a module imports only from layers below its own. common.py is the leaf
# (the mechanics: it imports nothing of the project, but for infra/kernels inside the kernels' two seams); the
# plumbing in infra/ sits on it, the task and its preference data on that, the algorithm files on top, and each
# variant on its reference.
LAYERS = [
    ["common"],
    [
        "infra/fsdp",
        "infra/kernels",
        "infra/distributed",
        "infra/hub",
        "infra/metrics",
        "infra/tiny",
        "infra/shapes",
        "infra/launches",
        "infra/decoding",
    ],
    ["infra/runs"],
    ["infra/stepmetrics", "infra/models"],
    ["task/rewards"],
    ["task/tasks"],
    ["task/preferences", "task/stepwise", "task/tools"],
    list(ALGORITHMS),
    list(VARIANTS),
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


def tokens_of(name: str) -> int:
    return code_tokens((REPO / f"{name}.py").read_text())


def main_of(name: str) -> ast.FunctionDef:
    tree = ast.parse((REPO / f"{name}.py").read_text())
    return next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main")


@pytest.mark.parametrize(
    "name", sorted(BUDGETS), ids=[f"{n}: {tokens_of(n)} of {BUDGETS[n]}" for n in sorted(BUDGETS)]
)
def test_each_file_keeps_within_its_cap_of_code_tokens(name):
    tokens = tokens_of(name)
    print(f"{name}.py: {tokens} code tokens, cap {BUDGETS[name]}, room {BUDGETS[name] - tokens}")
    assert tokens <= BUDGETS[name], f"{name}.py has {tokens} code tokens, its cap is {BUDGETS[name]}"


def main_lines(name: str) -> int:
    main = main_of(name)
    return main.end_lineno - main.lineno + 1


@pytest.mark.parametrize(
    "name", sorted(MAIN_LINES), ids=[f"{n}: {main_lines(n)} of {MAIN_LINES[n]}" for n in sorted(MAIN_LINES)]
)
def test_each_reference_main_keeps_within_its_cap_of_lines(name):
    lines = main_lines(name)
    print(f"{name}.py main(): {lines} lines, cap {MAIN_LINES[name]}, room {MAIN_LINES[name] - lines}")
    assert lines <= MAIN_LINES[name], f"{name}.py's main() has {lines} lines, its cap is {MAIN_LINES[name]}"


def test_grpo_main_is_one_loop_with_no_nested_function():
    main = main_of("grpo")
    nested = [node.name for node in ast.walk(main) if isinstance(node, ast.FunctionDef) and node is not main]
    loops = [node for node in main.body if isinstance(node, ast.For)]
    assert not nested, f"grpo.py's main() defines {nested}: a function of its own goes to the module level"
    assert len(loops) == 1, "grpo.py's main() is one loop over the steps"
    phases = re.findall(r"# ---- (\d)\.", ast.get_source_segment((REPO / "grpo.py").read_text(), loops[0]))
    assert phases == [str(i) for i in range(1, 8)], f"the loop's phases run {phases}, not 1 to 7 in order"


def main_phases(name: str, reference: str) -> dict[str, list[str]]:
    """main()'s numbered phases (`# ---- N. title`) as lines of code tokens, comments and indentation left out and the
    reference's module prefix dropped (`grpo.group_logprobs` in a variant is grpo.py's `group_logprobs`)."""
    text = (REPO / f"{name}.py").read_text()
    main = main_of(name)
    phases = {}
    current = None
    for line in text.splitlines()[main.lineno - 1 : main.end_lineno]:
        heading = re.match(r"\s*# ---- (\d+)\.", line)
        if heading:
            current = phases.setdefault(heading.group(1), [])
        elif current is not None:
            current.append(line.strip())
    counted = {tokenize.NAME, tokenize.OP, tokenize.NUMBER, tokenize.STRING}
    for number, lines in phases.items():
        tokens = tokenize.generate_tokens(io.StringIO("\n".join(lines)).readline)
        by_line = {}
        for t in tokens:
            if t.type in counted:
                by_line.setdefault(t.start[0], []).append(t.string)
        phases[number] = [" ".join(words).replace(f"{reference} . ", "") for words in by_line.values()]
    return phases


def copied_phases(variant: str) -> list[str]:
    """The phases a variant's docstring says it copies unchanged: `Copied from grpo.py unchanged: phases 1, 4 and 7.`"""
    docstring = " ".join(ast.get_docstring(ast.parse((REPO / f"{variant}.py").read_text())).split())
    said = re.search(
        rf"Copied from {VARIANTS[variant]}\.py unchanged: (no phase|phases? ([\d, and]+))", docstring
    )
    assert said, (
        f"{variant}.py's docstring does not say which phases of {VARIANTS[variant]}.py it copies unchanged"
    )
    return re.findall(r"\d+", said.group(2) or "")


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_variant_copies_the_phases_it_names_unchanged(variant):
    """A variant copies its reference's loop (CleanRL's way); the phases its docstring names as copied unchanged must
    stay the reference's, token for token, when the reference changes."""
    reference = VARIANTS[variant]
    ours = main_phases(variant, reference)
    theirs = main_phases(reference, reference)
    for number in copied_phases(variant):
        difference = "\n".join(
            difflib.unified_diff(theirs[number], ours[number], reference, variant, lineterm="")
        )
        assert not difference, f"{variant}.py's phase {number} is no longer {reference}.py's:\n{difference}"


def test_a_variant_imports_no_algorithm_but_its_reference():
    for variant, reference in VARIANTS.items():
        algorithms = project_imports(variant) & (set(ALGORITHMS) | set(VARIANTS))
        assert algorithms == {reference}, f"{variant}.py imports {algorithms}, not {reference} alone"


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
    chains = [longest_chain(name) for name in ALGORITHMS]  # a variant adds its reference on top
    longest = max(chains, key=len)
    assert len(longest) <= 5, " -> ".join(longest)


def test_the_top_level_holds_the_algorithms_their_variants_and_common():
    modules = {p.stem for p in REPO.glob("*.py")}
    assert modules - set(ALGORITHMS) - set(VARIANTS) == {"common"}


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


def prose_lines(text: str) -> list[str]:
    """The lines of a Markdown text outside code blocks and tables."""
    prose = []
    in_code = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and not line.startswith("|"):
            prose.append(line)
    return prose


def test_prose_lines_by_hand():
    text = "a\n```\ncode\n```\n| t | r |\nb\n"
    assert prose_lines(text) == ["a", "b"]


def test_the_readme_is_a_first_page():
    text = (REPO / "README.md").read_text()
    lines = text.splitlines()
    words = len(text.split())
    wide = [line[:40] for line in prose_lines(text) if len(line) > 120]
    print(f"README.md: {len(lines)} lines of 200, {words} words of 1,800")
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move a section to docs/"
    assert words <= 1800, (
        f"README.md has {words} words (tables and code included): move findings to docs/results.md"
    )
    assert not wide, f"README.md has {len(wide)} prose lines over 120 characters, e.g. {wide[:3]}"


# ---- the formula tests: every pure function of the algorithm files checked by hand, in seconds ----------------------
# A function that takes a model, a tokenizer, the run's Args or a path is not pure: it loads, samples or writes.
NOT_PURE = {
    "args",
    "model",
    "policy",
    "critic",
    "reward_model",
    "ref_model",
    "tokenizer",
    "run_dir",
    "dataset",
    "path",
}


def pure_functions() -> list[str]:
    """ "file.function" for each module-level function of an algorithm file or a variant that takes only tensors and
    numbers: not main, not a check_*, none of NOT_PURE among its arguments."""
    found = []
    for name in (*ALGORITHMS, *VARIANTS):
        for node in ast.parse((REPO / f"{name}.py").read_text()).body:
            arguments = (
                {a.arg for a in [*node.args.args, *node.args.kwonlyargs]} if is_function(node) else set()
            )
            if is_function(node) and node.name != "main" and not node.name.startswith("check_"):
                found += [] if arguments & NOT_PURE else [f"{name}.{node.name}"]
    return found


def is_function(node) -> bool:
    return isinstance(node, ast.FunctionDef)


def formula_test_sources() -> str:
    """The source of every test `pytest -m formula` selects, with the same file's helpers each one calls."""
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "formula", "--collect-only", "-q"],
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout
    tests = {}
    for node_id in (line for line in listed.splitlines() if "::" in line):
        path, test = node_id.split("::")[:2]
        tests.setdefault(path, set()).add(test.split("[")[0])
    sources = []
    for path, names in tests.items():
        text = (REPO / path).read_text()
        functions = {n.name: ast.get_source_segment(text, n) for n in ast.parse(text).body if is_function(n)}
        for name in names:
            called = set(re.findall(r"\b(\w+)\(", functions[name]))
            sources += [
                functions[name],
                *(functions[h] for h in called & set(functions) if not h.startswith("test_")),
            ]
    return "\n".join(sources)


def test_every_pure_function_is_called_by_a_formula_test():
    sources = formula_test_sources()
    functions = pure_functions()
    unchecked = [f for f in functions if not re.search(rf"\b{f.split('.')[1]}\(", sources)]
    print(f"{len(functions)} pure functions, each called by a test of `pytest -m formula`")
    assert len(functions) > 30 and "ppo.compute_gae" in functions and "grpo.grpo_loss" in functions
    assert not unchecked, f"no formula test (pytest -m formula) calls {unchecked}: add one, by hand"


def heading_anchor(title: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (letters of any script kept), spaces -> -."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def test_heading_anchor_by_hand():
    assert heading_anchor("pass@8 and unearned rewards") == "pass8-and-unearned-rewards"
    assert heading_anchor("The β trade-off") == "the-β-trade-off"
    assert heading_anchor("PPO's clip range ε") == "ppos-clip-range-ε"


def test_the_results_page_lists_every_section_in_its_contents():
    text = (REPO / "docs" / "results.md").read_text()
    headings = re.findall(r"^##+ (.+)$", text, flags=re.M)
    links = dict(re.findall(r"^ *- \[(.+)\]\(#(.+)\)$", text, flags=re.M))
    missing = [h for h in headings if h != "Contents" and links.get(h) != heading_anchor(h)]
    assert not missing, f"docs/results.md's contents lacks (or links wrongly) {missing}"


def test_grpo_copied_alone_runs_with_at_most_15_project_files(tmp_path):
    # What grpo.py's top-level imports reach, and theirs in turn; a module imported inside a function
    # (infra/hub.py, infra/shapes.py, ...) stays behind, so the run below shows the default path never enters it.
    needed = set()
    todo = ["grpo.py"]
    while todo:
        path = todo.pop()
        if path in needed:
            continue
        needed.add(path)
        for node in ast.parse((REPO / path).read_text()).body:
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            else:
                continue
            files = [module.replace(".", "/") + ".py" for module in modules]
            todo += [file for file in files if (REPO / file).is_file()]
    # regular packages, so that nothing outside the copy can stand in for a missing module
    needed |= {path for path in ("infra/__init__.py", "task/__init__.py") if (REPO / path).is_file()}
    for path in needed:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / path, tmp_path / path)
    argv = ["--model", "tiny", "--steps", "2", "--eval-size", "4", "--eval-every", "0"]
    proc = subprocess.run(
        [sys.executable, "grpo.py", *argv, "--output-dir", str(tmp_path / "runs")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "data/general.txt not found: skipping the general-text NLL" in proc.stdout
    assert len(needed) <= 15, sorted(needed)


# ---- infra/ changes no number a loss uses --------------------------------------------------------------------------
# The calls into infra/ whose results an algorithm may carry to its loss, each for a reason that leaves the loss's
# numbers as the algorithm file computes them. Any other infra call whose result reaches a loss (an argument of a
# `*_loss` or `*advantages` call, a `.backward()`, or what a `*_loss` function returns) is a number computed in the
# plumbing: it belongs in the algorithm file or in common.py.
CARRIED_FROM_INFRA = {
    "models.resolve_run": "the device and precision chosen",
    "models.resolve_device": "the device chosen",
    "models.resolve_precision": "the precision chosen",
    "models.resolve_kernels": "whether the optional CPU kernels run: speed code equal to the plain path",
    "models.load_tokenizer": "set-up: a name in, a tokenizer out",
    "models.load_policy": "set-up: the policy and the reference, as loaded",
    "models.load_model": "set-up: a model, as loaded",
    "models.load_reward_model": "set-up: a reward model, as loaded",
    "models.load_critic": "set-up: the critic, as loaded",
    "runs.load_trainer_state": "a resumed run's state, as saved",
    "runs.Run": "the run folder: where a resumed run's data starts",
    "distributed.share": "a rank's share of the prompts: all of them in one process",
    "distributed.all_sum": "the sum over the ranks: the number itself in one process",
    "distributed.rank": "the seed's offset: 0 in one process",
    "distributed.world_size": "1 in one process",
    "distributed.share_of": "a rank's part of the batch: 1 in one process",
    "distributed.concat": "every rank's rows: this rank's own in one process",
    "distributed.mean_over_ranks": "the mean over the ranks: the number itself in one process",
    # ppo.py keeps PPO-Penalty's d (its own updated_kl) in the dict of the minibatches' logged means, which this check
    # follows as one value; the catalogue's entropy control reads the batch's mean entropy as logged, a token mean
    # that is exact (the number a loop gets by summing by hand: tests/test_grpo.py checks the micro-batches' sums)
    "stepmetrics.MinibatchMeans": "the minibatches' logged means, a dict that also carries ppo.py's d",
    "stepmetrics.MicroBatchSums": "a metric's token mean over the micro-batches, as logged",
}


def infra_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """The names a module binds to infra: its `from infra import x` modules, and its `from infra.x import f` names."""
    modules, functions = set(), set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "infra":
            modules |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("infra."):
            functions |= {alias.asname or alias.name for alias in node.names}
    return modules, functions


def roots(node) -> set[str]:
    """The plain names an expression reads (`sums.totals()["entropy"]` reads `sums`), less those its comprehensions
    bind (`[f(m) for m in models]` reads `f` and `models`)."""
    if node is None:
        return set()
    bound = {
        n.id
        for c in ast.walk(node)
        if isinstance(c, ast.comprehension)
        for n in ast.walk(c.target)
        if isinstance(n, ast.Name)
    }
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} - bound


def target_roots(target) -> set[str]:
    """The names an assignment binds or changes (`adaptive["c"] = ...` changes `adaptive`)."""
    names = set()
    for n in ast.walk(target):
        if isinstance(n, ast.Name):
            names.add(n.id)
    return names


def plumbing_calls(node, modules: set[str], functions: set[str]) -> list[str]:
    """The infra calls in an expression that CARRIED_FROM_INFRA does not allow, as "module.function"."""
    found = []
    for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
        f = call.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in modules:
            name = f"{f.value.id}.{f.attr}"
            found += [] if name in CARRIED_FROM_INFRA else [name]
        elif isinstance(f, ast.Name) and f.id in functions:
            found.append(f.id)
    return found


def is_sink(call: ast.Call) -> bool:
    f = call.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    return name.endswith("_loss") or "advantages" in name or name == "backward"


def loss_inputs_from_infra(function: ast.FunctionDef, modules: set[str], functions: set[str]) -> list[str]:
    """Where a number from an infra call reaches a loss in `function`: "line: infra call -> the loss's input". The
    names each statement binds from such a call (or from a name already so bound) are followed in order, repeated
    until nothing changes, so that a value carried across the steps of a loop counts too."""
    origin = {}  # name -> the infra call its value came from
    statements = [
        n for n in ast.walk(function) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.For))
    ]
    statements.sort(key=lambda n: n.lineno)
    for _ in range(5):
        before = dict(origin)
        for node in statements:
            value = node.iter if isinstance(node, ast.For) else node.value
            targets = node.target if not isinstance(node, ast.Assign) else ast.Tuple(elts=node.targets)
            calls = plumbing_calls(value, modules, functions) if value is not None else []
            carried = [origin[name] for name in roots(value) if name in origin]
            source = (calls or carried or [None])[0]
            if source:
                for name in target_roots(targets):
                    origin.setdefault(name, source)
        if origin == before:
            break
    found = []
    for call in (n for n in ast.walk(function) if isinstance(n, ast.Call) and is_sink(n)):
        read = set().union(*(roots(a) for a in [*call.args, *(k.value for k in call.keywords), call.func]))
        found += [f"{call.lineno}: {origin[name]} -> {name}" for name in sorted(read) if name in origin]
        found += [f"{call.lineno}: {c}" for a in call.args for c in plumbing_calls(a, modules, functions)]
    if function.name.endswith("_loss"):
        for ret in (n for n in ast.walk(function) if isinstance(n, ast.Return) and n.value is not None):
            loss = ret.value.elts[0] if isinstance(ret.value, ast.Tuple) else ret.value
            found += [
                f"{ret.lineno}: {origin[name]} -> {name}" for name in sorted(roots(loss)) if name in origin
            ]
    return found


def test_loss_inputs_from_infra_by_hand():
    text = """
from infra import runs, metrics

def main(args):
    device = runs.pick(args)
    stats = metrics.reward_stats(args)
    run = runs.Run(args)
    scale = stats["reward_std"]
    advantages = group_advantages(args.rewards, scale)
    loss = grpo_loss(advantages, run.first_step)
    loss.backward()
"""
    tree = ast.parse(text)
    modules, functions = infra_names(tree)
    found = loss_inputs_from_infra(tree.body[1], modules, functions)
    # runs.pick is not carried (device unused by a loss), metrics.reward_stats reaches Â through `scale`, and through
    # Â the loss and its backward; runs.Run is allowed
    assert found == [
        "9: metrics.reward_stats -> scale",
        "10: metrics.reward_stats -> advantages",
        "11: metrics.reward_stats -> loss",
    ]


@pytest.mark.parametrize("name", [*ALGORITHMS, *VARIANTS])
def test_no_number_a_loss_uses_comes_from_infra(name):
    tree = ast.parse((REPO / f"{name}.py").read_text())
    modules, functions = infra_names(tree)
    found = [
        f"{name}.py:{where}"
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        for where in loss_inputs_from_infra(node, modules, functions)
    ]
    assert not found, f"numbers computed in infra/ reach a loss: {found}"
