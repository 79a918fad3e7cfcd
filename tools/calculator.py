"""`calculator`: exact arithmetic by walking the expression's AST (never eval)."""

from __future__ import annotations

import ast
import math
import operator
import re
from decimal import Decimal, localcontext
from fractions import Fraction

from pydantic import BaseModel, Field

from tools.base import CpuTool, ToolError

MAX_EXPRESSION_CHARS = 500
MAX_NODES = 200
MAX_BITS = 20_000  # ~6,000 digits: big enough for real sums, small enough to stay sub-millisecond
MAX_EXPONENT = 10_000
MAX_EXACT_DIGITS = 1000  # longer integers are shown in scientific notation
MAX_LITERAL_DIGITS = 6000  # a literal's size in decimal digits (1e6000), checked before it is built
SIGNIFICANT = 10

Number = Fraction | float  # Fraction when exact, float once an irrational step (sqrt 2) happened

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_CONSTANTS: dict[str, Number] = {"pi": math.pi, "e": math.e}


class CalculatorArgs(BaseModel):
    expression: str = Field(
        min_length=1,
        max_length=MAX_EXPRESSION_CHARS,
        description="Arithmetic such as '(12.5 + 3) * 4', '2^10', '1,200 / 7', 'sqrt(2)'.",
    )


class Calculator(CpuTool):
    """Exact arithmetic: + - * / // % ** (or ^), decimals, abs/round/min/max/sqrt, pi, e."""

    name = "calculator"
    description = (
        "Evaluate an arithmetic expression exactly. Supports + - * / // % ** (or ^), "
        "parentheses, decimals, and abs, round, min, max, sqrt. Example: '(3 + 4.5) * 2'."
    )
    Args = CalculatorArgs
    timeout_s = 2.0

    @staticmethod
    def compute(args: CalculatorArgs) -> str:
        return calculate(args.expression)


def calculate(expression: str) -> str:
    """Evaluate `expression` and format the result; ToolError says what was wrong."""
    source = normalize(expression)
    if not source:
        raise ToolError("empty expression: give an arithmetic expression such as '2 + 3'.")
    tree = _parse(source)
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise ToolError(f"expression too long: at most {MAX_NODES} terms and operators.")
    try:
        value = _Evaluator(source).visit(tree.body)
    except OverflowError:
        raise ToolError("result too large (overflow).") from None
    return format_number(value)


def normalize(expression: str) -> str:
    """Rewrite the forms people and small models write (3 x 4, ÷, ^, 1,000, trailing =)."""
    text = expression.strip().rstrip("=").strip()
    text = text.replace("×", "*").replace("·", "*").replace("÷", "/").replace("^", "**")
    text = text.replace("−", "-").replace("–", "-")
    text = re.sub(r"(?<=[\d.)])\s*[xX]\s*(?=[\d.(])", "*", text)
    text = re.sub(r"(?<=[\d.)])\s+[xX]\s+(?=[a-z])", "*", text)
    return _drop_thousands_separators(text)


def _drop_thousands_separators(text: str) -> str:
    """`1,000` is one number; inside a call `min(1,234)` has two arguments unless the writer
    separates arguments with ', ' elsewhere (`max(3, 1,000)`)."""
    spaced_args = ", " in text
    out, calls = [], []  # calls: one flag per open parenthesis, True when it opens a call
    for i, ch in enumerate(text):
        if ch == "(":
            calls.append(bool(re.search(r"[A-Za-z_]\w*\s*$", text[:i])))
        elif ch == ")" and calls:
            calls.pop()
        elif ch == "," and _is_thousands(text, i) and (spaced_args or not (calls and calls[-1])):
            continue
        out.append(ch)
    return "".join(out)


def _is_thousands(text: str, i: int) -> bool:
    """The comma at `i` sits between a digit and exactly three digits."""
    return i > 0 and text[i - 1].isdigit() and re.match(r"\d{3}(?!\d)", text[i + 1 :]) is not None


