"""Every option a script's --help lists acts or is refused in one line. A variant inherits its reference's Args, so
it lists options its own loop may never read (grpo_tools.py once took --dynamic-sampling and dropped it): this file
finds, for each trainer, the options its `main` reads on the path it runs, and asks of every other option that the
script's own checks refuse it (exit 2) when it is moved from its default. Under torchrun the same: a trainer whose
path never all-reduces a gradient must refuse torchrun.

The path a trainer runs is read from the source (ast), not from a run: from `main`, every project function and class
it names, and theirs in turn; a check (a function whose name begins with `check`) validates an option and does not
count as acting on it, and `tasks.evaluation_for_model` only fills in unset ones. An option is read where the code
takes it from the options (`args.<name>`, `args.run.<name>`, `options.<name>`, `lora.<name>`)."""

import ast
import dataclasses
import importlib
import typing
from pathlib import Path

import pytest

from infra import distributed
from common import InputError
from task import tasks

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("", "infra", "task")
# the bases an option is read from: the Args, its run and LoRA groups, and the names infra/ gives them
OPTION_BASES = ("args", "args.run", "args.lora", "options", "lora")
# fill in options left unset; they act on none of them
NOT_ACTING = {"task.tasks.evaluation_for_model"}
# the options a trainer cannot start without, set so that its checks pass before one option moves
REQUIRED = {
    "distill": {"teacher": "sft-run/model"},
    "grpo_prm": {"prm": "prm-run/model"},
    "ppo": {"reward": "verifier"},
    "ppo_overoptimisation": {"reward": "verifier"},
    "ppo_prm": {"prm": "prm-run/model"},
    "variants": {"algo": "rloo"},
}


def module_names() -> list[str]:
    names = []
    for package in PACKAGES:
        for path in sorted((REPO / package).glob("*.py")):
            names.append(f"{package}.{path.stem}" if package else path.stem)
    return names


def trainers() -> list[str]:
    """The scripts whose command line is an Args class (`runs.cli(main, Args)`)."""
    return [name for name in module_names() if "runs.cli(main, Args)" in source_of(name)]


def source_of(module: str) -> str:
    return (REPO / (module.replace(".", "/") + ".py")).read_text()


def dotted(node) -> str:
    """`a.b.c` for an attribute chain of names, '' for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else ""
    return ""


class Index:
    """The project's functions and classes by qualified name, and what each module's names refer to."""

    def __init__(self):
        self.nodes = {}  # qualified name -> FunctionDef or ClassDef
        self.aliases = {}  # module -> {local name: qualified name of a module or definition}
        for module in module_names():
            tree = ast.parse(source_of(module))
            aliases = {}
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    self.nodes[f"{module}.{node.name}"] = node
                    aliases[node.name] = f"{module}.{node.name}"
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        aliases[alias.asname or alias.name] = alias.name
                if isinstance(node, ast.ImportFrom) and node.module:
                    for alias in node.names:
                        aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            self.aliases[module] = aliases

    def resolve(self, module: str, name: str):
        """The qualified name that `name` (a.b.c) in `module` refers to, if it is one of the project's."""
        head, _, rest = name.partition(".")
        target = self.aliases[module].get(head)
        if target is None:
            return None
        candidate = f"{target}.{rest}" if rest else target
        # `runs.Run.log` is runs.Run's: a method is reached through its class
        while candidate and candidate not in self.nodes:
            candidate = candidate.rpartition(".")[0]
        return candidate or None

    def module_of(self, qualified: str) -> str:
        parts = qualified.split(".")
        for i in range(len(parts), 0, -1):
            if ".".join(parts[:i]) in self.aliases:
                return ".".join(parts[:i])
        raise KeyError(qualified)


INDEX = Index()


def reached_from(qualified: str) -> dict[str, ast.AST]:
    """Every project function and class reachable from `qualified` by naming, checks and fillers left out."""
    seen = {}
    todo = [qualified]
    while todo:
        name = todo.pop()
        if name in seen or name in NOT_ACTING or name.rpartition(".")[2].startswith("check"):
            continue
        node = INDEX.nodes[name]
        seen[name] = node
        module = INDEX.module_of(name)
        for inner in ast.walk(node):
            if isinstance(inner, (ast.Name, ast.Attribute)):
                target = INDEX.resolve(module, dotted(inner)) if dotted(inner) else None
                if target is not None:
                    todo.append(target)
    return seen


def options_read(nodes) -> set[str]:
    """The option names these functions take from the options."""
    read = set()
    for node in nodes:
        for inner in ast.walk(node):
            if isinstance(inner, ast.Attribute) and is_options(inner.value):
                read.add(inner.attr)
            # getattr(args, "pass_k", 0): a script-independent read of an option some scripts lack
            is_getattr = (
                isinstance(inner, ast.Call) and dotted(inner.func) == "getattr" and len(inner.args) >= 2
            )
            if is_getattr and is_options(inner.args[0]) and isinstance(inner.args[1], ast.Constant):
                read.add(inner.args[1].value)
    return read


def is_options(node) -> bool:
    """Whether `node` names the options or one of their groups (`self.args` in a class is the Args too)."""
    name = dotted(node)
    return name in OPTION_BASES or name.endswith((".args", ".args.run", ".args.lora"))


