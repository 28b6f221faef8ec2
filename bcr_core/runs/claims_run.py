"""Every run the claims' verdicts read, afresh on any model (`analysis.reports.claims_grid.ClaimsGrid` names
them): the main cell and the row-matched controls with fidelity, the gate sweep with its own line,
the unit curve and `bcr verify`, into one folder that `claims_grid.load_claims` reads.
"""

from __future__ import annotations

import json
from pathlib import Path

from bcr_core.analysis.reports.claims_grid import GATE, ClaimsGrid
from bcr_core.engine.models import dtype_name
from bcr_core.paths import write_text_whole
from bcr_core.probes.unit_curve import UnitCurveConfig, default_texts, unit_curve
from bcr_core.probes.verify import verify
from bcr_core.runs.cell import Cell
from bcr_core.runs.runner import run_cell


def claims_cell(
    grid: ClaimsGrid, conditions: list[str], fidelity: bool, n: int | None = None, dtype: str = "auto"
) -> Cell:
    """One run of the grid: its benchmark, agents and items under `conditions`, served in `dtype`."""
    return Cell(
        benchmark=grid.benchmark,
        agents=grid.agents,
        conditions=tuple(conditions),
        n=grid.n if n is None else n,
        max_new_tokens=grid.max_new_tokens,
        item_seed=grid.item_seed,
        fidelity=fidelity,
        dtype=dtype,
    )


def run_fresh(bb, grid: ClaimsGrid, out, unit_config=None, batch: int = 8, progress: bool = True) -> Path:
    """Every run the verdicts read, on `bb`, into `out` (resumable like any `bcr run`); the unit
    curve at budget-matched units (per-prompt records)."""
    out, dtype = Path(out), dtype_name(bb.dtype)
    main, matched = (claims_cell(grid, c, fidelity=True, dtype=dtype) for c in (grid.main(), grid.matched()))
    run_cell(bb, main, out / "main", progress=progress, batch=batch)
    run_cell(bb, matched, out / "matched", progress=progress, batch=batch)
    budgets = claims_cell(grid, grid.budgets(), fidelity=True, dtype=dtype)
    run_cell(bb, budgets, out / "budgets", progress=progress, batch=batch)
    gate = claims_cell(grid, grid.gate_run(), fidelity=False, n=min(grid.gate_n, grid.n), dtype=dtype)
    run_cell(bb, gate, out / GATE, progress=progress, batch=batch)
    curve_path = out / "unit_curve.csv"
    if not curve_path.exists():
        config = unit_config or UnitCurveConfig(segment_tokens=grid.segment_tokens, units=(1, 16, 64, 256))
        texts = default_texts(grid.unit_prompts)
        write_text_whole(curve_path, unit_curve(bb, texts, config, progress=progress).to_csv(index=False))
    write_text_whole(out / "verify.json", json.dumps(verify(bb).to_dict(), indent=2))
    return out
