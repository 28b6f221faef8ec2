"""Running the lab's notebooks headless (what a notebook calls inside its kernel is
`bcr_core.lab.display`).

`run_notebooks` executes the notebooks in `notebooks/` with papermill on the `bcr-lab` Jupyter
kernel (registered by `make setup`), writes each executed copy and an HTML export of it to an
output folder, and reports every failure by notebook and cell:

    02_gate_sweep.ipynb failed at cell 3 of 15, line 3 (`P = params.check(model=model, ...`):
        ParameterError: parameter 'n': expected int >= 1, got str '60'

With `smoke=True` every notebook shrinks its work to a CI-sized run (see `bcr_core.lab.params.SMOKE`)
and keeps its run records under the output folder, so a smoke run never mixes with real results.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bcr_core.errors import UsageError
from bcr_core.paths import NOTEBOOKS, write_text_whole, written_whole

KERNEL = "bcr-lab"
NOTEBOOK_DIR = NOTEBOOKS
ANSI = re.compile(r"\x1b\[[0-9;]*m")


class NotebookError(UsageError):
    """A notebook could not be run (missing kernel, unknown notebook or parameter)."""


@dataclass
class NotebookResult:
    notebook: str
    seconds: float
    executed: str  # the executed copy
    html: str | None  # its HTML export
    error: str | None = None  # what failed, naming the cell

    @property
    def ok(self) -> bool:
        return self.error is None


def notebook_paths(only=None, folder: Path = NOTEBOOK_DIR) -> list[Path]:
    """The lab's notebooks in order; `only` keeps those whose name starts with one of its entries."""
    paths = sorted(Path(folder).glob("[0-9][0-9]_*.ipynb"))
    if not paths:
        raise NotebookError(f"no notebooks found in {folder}")
    if only:
        wanted = [w.removesuffix(".ipynb") for w in only]
        unknown = [w for w in wanted if not any(p.stem.startswith(w) for p in paths)]
        if unknown:
            raise NotebookError(f"no notebook matches {unknown}; the notebooks are {', '.join(p.stem for p in paths)}")
        paths = [p for p in paths if any(p.stem.startswith(w) for w in wanted)]
    return paths


