"""The shape of tracer/: no import cycle, `import tracer` loads no heavy backend, and its size stays in budget."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(REPO, "tracer")
#: Libraries `import tracer` must not load (they are optional backends or heavy; pyarrow.dataset
#: alone was 0.2 s of it: tracer.dataset and compaction's Parquet writer import it when called).
HEAVY = ("mlflow", "wandb", "swanlab", "torch", "transformers", "vllm", "streamlit", "ray", "pyarrow.dataset")
#: Lines of tracer/ outside tracer/integrations/ (framework integrations grow with the frameworks).
MAX_TRACER_LINES = 17_000
MAX_CLASS_LINES, MAX_FUNCTION_LINES = 400, 100


def _modules() -> dict[str, str]:
    out = {}
    for root, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                parts = os.path.relpath(path, REPO)[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_graph() -> dict[str, dict[str, int]]:
    """``{module: {imported tracer module: line}}``, imports at any depth (functions too), not under TYPE_CHECKING."""
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        edges: dict[str, int] = {}
        is_package = path.endswith("__init__.py")

        def add(target: str | None, line: int, module: str = module, edges: dict[str, int] = edges) -> None:
            if target is not None and target != module:
                edges.setdefault(target, line)

        class Visitor(ast.NodeVisitor):
            def __init__(self, module: str, is_package: bool) -> None:
                self.module, self.is_package = module, is_package

            def visit_If(self, node: ast.If) -> None:
                if _is_type_checking(node.test):
                    for child in node.orelse:
                        self.visit(child)
                    return
                self.generic_visit(node)

            def visit_Import(self, node: ast.Import) -> None:
                for alias in node.names:
                    if alias.name.split(".")[0] == "tracer":
                        add(resolve(alias.name), node.lineno)

            def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
                if node.level:
                    base = self.module if self.is_package else self.module.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        base = base.rpartition(".")[0]
                    source = f"{base}.{node.module}" if node.module else base
                else:
                    source = node.module or ""
                if source.split(".")[0] != "tracer":
                    return
                for alias in node.names:
                    full = f"{source}.{alias.name}"
                    add(full if full in modules else resolve(source), node.lineno)

        Visitor(module, is_package).visit(tree)
        graph[module] = edges
    return graph


def find_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (or a self-loop)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles = []
    for comp in components:
        # A concrete path around the component, for the message.
        members = set(comp)
        path = [comp[0]]
        while True:
            nxt = next(w for w in sorted(graph[path[-1]]) if w in members)
            if nxt in path:
                cycles.append(path[path.index(nxt) :] + [nxt])
                break
            path.append(nxt)
    return cycles


def _describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    return " -> ".join(
        f"{a} (line {graph[a][b]})" if i < len(cycle) - 1 else a
        for i, (a, b) in enumerate(zip(cycle, cycle[1:] + [""]))
    )


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The graph walk reports a two-module cycle and a longer one (so the real check can fail)."""
    graph = {"a": {"b": 1}, "b": {"a": 2}, "c": {"d": 1}, "d": {"e": 1}, "e": {"c": 1}, "f": {"a": 1}}
    cycles = find_cycles(graph)
    assert sorted(sorted(set(c)) for c in cycles) == [["a", "b"], ["c", "d", "e"]]


def test_function_level_imports_are_in_the_graph() -> None:
    """An import inside a function counts: the recorder's writer imports are edges of the graph."""
    graph = import_graph()
    assert "tracer.storage.writer" in graph["tracer.record.recorder"]
    assert "tracer.schema" in graph["tracer.storage.files"]


def test_no_import_cycle_in_tracer() -> None:
    """No module of tracer/ imports, at top level or inside a function, a module that imports it back."""
    graph = import_graph()
    cycles = find_cycles(graph)
    assert not cycles, "import cycles in tracer/:\n" + "\n".join(_describe(c, graph) for c in cycles)


def test_import_tracer_loads_no_heavy_backend() -> None:
    """`import tracer` in a fresh interpreter leaves mlflow, wandb, swanlab, torch, ... unimported."""
    code = f"import sys, tracer\nprint(','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"import tracer loaded: {proc.stdout.strip()}"