def _parse(source: str) -> ast.Expression:
    try:
        return ast.parse(source, mode="eval")
    except SyntaxError as exc:
        col = exc.offset or 0
        near = source[max(col - 1, 0) : col + 9] or "the end"
        raise ToolError(
            f"syntax error ({exc.msg}) at character {col}, near {near!r}, in {source!r}."
        ) from None
    except (RecursionError, MemoryError, ValueError):
        raise ToolError("expression is nested too deeply or is malformed.") from None


class _Evaluator(ast.NodeVisitor):
    """Each visit returns a Number; anything that is not arithmetic is refused."""

    def __init__(self, source: str) -> None:
        self.source = source

    def generic_visit(self, node: ast.AST) -> Number:
        what = ast.get_source_segment(self.source, node) or type(node).__name__
        raise ToolError(f"unsupported expression {what!r}: only arithmetic is allowed.")

    def visit_Constant(self, node: ast.Constant) -> Number:
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            return self.generic_visit(node)
        # The literal text, not the float: 0.1 stays exactly one tenth.
        text = ast.get_source_segment(self.source, node) or repr(node.value)
        return _check(Fraction(_bounded_literal(text)))

    def visit_Name(self, node: ast.Name) -> Number:
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        known = ", ".join([*_CONSTANTS, *_FUNCTIONS])
        raise ToolError(f"unknown name {node.id!r}; known names: {known}.")

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Number:
        value = self.visit(node.operand)
        if isinstance(node.op, ast.USub):
            return -value
        if isinstance(node.op, ast.UAdd):
            return value
        return self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> Number:
        left, right = self.visit(node.left), self.visit(node.right)
        if isinstance(node.op, ast.Pow):
            return _check(_power(left, right))
        op = _BINARY.get(type(node.op))
        if op is None:
            return self.generic_visit(node)
        if right == 0 and op in (operator.truediv, operator.floordiv, operator.mod):
            raise ToolError(f"division by zero in {ast.get_source_segment(self.source, node)!r}.")
        return _check(op(left, right))

    def visit_Call(self, node: ast.Call) -> Number:
        name = node.func.id if isinstance(node.func, ast.Name) else None
        if name not in _FUNCTIONS:
            shown = name or ast.get_source_segment(self.source, node.func)
            raise ToolError(f"unknown function {shown!r}; available: {', '.join(_FUNCTIONS)}.")
        if node.keywords:
            raise ToolError(f"{name}() takes positional arguments only.")
        return _check(_FUNCTIONS[name]([self.visit(arg) for arg in node.args]))


_DECIMAL = re.compile(r"(?P<int>[\d_]*)(?:\.(?P<frac>[\d_]*))?(?:[eE](?P<exp>[+-]?[\d_]+))?")


def _bounded_literal(text: str) -> str:
    """`text` when its value has at most MAX_LITERAL_DIGITS digits either side of the point;
    ToolError otherwise, before anything computes `10**exponent` (`1e9999999`)."""
    match = _DECIMAL.fullmatch(text)
    if match is None or match.group("exp") is None:
        return text  # an integer (hex, binary, ...) or plain decimal: its size is its length
    exponent = int(match.group("exp").replace("_", ""))
    digits = len(match.group("int").replace("_", "").lstrip("0"))
    if digits + exponent > MAX_LITERAL_DIGITS or exponent < -MAX_LITERAL_DIGITS:
        raise ToolError(
            f"number {text[:40]!r} is out of range: at most about {MAX_LITERAL_DIGITS:,} digits."
        )
    return text


