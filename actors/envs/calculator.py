"""`calculator`: arithmetic through a tool, `<calc>EXPRESSION</calc>` in the default format.

The tool evaluates + - * / // % ** and parentheses over integers and decimals (parsed with `ast`,
never `eval`; exponents up to 64, results up to 10**100). The episode ends at the first turn
without a call: that turn is the answer, which the run's verifiers score (or, with
`score: true`, the environment itself: 1 when the answer's first integer is the row's `answer`).
`available: false` keeps the episode and its turns but answers every call with an error: the
same task without the tool."""

from __future__ import annotations

import ast
import operator
import re

from actors.envs import ENVIRONMENTS
from actors.envs.base import ToolEnvironment, ToolError, text_tool

MAX_CHARS = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 10 ** 100
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_INT = re.compile(r"-?\d+")


def calculate(expression: str) -> str:
    """The value of an arithmetic expression as text (an integral value without a decimal point)."""
    if len(expression) > MAX_CHARS:
        raise ToolError(f"the expression is longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ToolError(f"cannot parse {expression.strip()!r} as arithmetic") from None
    value = _value(tree.body)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value) if isinstance(value, int) else f"{value:.10g}"


def _value(node):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _value(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        a, b = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(b) > MAX_EXPONENT:
            raise ToolError(f"exponents are limited to {MAX_EXPONENT}")
        try:
            v = _OPS[type(node.op)](a, b)
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
        except OverflowError:
            raise ToolError("the result is too large") from None
        if isinstance(v, complex) or abs(v) > MAX_MAGNITUDE:
            raise ToolError("the result is too large" if not isinstance(v, complex) else "the result is not real")
        return v
    raise ToolError("only numbers, + - * / // % ** and parentheses are allowed")


CALC = text_tool("calc", "Evaluate an arithmetic expression.", "expression", fn=calculate,
                 about="numbers, + - * / // % ** and parentheses")


def expression_of(row: dict) -> str:
    """The problem as an expression: the row's `expression` column, else its prompt without '='."""
    return str(row.get("expression") or str(row.get("prompt", "")).strip().rstrip("=").strip())


def first_integer_matches(answer: str, gold) -> float:
    found = _INT.search(answer)
    return float(found is not None and gold is not None and int(found.group()) == int(str(gold).strip()))


class ArithmeticTask(ToolEnvironment):
    """An environment whose problem is an expression (calculator, python): the demonstration calls
    its tool on the expression and answers with what the tool said; with `score`, the answer's
    first integer against the row's `answer` is the reward."""

    tool_name = ""
    argument = ""

    def __init__(self, row: dict, tools: list, tool_format: str, max_calls: int, available: bool, score: bool):
        super().__init__(row, tools, tool_format, max_calls, available)
        self.scores = score

    def score(self, answer: str) -> float | None:
        return first_integer_matches(answer, self.row.get("answer")) if self.scores else None

    def demonstrate(self, observations: list[str]) -> str:
        if not observations:
            return self.format.render(self.tool_name, {self.argument: expression_of(self.row)}, self.tools)
        return observations[-1].strip()


@ENVIRONMENTS.register("calculator")
class Calculator(ArithmeticTask):
    tool_name, argument = "calc", "expression"

    def __init__(self, row: dict, tool_format: str = "tags", max_calls: int = 4, available: bool = True,
                 score: bool = False):
        super().__init__(row, [CALC], tool_format, max_calls, available, score)