def options_dropped(nodes) -> set[str]:
    """The parameters these functions take and never read: an option handed on by name and then ignored
    (`evaluate(step, pass_k)` where the evaluation samples no pass@k) is not acted on."""
    dropped = set()
    for node in nodes:
        functions = [inner for inner in ast.walk(node) if isinstance(inner, ast.FunctionDef)]
        for function in functions:
            loaded = {inner.id for inner in ast.walk(function) if isinstance(inner, ast.Name)}
            parameters = function.args.args + function.args.kwonlyargs
            dropped |= {parameter.arg for parameter in parameters if parameter.arg not in loaded}
    return dropped


def flat_fields(args_class) -> dict[str, dataclasses.Field]:
    """The options --help lists: the Args fields, its run and LoRA groups' flattened into it."""
    fields = {}
    for field in dataclasses.fields(args_class):
        if dataclasses.is_dataclass(field.default_factory) if callable(field.default_factory) else False:
            fields.update(flat_fields(field.default_factory))
        else:
            fields[field.name] = field
    return fields


def moved(value, annotation):
    """A value away from `value` that the option's type takes."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    hints = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        return next(choice for choice in hints if choice != value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 0.5
    if isinstance(value, tuple):
        return value + value[:1] if value else ("x",)
    if value is None:
        inner = next(hint for hint in hints if hint is not type(None))
        if typing.get_origin(inner) is tuple:  # (float, ...): one element of its type
            return (moved(None, typing.Optional[typing.get_args(inner)[0]]),)
        return {int: 1, float: 0.5, str: "x"}.get(inner, "x")
    return "x"


def checked(args):
    """As a trainer's main does before its checks: the options left unset filled in for the model."""
    return tasks.evaluation_for_model(args) if hasattr(args, "pass_k") else args


@pytest.mark.parametrize("script", trainers())
def test_every_option_acts_or_is_refused(script):
    module = importlib.import_module(script)
    hints = typing.get_type_hints(module.Args, include_extras=True)
    path = reached_from(f"{script}.main").values()
    read = options_read(path) - options_dropped(path)
    default = module.Args(**REQUIRED.get(script, {}))
    module.check_args(checked(default))  # the starting point passes: a refusal below is the moved option's
    unread = []
    for name, field in flat_fields(module.Args).items():
        if name in read:
            continue
        value = getattr(default, name, None)
        for group in ("run", "lora"):
            if hasattr(default, group) and hasattr(getattr(default, group), name):
                value = getattr(getattr(default, group), name)
        annotation = hints.get(name, field.type)
        changed = moved(value, annotation)
        if hasattr(default, name):
            args = dataclasses.replace(default, **{name: changed})
        else:
            group = "run" if hasattr(default.run, name) else "lora"
            args = dataclasses.replace(
                default, **{group: dataclasses.replace(getattr(default, group), **{name: changed})}
            )
        try:
            module.check_args(checked(args))
        except InputError as error:
            if f"--{name.replace('_', '-')}" in str(error):
                continue
        unread.append(name)
    assert not unread, f"{script}.py lists options its main never reads and does not refuse: {unread}"


@pytest.mark.parametrize("script", trainers())
def test_a_trainer_that_never_sums_gradients_over_ranks_refuses_torchrun(script, monkeypatch):
    """Under torchrun each rank trains its own copy unless the path all-reduces the gradients (grpo_tools.py once
    ran N separate models): such a trainer must refuse torchrun."""
    if "infra.distributed.all_reduce_grads" in reached_from(f"{script}.main"):
        pytest.skip(f"{script}.py sums its gradients over the ranks")
    module = importlib.import_module(script)
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    monkeypatch.setattr(distributed, "under_torchrun", lambda: True)
    with pytest.raises(InputError, match="torchrun"):
        module.check_args(checked(module.Args(**REQUIRED.get(script, {}))))


def argparse_scripts() -> list[Path]:
    return [path for path in sorted(REPO.glob("*/*.py")) if "add_argument(" in path.read_text()]


def argparse_options(tree) -> list[str]:
    """The destinations of a parser's options: `--out-dir` -> out_dir, or its dest=."""
    options = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and dotted(node.func).endswith("add_argument"):
            flags = [arg.value for arg in node.args if isinstance(arg, ast.Constant)]
            dest = [keyword.value.value for keyword in node.keywords if keyword.arg == "dest"]
            longest = max(flags, key=len).lstrip("-").replace("-", "_")
            options.append(dest[0] if dest else longest)
    return options


@pytest.mark.parametrize("path", argparse_scripts(), ids=lambda path: f"{path.parent.name}/{path.name}")
def test_every_option_of_a_study_script_is_read(path):
    """The scripts under scripts/ and dev/ parse their own command line: each option they define is read."""
    tree = ast.parse(path.read_text())
    # a script may hand its options on whole to a sibling it imports (sensitivity.py to compare.py's run_once)
    siblings = [
        ast.parse((path.parent / f"{alias.name}.py").read_text())
        for node in tree.body
        if isinstance(node, ast.Import)
        for alias in node.names
        if (path.parent / f"{alias.name}.py").exists()
    ]
    read = set()
    for source in [tree] + siblings:
        read |= {node.attr for node in ast.walk(source) if isinstance(node, ast.Attribute)}
        read |= {node.value for node in ast.walk(source) if isinstance(node, ast.Constant)}
    unread = [name for name in argparse_options(tree) if name not in read]
    assert not unread, f"{path.name} defines options it never reads: {unread}"
