"""Where a code question's prose sits: the character spans of its bare string statements (a function's
docstring, or a string standing alone in a body, as HumanEval/115's after `import math`). The arena reads them
to say whether repaired rows sit on the task's prose or on its code (`arena.ceiling.composition`)."""

from __future__ import annotations

import ast


def prose_spans(source: str) -> list[tuple[int, int]]:
    """[start, stop) character offsets of every statement of `source` that is a string literal alone, in order;
    [] for source that does not parse. A string assigned to a name (HumanEval/64's `FIX = \"\"\"...\"\"\"`) is code."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    encoded = source.encode()
    line_starts = [0]
    for line in encoded.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))

    def offset(line: int, column: int) -> int:  # ast's columns count UTF-8 bytes
        return len(encoded[: line_starts[line - 1] + column].decode())

    spans = [
        (offset(node.lineno, node.col_offset), offset(node.end_lineno, node.end_col_offset))
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    ]
    return sorted(spans)
