"""The lab behind the notebooks: parameter checks (`params`), the headless notebook runner
(`notebooks`) and what a notebook calls in its kernel (`display`), run records gathered into
comparisons (`comparisons`), tables (`tables`), call inspection (`inspection`), saved inspections
(`saved_inspection`) and the attention explorer (`explorer`). A notebook imports
`from bcr_core import lab` and reads the names below; each lives in the module named beside it.
"""

from bcr_core.analysis.claims.protocol import with_agreement
from bcr_core.analysis.reports.summary import condition_table
from bcr_core.conditions import condition, parse
from bcr_core.engine.loading import lazy_backbone
from bcr_core.lab import saved_inspection
from bcr_core.lab.comparisons import Comparison, Runs, cached_frame, collect, safe_name
from bcr_core.lab.explorer import Exploration, Explorer, explore
from bcr_core.lab.heatmap import SELECTED, attention_figure, field_rows, highlighted_rows, update_figure
from bcr_core.lab.inspection import CallView, Inspection, answers_side_by_side, inspect_requests
from bcr_core.lab.tables import (
    block_table,
    budget_check,
    condition_budget,
    decomposition,
    entropy_rejections,
    gate_counts,
    line_points,
    line_table,
    preview,
    readable,
    rows_per_call,
    seed_table,
    token_alignment,
    tokenization_calls,
)

__all__ = [
    "SELECTED",
    "CallView",
    "Comparison",
    "Exploration",
    "Explorer",
    "Inspection",
    "Runs",
    "answers_side_by_side",
    "attention_figure",
    "block_table",
    "budget_check",
    "cached_frame",
    "collect",
    "condition",
    "condition_budget",
    "condition_table",
    "decomposition",
    "entropy_rejections",
    "explore",
    "field_rows",
    "gate_counts",
    "highlighted_rows",
    "inspect_requests",
    "lazy_backbone",
    "line_points",
    "line_table",
    "parse",
    "preview",
    "readable",
    "rows_per_call",
    "safe_name",
    "saved_inspection",
    "seed_table",
    "token_alignment",
    "tokenization_calls",
    "update_figure",
    "with_agreement",
]
