"""The calculator: exact arithmetic from the AST, friendly input forms, clear errors."""

from __future__ import annotations

from fractions import Fraction

import pytest

from tools import Calculator, ToolError
from tools.calculator import CalculatorArgs, calculate


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("0.1 + 0.2", "0.3"),
        ("6 * 7", "42"),
        ("7 / 2", "3.5"),
        ("7 // 2", "3"),
        ("-7 % 3", "2"),
        ("2 ** 10", "1024"),
        ("-(3 - 5) * +2", "4"),
        ("((1 + 2) * (3 + 4)) / 7", "3"),
        ("1.1 * 1.1", "1.21"),
        ("1 / 8", "0.125"),
        ("2 ** -2", "0.25"),
        ("123456789 * 987654321", "121932631112635269"),
        ("2 ** 100", "1267650600228229401496703205376"),
        ("1e3 + 0.5", "1000.5"),
        ("1/3", "0.3333333333"),
        ("2/3", "0.6666666667"),
        ("100/7", "14.28571429"),
        ("10 ** 1000", "1e+1000"),
        ("1e-30 / 3", "3.333333333e-31"),
        ("0 - 0.5", "-0.5"),
    ],
)
def test_arithmetic_is_exact(expression, expected):
    assert calculate(expression) == expected


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("3 x 4", "12"),
        ("3x4", "12"),
        ("2 X (1 + 2)", "6"),
        ("6 × 7", "42"),
        ("10 ÷ 4", "2.5"),
        ("2^8", "256"),
        ("1,000 + 2,500", "3500"),
        ("1,234,567 * 2", "2469134"),
        ("12 * 3 =", "36"),
        ("5 − 2", "3"),
        ("  4 + 4  ", "8"),
    ],
)
def test_friendly_forms(expression, expected):
    assert calculate(expression) == expected


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("abs(-3.5)", "3.5"),
        ("round(2.675, 2)", "2.68"),  # exact decimal, not the float 2.67499...
        ("round(7.5)", "8"),
        ("min(4, 2, 9)", "2"),
        ("max(3, 1,000)", "1000"),  # ', ' separates arguments, so 1,000 is one number
        ("min(1,234)", "1"),  # no spaced separators: two arguments
        ("sqrt(16)", "4"),
        ("sqrt(0.25)", "0.5"),
        ("sqrt(2)", "1.414213562"),
        ("2 * pi", "6.283185307"),
        ("2 ** 0.5", "1.414213562"),
    ],
)
def test_functions(expression, expected):
    assert calculate(expression) == expected


@pytest.mark.parametrize(
    "expression, message",
    [
        ("(1 + 2", "syntax error"),
        ("2 +* 3", "at character 4"),
        ("1 / 0", "division by zero"),
        ("5 % (2 - 2)", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("foo(3)", "unknown function 'foo'"),
        ("x + 1", "unknown name 'x'"),
        ("__import__('os')", "unknown function"),
        ("(1).__class__", "only arithmetic"),
        ("[1, 2]", "only arithmetic"),
        ("'a' * 3", "only arithmetic"),
        ("1 < 2", "only arithmetic"),
        ("9 ** 9 ** 9", "exponent 387420489 is too large"),
        ("1e300 ** 1e300", "exponent 1e\\+300 is too large"),
        ("2 ** 10000 * 2 ** 10000", "too large"),
        ("7 ** 9000", "too large"),
        ("(-8) ** (1/3)", "not a real number"),
        ("sqrt(-1)", "not a real number"),
        ("sqrt(1, 2)", "takes 1 argument"),
        ("round(1, x=2)", "positional"),
        ("=", "empty expression"),
        ("(" * 300 + "1" + ")" * 300, "nested"),
        # literals whose value is refused before it is built (1e9999999 took 7.8 s to build)
        ("1e9999999", "out of range"),
        ("1e-9999999", "out of range"),
        ("1_0e99_999_999", "out of range"),
        ("0.000001e6002 + 1", "out of range"),
        ("1e6001", "out of range"),
    ],
)
def test_clear_errors(expression, message):
    with pytest.raises(ToolError, match=message.replace("(", r"\(").replace("*", r"\*")):
        calculate(expression)


@pytest.mark.parametrize(
    "expression, expected",
    [("1e5999 / 1e5998", "10"), ("1e-5999 * 1e5999", "1"), ("2.5e3", "2500")],
)
def test_literals_within_range_stay_exact(expression, expected):
    assert calculate(expression) == expected


def test_literals_are_bounded_before_they_are_built(monkeypatch):
    """The bound is read off the literal's text: the number is never built (no `10**exp`)."""
    import tools.calculator as calc

    built: list[str] = []
    monkeypatch.setattr(calc, "Fraction", lambda text: built.append(text) or Fraction(text))
    with pytest.raises(ToolError, match="out of range"):
        calculate("1e29999999")
    assert built == []


async def test_tool_interface():
    tool = Calculator()
    assert await tool.run(CalculatorArgs(expression="3 x 4 =")) == "12"
    schema = tool.spec()["function"]["parameters"]
    assert schema["required"] == ["expression"]
    assert schema["properties"]["expression"]["maxLength"] == 500
