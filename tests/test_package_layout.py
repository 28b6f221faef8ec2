"""The package's layout: no import circle anywhere in `bcr_core`, and no function over 60 lines.

Every module is parsed (not imported) and every `import bcr_core...` / `from bcr_core... import`
it holds is an edge, those inside functions too: a lazy import only hides a circle until the call
that closes it. `from PACKAGE import NAME` is an edge to the module PACKAGE.NAME where there is one,
else to PACKAGE itself. A package's own `__init__` is not an edge from its modules (Python runs it
first, whatever they import).
"""

from __future__ import annotations

import ast
from pathlib import Path

import bcr_core

PACKAGE = Path(bcr_core.__file__).parent


def module_files() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Each module of bcr_core -> the modules of bcr_core it imports (anywhere in its file)."""
    modules = module_files()

    def known(name: str) -> str | None:  # the module a dotted name lives in
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges |= {known(a.name) for a in node.names if a.name.split(".")[0] == "bcr_core"}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package `level - 1` steps up
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                if base.split(".")[0] != "bcr_core":
                    continue
                edges |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else known(base) for a in node.names}
        graph[name] = edges - {name, None}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_graph_sees_what_it_checks():
    graph = import_graph()
    assert "bcr_core.runs.grid_task" in graph["bcr_core.runs.grid_ray"]  # a module-level import
    assert "bcr_core.runs.grid_ray" in graph["bcr_core.runs.grid"]  # an import inside a function
    assert (
        "bcr_core.analysis.statistics.inference" in graph["bcr_core.analysis.claims.protocol"]
    )  # `from PACKAGE import MODULE`
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_anywhere_in_the_package():
    assert cycles(import_graph()) == []


def layout_table() -> list[tuple[str, list[str]]]:
    """The README's Layout table as (package, modules) rows in order; a row with no package cell
    continues the package above it, and `bcr_core/` is the top level."""
    from bcr_core.paths import CHECKOUT

    text = (CHECKOUT / "README.md").read_text().split("| package | module | concept |")[1].split("\n\n")[0]
    rows, package = [], None
    for line in text.strip().splitlines()[1:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        package = cells[0].strip("`").rstrip("/").replace("/", ".") or package
        rows.append((package, [m.strip("` ") for m in cells[1].split(",")]))
    return rows


def test_every_module_imports_only_what_sits_above_it_in_the_readme_layout():
    """The README's Layout table is the package's layering: each module's rank is its row's (a
    package's modules share their package's first row), and every edge of the import graph (lazy
    imports included) goes to a module ranked no lower, so no package-level circle can form."""
    rank = {}
    for row, (package, modules) in enumerate(layout_table()):
        for module in modules:
            prefix = "bcr_core" if package == "bcr_core" else f"bcr_core.{package}"
            rank[f"{prefix}.{module.removesuffix('.py')}"] = row
    first_row = {}
    for dotted, row in rank.items():
        package = dotted.rsplit(".", 1)[0]
        if package != "bcr_core":
            first_row[package] = min(first_row.get(package, row), row)

    def level(module: str) -> int:
        return first_row.get(module.rsplit(".", 1)[0], rank[module])

    graph = import_graph()
    modules = {m for m in graph if not module_files()[m].name == "__init__.py"}
    assert sorted(modules - rank.keys()) == [], "modules the README's Layout table does not list"
    assert sorted(rank.keys() - modules) == [], "the README lists modules that do not exist"
    upward = [f"{m} -> {t}" for m in sorted(modules) for t in sorted(graph[m] & modules) if level(t) > level(m)]
    assert upward == []


def long_functions(source: str, most: int = 60) -> list[str]:
    """`name (lines)` for every function or method in `source` longer than `most` lines, its
    signature and docstring counted."""
    tree = ast.parse(source)
    lengths = (
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    )
    return [f"{name} ({length})" for name, length in lengths if length > most]


def test_no_function_in_the_package_is_over_sixty_lines():
    body = "\n".join(f"    x = {i}" for i in range(60))
    assert long_functions(f"def fits():\n{body[: body.rindex(chr(10))]}\n") == []  # 60 lines
    assert long_functions(f"class A:\n    def long(self):\n{body.replace('    ', '        ')}\n") == ["long (61)"]
    found = {name: long_functions(path.read_text()) for name, path in module_files().items()}
    assert {name: long for name, long in found.items() if long} == {}


ANALYSIS = "bcr_core.analysis"
LAYERS = ("statistics", "claims", "reports")  # bottom to top


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """The edges that break `analysis`'s layering: a statistics module importing any `bcr_core` module outside
    `statistics`, or any analysis module importing a layer above its own."""
    layer_of = {m: m.split(".")[2] for m in graph if m.startswith(f"{ANALYSIS}.") and m.count(".") >= 3}
    found = []
    for module, layer in sorted(layer_of.items()):
        for target in sorted(graph[module]):
            outside = layer == "statistics" and layer_of.get(target) != "statistics"
            upward = target in layer_of and LAYERS.index(layer_of[target]) > LAYERS.index(layer)
            if outside or upward:
                found.append(f"{module} -> {target}")
    return found


def test_the_analysis_layers_import_only_downward_and_statistics_nothing_of_the_lab():
    graph = import_graph()
    layers = {m.split(".")[2] for m in graph if m.startswith(f"{ANALYSIS}.") and m.count(".") >= 3}
    assert layers == set(LAYERS), "every analysis module sits in one of the three layers"
    assert layer_violations(graph) == []
    made_up = {  # a claim reading a report, statistics reading the lab's conditions: both caught
        f"{ANALYSIS}.claims.a": {f"{ANALYSIS}.reports.b", f"{ANALYSIS}.statistics.c"},
        f"{ANALYSIS}.reports.b": {f"{ANALYSIS}.claims.a"},
        f"{ANALYSIS}.statistics.c": {"bcr_core.conditions"},
    }
    assert layer_violations(made_up) == [
        f"{ANALYSIS}.claims.a -> {ANALYSIS}.reports.b",
        f"{ANALYSIS}.statistics.c -> bcr_core.conditions",
    ]