#: Literal keys that equal a column name but are not one: (file, key, why).
NOT_COLUMNS = {
    ("tracer/summary/turns.py", "name"): "OpenAI message and tool-call keys",
    ("tracer/summary/turns.py", "outputs"): "verl's AgentLoopOutput field read from a recorded output",
    ("tracer/exporters/mlflow/importer.py", "inputs"): "MLflow span fields listed in rollout_trace.added",
    ("tracer/exporters/mlflow/importer.py", "outputs"): "MLflow span fields listed in rollout_trace.added",
    ("tracer/data/dataset.py", "name"): "the tool name inside an OpenAI message struct",
    ("viewer/bundle.py", "name"): "OpenAI message and tool-call keys",
    ("viewer/views/replay.py", "name"): "OpenAI message and tool-call keys",
    ("viewer/screenshots.py", "error"): "a key of a scripted engine's reply",
    ("tracer/record/sampling.py", "outputs"): "vLLM's RequestOutput field in an llm span's return value",
}
#: Calls whose first argument names a column of a table or a key of a row.
_COLUMN_CALLS = {"column", "field", "get", "select", "sort_by", "drop_columns", "append_column", "set_column"}


def _column_literals(path: str, columns: set[str]) -> list[tuple[int, str, str]]:
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _COLUMN_CALLS
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            key = node.args[0].value
        if isinstance(key, str) and key in columns:
            found.append((node.lineno, key, ast.unparse(node)[:80]))
    return found


def test_column_names_are_spelled_only_in_the_schema_module() -> None:
    """No module of tracer/ or viewer/ but tracer/schema.py reads a column by a string literal.

    A column is read through its constant (``row[S.TRACE_ID]``, ``table[S.NUM_SPANS]``);
    the keys in NOT_COLUMNS equal a column name by coincidence and say why. The viewer's
    URL parameter names are spelled in viewer/state.py, which reads no table by them.
    """
    from tracer import schema as S

    columns = set(S.SPAN_COLUMNS) | set(S.TRAJECTORY_COLUMNS)
    offenders = []
    for top in ("tracer", "viewer"):
        for root, _, files in os.walk(os.path.join(REPO, top)):
            for name in sorted(files):
                path = os.path.join(root, name)
                rel = os.path.relpath(path, REPO)
                if not name.endswith(".py") or rel == os.path.join("tracer", "schema.py"):
                    continue
                for line, key, code in _column_literals(path, columns):
                    if (rel, key) not in NOT_COLUMNS:
                        offenders.append(f"{rel}:{line}: {code}")
    assert not offenders, "column names spelled outside tracer/schema.py:\n" + "\n".join(offenders)


def test_the_column_literal_finder_finds_one(tmp_path: object) -> None:
    """The scan reports a subscript and a .get() by a column name (so the real check can fail)."""
    path = os.path.join(str(tmp_path), "m.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write("def f(row, t):\n    return row['trace_id'], t.get('num_spans'), row['other']\n")
    assert [k for _, k, _ in _column_literals(path, {"trace_id", "num_spans"})] == ["trace_id", "num_spans"]


def test_tracer_stays_within_its_line_budget() -> None:
    """tracer/ outside integrations/ holds at most MAX_TRACER_LINES lines; no class or function outgrows its budget."""
    lines, too_long = 0, []
    for path in _modules().values():
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if os.sep + "integrations" + os.sep not in path:
            lines += len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
                if (node.end_lineno or node.lineno) - node.lineno + 1 > limit:
                    too_long.append(f"{os.path.relpath(path, REPO)}:{node.lineno} {node.name}")
    assert lines <= MAX_TRACER_LINES, f"tracer/ outside integrations/ has {lines} lines (budget {MAX_TRACER_LINES})"
    assert not too_long, f"over {MAX_CLASS_LINES} (class) or {MAX_FUNCTION_LINES} (function) lines: {too_long}"
