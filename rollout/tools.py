"""Tools the model can call: a safe calculator and a sandboxed Python runner.

A tool's ``execute`` is a ``kind="tool"`` span. A tool that fails raises
:class:`ToolError`: the span is recorded with status ``error`` and the agent
loop shows the message to the model as the observation; a tool never crashes
a rollout.
"""

from __future__ import annotations

import ast
import asyncio
import math
import operator
import os
import signal
import sys
import tempfile
from typing import Any, ClassVar

import tracer

#: Longest observation shown to the model; longer output is cut.
MAX_OBSERVATION_CHARS = 2000


class ToolError(Exception):
    """A tool could not do what was asked; the message is the model's observation."""


class Tool:
    """Base class: a name, a JSON schema, and an async ``execute(arguments)``."""

    name: ClassVar[str]
    description: ClassVar[str]
    parameters: ClassVar[dict[str, Any]]

    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema that the chat template renders."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    async def execute(self, arguments: dict[str, Any]) -> str:
        """Run the tool; return the observation text or raise :class:`ToolError`."""
        raise NotImplementedError

    def _require_str(self, arguments: dict[str, Any], key: str) -> str:
        value = arguments.get(key)
        if not isinstance(value, str) or not value.strip():
            extra = sorted(set(arguments) - {key})
            hint = f" (got arguments {', '.join(extra)})" if extra else ""
            raise ToolError(f'{self.name} needs a string argument "{key}"{hint}')
        return value


# -- calculator ---------------------------------------------------------------

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS = {
    "abs": abs,
    "round": round,
    "min": min,
    "max": max,
    "sqrt": math.sqrt,
    "floor": math.floor,
    "ceil": math.ceil,
}
_CONSTANTS = {"pi": math.pi, "e": math.e}
#: Limits that keep one expression from eating the CPU or memory.
MAX_EXPRESSION_CHARS = 500
MAX_EXPONENT = 64
MAX_MAGNITUDE = 1e100


def evaluate_expression(expression: str) -> int | float:
    """Evaluate arithmetic safely: numbers, + - * / // % **, parentheses, a few functions.

    The expression is parsed with :mod:`ast` and walked; nothing is ever
    passed to ``eval``. Names other than ``pi``/``e`` and the functions
    ``abs round min max sqrt floor ceil`` are refused.

    Raises:
        ToolError: the expression is not allowed or cannot be computed.
    """
    text = expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression is {len(text)} characters long; the limit is {MAX_EXPRESSION_CHARS}")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ToolError(f"cannot parse expression {expression!r}: {exc.msg}") from None

    def walk(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
                raise ToolError(f"exponent {right} is too large (limit {MAX_EXPONENT})")
            try:
                value = _BINARY[type(node.op)](left, right)
            except ZeroDivisionError:
                raise ToolError("division by zero") from None
            except (OverflowError, ValueError) as exc:
                raise ToolError(f"cannot compute: {exc}") from None
            if isinstance(value, complex):
                raise ToolError("result is a complex number")
            if abs(value) > MAX_MAGNITUDE:
                raise ToolError("result is too large")
            return value
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](walk(node.operand))
        if isinstance(node, ast.Name) and node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _FUNCTIONS
            and not node.keywords
            and 0 < len(node.args) <= 8
        ):
            args = [walk(a) for a in node.args]
            try:
                return _FUNCTIONS[node.func.id](*args)
            except (TypeError, ValueError, OverflowError) as exc:
                raise ToolError(f"{node.func.id}(): {exc}") from None
        shown = ast.get_source_segment(text, node) or type(node).__name__
        raise ToolError(f"{shown!r} is not allowed; use numbers, + - * / // % ** and ( )")

    return walk(tree)


def format_number(value: int | float) -> str:
    """Print a result the way a person would: ``48`` not ``47.99999999999999``."""
    if isinstance(value, float):
        if math.isfinite(value) and abs(value - round(value)) < 1e-9 * max(1.0, abs(value)):
            return str(int(round(value)))
        return f"{value:.10g}"
    return str(value)


class Calculator(Tool):
    """Evaluates an arithmetic expression (safely: see :func:`evaluate_expression`)."""

    name = "calculator"
    description = "Evaluate an arithmetic expression, e.g. '3 * (47 + 29) / 4'. Supports + - * / // % ** ( ) and sqrt, round, abs, min, max."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "The arithmetic expression."}},
        "required": ["expression"],
    }

    @tracer.rollout_trace_op(name="calculator", kind="tool")
    async def execute(self, arguments: dict[str, Any]) -> str:
        """Evaluate ``arguments["expression"]``."""
        return format_number(evaluate_expression(self._require_str(arguments, "expression")))


# -- python -----------------------------------------------------------------------