def _power(base: Number, exponent: Number) -> Number:
    if isinstance(exponent, Fraction) and exponent.denominator == 1:
        if abs(exponent) > MAX_EXPONENT:
            shown = str(exponent) if abs(exponent) < 10**12 else f"{float(exponent):.3g}"
            raise ToolError(f"exponent {shown} is too large (at most {MAX_EXPONENT}).")
        if base == 0 and exponent < 0:
            raise ToolError("division by zero: 0 raised to a negative power.")
        if isinstance(base, Fraction) and _bits(base) * abs(int(exponent)) > MAX_BITS:
            raise ToolError("result too large: the power would have thousands of digits.")
        return base ** int(exponent)
    if base < 0:
        raise ToolError("a negative number raised to a fractional power is not a real number.")
    try:
        return float(base) ** float(exponent)
    except OverflowError:
        raise ToolError("result too large.") from None


def _sqrt(args: list[Number]) -> Number:
    (x,) = _arity("sqrt", args, 1)
    if x < 0:
        raise ToolError("sqrt of a negative number is not a real number.")
    if isinstance(x, Fraction):
        num, den = math.isqrt(x.numerator), math.isqrt(x.denominator)
        if num * num == x.numerator and den * den == x.denominator:
            return Fraction(num, den)
    return math.sqrt(x)


def _round(args: list[Number]) -> Number:
    x, *places = _arity("round", args, 1, 2)
    digits = int(places[0]) if places else 0
    if abs(digits) > 100:
        raise ToolError("round() takes at most 100 decimal places.")
    return round(Fraction(x), digits) if digits else Fraction(round(x))


def _arity(name: str, args: list[Number], low: int, high: int | None = None) -> list[Number]:
    high = low if high is None else high
    if not low <= len(args) <= high:
        want = str(low) if low == high else f"{low} or {high}"
        raise ToolError(f"{name}() takes {want} argument(s), got {len(args)}.")
    return args


def _min_max(pick):
    def run(args: list[Number]) -> Number:
        if not args:
            raise ToolError(f"{pick.__name__}() needs at least one argument.")
        return pick(args)

    return run


_FUNCTIONS = {
    "abs": lambda args: abs(_arity("abs", args, 1)[0]),
    "round": _round,
    "min": _min_max(min),
    "max": _min_max(max),
    "sqrt": _sqrt,
}


def _bits(x: Fraction) -> int:
    return max(x.numerator.bit_length(), x.denominator.bit_length(), 1)


def _check(value: Number) -> Number:
    if isinstance(value, Fraction) and _bits(value) > MAX_BITS:
        raise ToolError("result too large: more than about 6,000 digits.")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("result too large (overflow).")
    return value


def format_number(value: Number) -> str:
    """An integer as `42`, a terminating decimal exactly, anything else to 10 significant digits."""
    if isinstance(value, Fraction):
        if value.denominator == 1 and abs(value.numerator) < 10**MAX_EXACT_DIGITS:
            return str(value.numerator)
        exact = _terminating_decimal(value)
        if exact is not None:
            return exact
    with localcontext() as ctx:
        ctx.prec = SIGNIFICANT
        if isinstance(value, Fraction):
            rounded = Decimal(value.numerator) / Decimal(value.denominator)
        else:
            rounded = +Decimal(value)
    return _plain(rounded)


def _terminating_decimal(value: Fraction) -> str | None:
    """The exact decimal when the denominator is 2^a 5^b and the digits stay readable."""
    den, twos, fives = value.denominator, 0, 0
    while den % 2 == 0:
        den, twos = den // 2, twos + 1
    while den % 5 == 0:
        den, fives = den // 5, fives + 1
    places = max(twos, fives)
    if den != 1 or places > 20 or abs(value) >= 10**30:
        return None
    scaled = value * 10**places  # an integer now
    return _plain(Decimal(scaled.numerator).scaleb(-places))


def _plain(number: Decimal) -> str:
    """Fixed notation for everyday sizes, scientific for the very large or small."""
    if number == 0:
        return "0"
    number = number.normalize()
    exponent = number.adjusted()
    if -7 <= exponent < 15:
        return format(number, "f")
    return format(number, "e").replace("E", "e")
