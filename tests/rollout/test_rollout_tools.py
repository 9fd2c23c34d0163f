"""The calculator's safety and the Python runner's timeout and resource limits."""

from __future__ import annotations

import asyncio

import pytest

from rollout.tools import Calculator, PythonRunner, ToolError, evaluate_expression, format_number


def test_calculator_evaluates_arithmetic() -> None:
    """+ - * / // % ** and parentheses evaluate like Python arithmetic."""
    assert evaluate_expression("3 * (47 + 47 + 29)") == 369
    assert evaluate_expression("2 ** 10 // 3 % 7") == (2**10 // 3) % 7
    assert evaluate_expression("sqrt(16) + abs(-2)") == 6


def test_calculator_prints_near_integers_as_integers() -> None:
    """Float noise does not leak into the observation: 18*(2+40/60) prints 48."""
    assert format_number(evaluate_expression("18 * (2 + 40 / 60)")) == "48"
    assert format_number(evaluate_expression("1 / 3")) == "0.3333333333"


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('echo hi')",
        "open('/etc/passwd')",
        "(1).__class__",
        "x + 1",
        "[1, 2]",
        "lambda: 1",
        "'a' * 3",
    ],
)
def test_calculator_refuses_anything_but_arithmetic(expression: str) -> None:
    """Names, attributes, calls of other functions, strings and lambdas are refused."""
    with pytest.raises(ToolError, match="not allowed"):
        evaluate_expression(expression)


def test_calculator_refuses_huge_exponents() -> None:
    """An exponent big enough to hang the process is refused before computing."""
    with pytest.raises(ToolError, match="exponent"):
        evaluate_expression("9 ** 9 ** 9")


def test_calculator_reports_division_by_zero() -> None:
    """Division by zero is a tool error with a plain message."""
    with pytest.raises(ToolError, match="division by zero"):
        evaluate_expression("1 / (3 - 3)")


def test_calculator_needs_an_expression_argument() -> None:
    """Calling with the wrong argument name says which argument it needs."""
    with pytest.raises(ToolError, match='"expression"'):
        asyncio.run(Calculator().execute({"expr": "1 + 1"}))


def test_python_runner_returns_stdout() -> None:
    """A program's printed output is the observation."""
    assert asyncio.run(PythonRunner().run_code("print(sum(range(10)))")) == "45"


def test_python_runner_reports_the_exception() -> None:
    """A failing program's last traceback line is the error message."""
    with pytest.raises(ToolError, match="NameError"):
        asyncio.run(PythonRunner().run_code("print(undefined_name)"))


def test_python_runner_kills_a_program_that_sleeps_past_the_timeout() -> None:
    """The wall-clock timeout kills a program that does not finish."""
    with pytest.raises(ToolError, match="timed out"):
        asyncio.run(PythonRunner(timeout_s=1.0, cpu_s=5).run_code("import time\ntime.sleep(60)"))


@pytest.mark.slow
def test_python_runner_enforces_the_cpu_limit() -> None:
    """A busy loop is stopped by RLIMIT_CPU."""
    with pytest.raises(ToolError, match="CPU time limit"):
        asyncio.run(PythonRunner(timeout_s=60.0, cpu_s=1).run_code("while True:\n    pass"))


def test_python_runner_enforces_the_memory_limit() -> None:
    """Allocating past RLIMIT_AS fails with a MemoryError message."""
    with pytest.raises(ToolError, match="MemoryError"):
        asyncio.run(PythonRunner(memory_mb=200).run_code("x = bytearray(1024 ** 3)\nprint(len(x))"))


def test_python_runner_cannot_write_large_files() -> None:
    """Writing past the file-size limit kills the program."""
    with pytest.raises(ToolError, match="File too large"):
        asyncio.run(PythonRunner().run_code("open('big', 'wb').write(b'x' * (8 * 1024 * 1024))"))


def test_python_runner_runs_in_an_empty_directory_without_our_environment() -> None:
    """The child starts in a fresh temporary directory and does not inherit our variables."""
    out = asyncio.run(PythonRunner().run_code("import os\nprint(os.listdir('.'), 'HOME' in os.environ)"))
    assert out == "['main.py'] False"


def test_python_runner_cuts_long_output() -> None:
    """Output longer than the limit is cut and says how much was cut."""
    out = asyncio.run(PythonRunner(max_output_chars=100).run_code("print('y' * 5000)"))
    assert len(out) < 200 and "more characters cut" in out
