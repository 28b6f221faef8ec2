"""`bcr explore`: notebook 09 (the attention explorer) served as a web app with Voila, code hidden
and widgets live.

`explorer_notebook` checks the parameters and writes a copy of notebook 09 with them injected (and
absolute result folders, since the copy runs elsewhere); `start` serves it with Voila on localhost
and returns once the app answers. With the settings of a saved inspection (by default the committed
one in `results/explorer/`) the app reads it and shows its first figure in seconds; with others it
serves the requests with the model first, then saves them for next time.
"""

from __future__ import annotations

import ast
import contextlib
import errno
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bcr_core.errors import UsageError
from bcr_core.lab.notebooks import APP
from bcr_core.paths import CHECKOUT, NOTEBOOKS, RESULTS

NOTEBOOK = NOTEBOOKS / "09_attention_explorer.ipynb"
SAVED = RESULTS / "explorer"  # the committed saved inspection
FRESH = CHECKOUT / "runs"  # where inspections served by the app are saved (FRESH/explorer)
TEMPLATES = Path(__file__).parent / "voila"  # on JUPYTER_PATH: voila/templates/bcr, the offline lab template
# plotly's JupyterLab renderer fails in Voila's older frontend ("setData is not a function"); without
# it the static copy of the figure shows through its HTML output instead
DENIED_EXTENSIONS = ["jupyterlab-plotly"]


class ServerError(UsageError):
    """The explorer's server did not come up (a port in use, a broken voila install): the user can fix it."""


@dataclass
class Prepared:
    notebook: Path  # the parameterised copy Voila serves
    parameters: dict  # every parameter of notebook 09, checked
    saved: Path | None  # the saved inspection it will read, or None: it serves the requests first
    explicit: tuple[str, ...] = ()  # the parameters the user set, which smoke settings leave alone


def explorer_notebook(parameters: dict, folder: Path, results: Path = SAVED, results_dir: Path = FRESH) -> Prepared:
    """A copy of notebook 09 in `folder` with `parameters` injected, after checking their names and
    values (a ValueError naming the first bad one)."""
    import nbformat
    import papermill
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    from bcr_core.lab import inspection, params, saved_inspection

    declared = papermill.inspect_notebook(str(NOTEBOOK))
    folders = {"results", "results_dir"}  # set by the app, absolute
    unknown = sorted(k for k in parameters if k not in declared or k in folders)
    if unknown:
        raise UsageError(
            f"notebook 09 has no parameter {unknown[0]!r} to set (results folders are --results); "
            f"its parameters: {', '.join(k for k in declared if k not in folders)}"
        )
    results = Path(results).resolve()
    if not results.is_dir():
        raise UsageError(f"--results {results} is not a folder")
    defaults = {k: ast.literal_eval(v["default"]) for k, v in declared.items()}  # the parameters cell's literals
    values = defaults | parameters | {"results": str(results), "results_dir": str(Path(results_dir).resolve())}
    explicit = tuple(sorted(parameters))
    try:
        with explicit_parameters(explicit):
            checked = params.check(**values).smoke()  # what the notebook will use
        checked = checked.at_least("n", inspection.MIN_REQUESTS, inspection.WHY_MIN_REQUESTS).as_dict()
    except params.ParameterError as err:
        raise UsageError(str(err)) from None
    notebook = parameterize_notebook(load_notebook_node(str(NOTEBOOK)), values)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / NOTEBOOK.name
    nbformat.write(notebook, target)
    saved = saved_inspection.find(checked, [results, Path(results_dir) / "explorer"])
    return Prepared(target, checked, saved, explicit)


@contextlib.contextmanager
def explicit_parameters(names: tuple[str, ...]):
    """Tell `Params.smoke`, here, which parameters the user set (it leaves those alone)."""
    from bcr_core.lab.params import EXPLICIT

    before = os.environ.get(EXPLICIT)
    os.environ[EXPLICIT] = ",".join(names)
    try:
        yield
    finally:
        if before is None:
            del os.environ[EXPLICIT]
        else:
            os.environ[EXPLICIT] = before


HOST = "127.0.0.1"  # where Voila listens, and the URL printed: "localhost" may resolve to [::1] first


def port_free(port: int) -> bool:
    """Nothing holds `port` on either loopback (a browser given "localhost" may try [::1] first)."""
    for family, address in ((socket.AF_INET, HOST), (socket.AF_INET6, "::1")):
        try:
            s = socket.socket(family)
        except OSError:  # no IPv6 on this machine: nothing can hold [::1]
            continue
        with s:
            try:
                s.bind((address, port))
            except OSError as err:
                if family == socket.AF_INET6 and err.errno == errno.EADDRNOTAVAIL:
                    continue  # no ::1 configured
                return False
    return True


def free_port() -> int:
    """A localhost port nobody listens on now, on either loopback."""
    while True:
        with socket.socket() as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        if port_free(port):
            return port


def check_port(port: int) -> None:
    if not 1 <= port <= 65535:
        raise UsageError(f"--port must be in 1-65535, got {port}")
    if not port_free(port):
        raise UsageError(f"port {port} on localhost (127.0.0.1 or [::1]) is in use; pick another with --port")


def voila_command(notebook: Path, port: int) -> list[str]:
    """Voila serving one notebook on localhost: sources hidden, tracebacks shown (a lab, not a product)."""
    return [
        sys.executable,
        "-m",
        "voila",
        str(notebook),
        "--no-browser",
        f"--port={port}",
        f"--Voila.ip={HOST}",
        "--Voila.port_retries=0",
        "--VoilaConfiguration.strip_sources=True",
        "--VoilaConfiguration.show_tracebacks=True",
        "--template=bcr",
        f"--VoilaConfiguration.extension_denylist={DENIED_EXTENSIONS!r}",
    ]


def voila_environment(explicit: tuple[str, ...] = ()) -> dict:
    """This environment, with the lab's Voila template on JUPYTER_PATH, telling the notebook it is the app
    and which parameters the user set (so its smoke settings leave them alone)."""
    from bcr_core.lab.params import EXPLICIT

    paths = [str(TEMPLATES.parent), *filter(None, os.environ.get("JUPYTER_PATH", "").split(os.pathsep))]
    return os.environ | {"JUPYTER_PATH": os.pathsep.join(paths), APP: "1", EXPLICIT: ",".join(explicit)}


def wait_listening(port: int, process: subprocess.Popen, timeout: float = 120.0) -> None:
    """Return once something listens on `port`; raise if `process` exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerError(
                f"voila did not start: the server exited with code {process.returncode} before listening on port {port}"
            )
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=1):
            return
        time.sleep(0.2)
    raise ServerError(f"voila did not start: nothing listens on port {port} after {timeout:.0f} s")


def start(notebook: Path, port: int, log=None, explicit: tuple[str, ...] = ()) -> subprocess.Popen:
    """Voila serving `notebook` on localhost:`port`, running once it listens (stop it with `stop`)."""
    try:
        import voila  # noqa: F401
    except ImportError:
        raise UsageError(
            f"voila is not installed in this environment; `{sys.executable} -m pip install voila`"
        ) from None
    process = subprocess.Popen(
        voila_command(notebook, port),
        stdout=log,
        stderr=subprocess.STDOUT if log else None,
        env=voila_environment(explicit),
    )
    try:
        wait_listening(port, process)
    except BaseException:  # it never listened, or the wait was interrupted: no server is left behind
        stop(process)
        raise
    return process


def stop(process: subprocess.Popen) -> None:
    """Stop a server started here (its kernels are its children and end with it)."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