def writable_folder(out: Path) -> Path:
    """`out`, made if missing; a file or a folder this process cannot write is a NotebookError."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / ".writable").touch()
        (out / ".writable").unlink()
    except OSError as err:
        reason = "it is a file" if out.is_file() else err.strerror or type(err).__name__
        raise NotebookError(f"--out {out} cannot hold the reports: {reason}; give a writable folder") from None
    return out


def smoke_setting(flag: bool, given) -> bool:
    """Smoke mode from `--smoke` and `-p smoke=...` together: either one turns it on; they may not disagree."""
    if not isinstance(given, bool):
        raise NotebookError(f"-p smoke={json.dumps(given)}: expected true or false")
    if flag and not given:
        raise NotebookError("--smoke and -p smoke=false disagree; give one of them")
    return given


def kernel_name() -> str:
    """The registered `bcr-lab` kernel (this environment's Python), or a NotebookError saying how
    to register it."""
    from jupyter_client.kernelspec import KernelSpecManager

    if KERNEL not in KernelSpecManager().find_kernel_specs():
        raise NotebookError(
            f"the Jupyter kernel {KERNEL!r} is not registered; run `make setup`, or "
            f"`{sys.executable} -m ipykernel install --sys-prefix --name {KERNEL} --display-name 'BCR lab'`"
        )
    return KERNEL


def declared_parameters(path: Path) -> dict:
    """The names a notebook's `parameters` cell assigns, with their default values as written."""
    import papermill

    return papermill.inspect_notebook(str(path))


def failure_message(name: str, executed: Path, error) -> str:
    """`error` (papermill's) as one message naming the notebook and the cell of the source notebook."""
    import nbformat

    cells = nbformat.read(executed, as_version=4).cells
    added = ("injected-parameters", "papermill-error-cell-tag")  # cells papermill adds to the executed copy
    source = [c for c in cells if not set(c.metadata.get("tags", [])) & set(added)]
    failing = next((c for c in cells if c.get("execution_count") == error.exec_count and c.cell_type == "code"), None)
    index = next((i for i, c in enumerate(source) if c is failing), error.cell_index)
    total = len(source)
    # the cell's own line the exception came through (IPython marks it `---->`), else its first line
    marked = re.search(r"^-+> *(\d+) (.*)$", ANSI.sub("", "\n".join(error.traceback or [])), re.MULTILINE)
    where, text = (
        (f", line {marked.group(1)}", marked.group(2))
        if marked
        else ("", next((line for line in error.source.splitlines() if line.strip()), ""))
    )
    text = text.strip()
    if len(text) > 60:
        text = text[:57] + "..."
    evalue = ANSI.sub("", str(error.evalue)).strip()
    return (
        f"{name} failed at cell {index + 1} of {total}{where} (`{text}`):\n"
        f"    {error.ename}: {evalue}\n    executed copy with the full traceback: {executed}"
    )


WIDGET = "application/vnd.jupyter.widget-view+json"  # a live widget's output (a bar, a slider, a FigureWidget)
REMOTE_SCRIPT = re.compile(r"<script\b[^>]*\bsrc=[\"']?(?:https?:)?//[^>]*>\s*</script>", re.IGNORECASE)


def export_html(executed: Path, target: Path) -> Path:
    """An HTML report that opens with no network: plotly.js is inlined once by the notebooks'
    renderer; the scripts nbconvert and plotly would fetch from public CDNs (require.js, MathJax 2
    and 3) are left out, and so is saved widget state, whose renderer would come from a CDN too
    (every live figure of the lab has a static copy in the report), with the widgets' outputs: without
    their state a widget shows the text it was made with, which for a progress bar reads "0%"."""
    import nbformat
    from nbconvert import HTMLExporter

    notebook = nbformat.read(str(executed), as_version=4)
    notebook.metadata.pop("widgets", None)
    for cell in notebook.cells:
        if "outputs" in cell:
            cell.outputs = [o for o in cell.outputs if WIDGET not in o.get("data", {})]
    body, _ = HTMLExporter().from_notebook_node(notebook)
    write_text_whole(target, REMOTE_SCRIPT.sub("", body))
    return target


def remote_scripts(page: str) -> list[str]:
    """The script tags of an HTML page that load code from the network (for checks)."""
    return re.findall(r"<script\b[^>]*\bsrc=[\"']?(?:https?:)?//[^>]*>", page, flags=re.IGNORECASE)


@contextlib.contextmanager
def kernel_environment(**variables):
    """Environment variables the kernel inherits while it runs, restored afterwards."""
    saved = {k: os.environ.get(k) for k in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_notebook(
    path: Path, out: Path, parameters: dict | None = None, kernel: str | None = None, html: bool = True
) -> NotebookResult:
    """Execute one notebook with papermill (working directory: its own folder), write the executed
    copy and its HTML export to `out`, each taking its name once whole (an interrupted run leaves the
    earlier copy). A failing cell is reported in the result, not raised.

    Progress bars are switched off in the kernel where tqdm is left to its defaults (headless, nobody
    watches them); a bar whose code passes `disable` itself still runs, and the report leaves its
    widget out (`export_html`), or it would read "0%"."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    path, out = Path(path), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    executed = out / path.name
    declared = declared_parameters(path)
    injected = {k: v for k, v in (parameters or {}).items() if k in declared}
    started = time.perf_counter()
    failed, error = None, None
    explicit = ",".join(k for k in injected if k not in ("smoke", "results_dir"))
    with written_whole(executed) as partial, kernel_environment(TQDM_DISABLE="1", BCR_EXPLICIT_PARAMETERS=explicit):
        try:
            papermill.execute_notebook(
                str(path),
                str(partial),
                parameters=injected,
                kernel_name=kernel or kernel_name(),
                cwd=str(path.parent),
                progress_bar=False,
            )
        except PapermillExecutionError as err:  # the copy, traceback included, still takes its name
            failed = err
        except Exception as err:  # the kernel died or never started: no cell to name
            error = f"{path.name} could not be run: {type(err).__name__}: {ANSI.sub('', str(err)).strip()}"
    if failed is not None:
        error = failure_message(path.name, executed, failed)
    seconds = time.perf_counter() - started
    page = export_html(executed, out / f"{path.stem}.html") if html and executed.exists() else None
    return NotebookResult(path.stem, round(seconds, 1), str(executed), None if page is None else str(page), error)


def run_notebooks(
    out,
    smoke: bool = False,
    only=None,
    parameters: dict | None = None,
    results_dir=None,
    folder: Path = NOTEBOOK_DIR,
    log=None,
) -> list[NotebookResult]:
    """Execute the notebooks in order (all of them, or those named in `only`), each with `parameters`
    it declares, plus `smoke` and, in smoke mode, a results folder under `out` (unless
    `results_dir` is given). Writes `out/summary.json`; returns one result per notebook."""
    log = log or sys.stderr  # looked up per call: a stream bound at import may since have been replaced and closed
    out = writable_folder(Path(out).resolve())
    paths = notebook_paths(only, folder)
    parameters = dict(parameters or {})
    known = set().union(*(declared_parameters(p) for p in paths))
    unknown = sorted(set(parameters) - known)
    if unknown:
        raise NotebookError(f"no notebook declares parameter(s) {unknown}; they declare {', '.join(sorted(known))}")
    parameters["smoke"] = smoke = smoke_setting(smoke, parameters.get("smoke", smoke))
    if results_dir is not None or smoke:
        parameters["results_dir"] = str(Path(results_dir).resolve() if results_dir is not None else out / "runs")
    kernel = kernel_name()
    results = []
    for number, path in enumerate(paths, start=1):
        print(f"[{number}/{len(paths)}] {path.stem} ...", file=log, flush=True)
        result = run_notebook(path, out, parameters, kernel)
        print(
            f"[{number}/{len(paths)}] {path.stem}: {'ok' if result.ok else 'FAILED'} in {result.seconds:.1f} s",
            file=log,
            flush=True,
        )
        if not result.ok:
            print(result.error, file=log, flush=True)
        results.append(result)
    write_text_whole(out / "summary.json", json.dumps([asdict(r) for r in results], indent=2))
    return results