#: Runs first in the child interpreter: caps its resources, then runs the
#: model's program. Setting the limits in the child itself (rather than in a
#: ``preexec_fn``) lets ``subprocess`` use vfork/posix_spawn: forking a large
#: rollout process (a loaded model) with ``preexec_fn`` took ~100 ms a call.
_BOOTSTRAP = """\
import resource, runpy, sys
cpu, mem, fsize = (int(x) for x in sys.argv[1:4])
for what, value in ((resource.RLIMIT_CPU, (cpu, cpu + 1)), (resource.RLIMIT_AS, (mem, mem)),
                    (resource.RLIMIT_FSIZE, (fsize, fsize)), (resource.RLIMIT_NOFILE, (64, 64)),
                    (resource.RLIMIT_CORE, (0, 0))):
    resource.setrlimit(what, value)
del resource, cpu, mem, fsize, what, value
path = sys.argv[4]
sys.argv = [path]
runpy.run_path(path, run_name="__main__")
"""


class PythonRunner(Tool):
    """Runs a Python snippet in a fresh interpreter with a timeout and resource limits.

    The child runs ``python -I -S`` (no user site, no environment variables
    of ours) in an empty temporary directory, in its own process group, and
    sets ``setrlimit`` caps on its CPU seconds, address space, written file
    size and open files before it runs the program. A wall-clock timeout kills the whole process group. It does
    not isolate the network or the file system beyond that: run untrusted
    models' code in a container as well.

    Args:
        timeout_s: Wall-clock limit.
        cpu_s: CPU-seconds limit (RLIMIT_CPU).
        memory_mb: Address-space limit (RLIMIT_AS).
        max_output_chars: Longest stdout/stderr kept.
    """

    name = "python"
    description = "Run a short Python 3 program and return what it prints. Use print() to show results."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "Python source code; print the result."}},
        "required": ["code"],
    }

    def __init__(
        self,
        timeout_s: float = 5.0,
        cpu_s: int = 5,
        memory_mb: int = 256,
        max_output_chars: int = MAX_OBSERVATION_CHARS,
    ):
        self.timeout_s = timeout_s
        self.cpu_s = cpu_s
        self.memory_mb = memory_mb
        self.max_output_chars = max_output_chars

    @tracer.rollout_trace_op(name="python", kind="tool")
    async def execute(self, arguments: dict[str, Any]) -> str:
        """Run ``arguments["code"]``; return its stdout, or raise with its error."""
        code = self._require_str(arguments, "code")
        return await self.run_code(code)

    async def run_code(self, code: str) -> str:
        """Run ``code`` under the limits; return stdout or raise :class:`ToolError`."""
        limits = (str(self.cpu_s), str(self.memory_mb * 1024 * 1024), str(1024 * 1024))
        with tempfile.TemporaryDirectory(prefix="rollout-python-") as workdir:
            script = os.path.join(workdir, "main.py")
            with open(script, "w", encoding="utf-8") as f:
                f.write(code)
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-I",
                "-S",
                "-c",
                _BOOTSTRAP,
                *limits,
                script,
                cwd=workdir,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={"PATH": "/usr/bin:/bin", "PYTHONIOENCODING": "utf-8", "LC_ALL": "C.UTF-8"},
                start_new_session=True,
            )
            try:
                out, err = await asyncio.wait_for(proc.communicate(), self.timeout_s)
            except asyncio.TimeoutError:
                self._kill(proc)
                await proc.wait()
                raise ToolError(
                    f"timed out after {self.timeout_s:g} s (the wall-clock limit); make the program faster"
                ) from None
            except BaseException:
                self._kill(proc)
                raise
        stdout = out.decode("utf-8", "replace")
        stderr = err.decode("utf-8", "replace")
        if proc.returncode != 0:
            raise ToolError(self._describe_failure(proc.returncode, stderr))
        text = stdout.strip()
        if not text:
            return "(no output; use print() to show a result)"
        return _clip(text, self.max_output_chars)

    def _describe_failure(self, returncode: int | None, stderr: str) -> str:
        rc = returncode or 0
        if rc < 0:
            sig = -rc
            if sig in (signal.SIGXCPU, signal.SIGKILL):
                return f"killed: CPU time limit of {self.cpu_s} s exceeded"
            if sig == signal.SIGXFSZ:
                return "killed: file size limit exceeded"
            return f"killed by signal {signal.Signals(sig).name}"
        tail = stderr.strip().splitlines()
        if tail and "MemoryError" in tail[-1]:
            return f"MemoryError: the memory limit is {self.memory_mb} MB"
        # The last lines of a traceback say what went wrong.
        return _clip("\n".join(tail[-3:]) or f"exited with status {rc}", self.max_output_chars)

    @staticmethod
    def _kill(proc: asyncio.subprocess.Process) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n... ({len(text) - limit} more characters cut)"


def default_tools() -> list[Tool]:
    """The demo's tools: calculator and python."""
    return [Calculator(), PythonRunner()]
