"""A calculator the model may call, and the task that needs it: sums of three numbers of three and four digits.

The model writes `<calc>347 + 589 + 1024</calc>`; the environment appends ` <result>1960</result>` and the model goes
on, for at most a few calls, until it answers. The calculator reads integers and + - × (or * and x) only, with ×
before + and -, and never evaluates the model's text: anything else is the result `error`, never an exception.

    calculate("347 + 589 + 1024") -> "1960"      calculate("2 + 3 × 4") -> "14"      calculate("2 ** 8") -> "error"

The problems come from their own seeded family (make_tool_problem), through tasks.heldout_problems and
tasks.train_problems, so the held-out ones stay apart as for every task; the prompt says how to call the tool
(TOOL_INSTRUCTION), and tool_demonstration is the worked use an SFT cold start imitates.
"""

from __future__ import annotations

import random
import re

from task import tasks

CALL = re.compile(r"<calc>(.*?)</calc>", re.DOTALL)
CALL_END = "</calc>"
TOOL_INSTRUCTION = " You may use a calculator: write <calc>an expression</calc> and its <result> follows."
_TOKEN = re.compile(r"\s*([0-9]+|[-+*x×])")  # [0-9], not \d: int() reads Arabic-Indic and other digits too
MAX_DIGITS = 12  # a number longer than this is an error: the model's text never makes a huge integer
MAX_TERM = 10**100  # a product past it is an error: str() refuses integers of 4,300 digits and more


def calculate(expression: str) -> str:
    """The value of `expression`, integers (ASCII digits) joined by +, -, × (* and x too), × first; else "error"."""
    tokens = []
    position = 0
    while position < len(expression.rstrip()):
        match = _TOKEN.match(expression, position)
        if match is None:
            return "error"
        tokens.append(match.group(1))
        position = match.end()
    numbers = tokens[0::2]
    operators = tokens[1::2]
    if not numbers or len(numbers) != len(operators) + 1:
        return "error"
    if not all(n.isdigit() and len(n) <= MAX_DIGITS for n in numbers) or any(o.isdigit() for o in operators):
        return "error"
    # products first: a sum of terms, each term a product, each with the sign before it
    total = 0
    term = int(numbers[0])
    sign = 1
    for operator, number in zip(operators, numbers[1:]):
        if operator in "*x×":
            term = term * int(number)
            if term > MAX_TERM:
                return "error"
        else:
            total = total + sign * term
            sign = 1 if operator == "+" else -1
            term = int(number)
    return str(total + sign * term)


def tool_result(call_text: str) -> str:
    """What the environment appends after a completion that ends with a call: ` <result>value</result>`, the value
    of the last <calc>…</calc> in `call_text` (calculate's, or error). The space keeps `>` and `<` apart, so the
    call's last token and the result's first tokenise the same in a demonstration and in the loop."""
    calls = CALL.findall(call_text)
    return f" <result>{calculate(calls[-1]) if calls else 'error'}</result>"


def make_tool_problem(rng: random.Random) -> tasks.Problem:
    """A sum of three numbers of three or four digits, with the calculator's instruction: past what a 135M model
    adds in its head."""
    numbers = [rng.randint(100, 9999) for _ in range(3)]
    question = f"What is {numbers[0]} + {numbers[1]} + {numbers[2]}?"
    return tasks.Problem(prompt=question + TOOL_INSTRUCTION, answer=str(sum(numbers)))


def tool_demonstration(problem: tasks.Problem) -> str:
    """The worked use of the tool, the environment's result included, for SFT's cold start:
    `<calc>347 + 589 + 1024</calc> <result>1960</result> The answer is 1960.`"""
    expression = problem.prompt.removeprefix("What is ").split("?")[0]
    return f"<calc>{expression}</calc>{tool_result(f'<calc>{expression}</calc>')} The answer is {problem.answer}."
