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
import http.client
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bcr_core.errors import UsageError
from bcr_core.lab.display import APP
from bcr_core.paths import CHECKOUT, NOTEBOOKS, RESULTS

NOTEBOOK = NOTEBOOKS / "09_attention_explorer.ipynb"
SAVED = RESULTS / "explorer"  # the committed saved inspection
FRESH = CHECKOUT / "runs"  # where inspections served by the app are saved (FRESH/explorer)
TEMPLATES = Path(__file__).parent / "voila"  # on JUPYTER_PATH: voila/templates/bcr, the offline lab template
# plotly's JupyterLab renderer fails in Voila's older frontend ("setData is not a function"); without
# it the static copy of the figure shows through its HTML output instead
DENIED_EXTENSIONS = ["jupyterlab-plotly"]
CULL_IDLE_S = 600  # a kernel no page has been connected to for this long is shut down (a page that vanished)
CULL_EVERY_S = 60


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


HOST = "127.0.0.1"  # where Voila listens by default, and the URL printed: "localhost" may resolve to [::1] first
EVERYWHERE = {"0.0.0.0": "127.0.0.1", "::": "::1"}  # wildcard addresses, and where this machine reaches them
WARNING = "warning: anyone who can reach {url} can use the app; serve it only on a network you trust"


LOOPBACKS = ((socket.AF_INET, HOST), (socket.AF_INET6, "::1"))


def bindable(family: int, address: str, port: int) -> bool:
    """Nothing holds `address`:`port` (an address this machine lacks, [::1] without IPv6, holds nothing)."""
    try:
        s = socket.socket(family)
    except OSError:  # no IPv6 on this machine
        return True
    with s:
        try:
            s.bind((address, port))
        except OSError as err:
            return err.errno == errno.EADDRNOTAVAIL
    return True


def port_free(port: int) -> bool:
    """Nothing holds `port` on either loopback (a browser given "localhost" may try [::1] first)."""
    return all(bindable(family, address, port) for family, address in LOOPBACKS)


def free_port() -> int:
    """A localhost port nobody listens on now, on either loopback."""
    while True:
        with socket.socket() as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        if port_free(port):
            return port


def holder(port: int) -> str:
    """Who listens on `port`, as a user can act on it: another explorer, a process by pid and command, or
    "another process" (one of another user, or a machine that does not say)."""
    import psutil

    try:
        listening = [c for c in psutil.net_connections("inet") if c.status == psutil.CONN_LISTEN and c.pid]
        pids = {c.pid for c in listening if c.laddr and c.laddr.port == port}
    except (psutil.AccessDenied, OSError):
        pids = set()
    for pid in sorted(pids):
        try:
            process = psutil.Process(pid)
            command = process.cmdline()
            if "bcr_core.explorer_server" in command:  # an explorer's server: name the explorer that started it
                process, command = process.parent(), process.parent().cmdline()
            if "explore" in command and any(Path(c).name in ("bcr", "bcr_core") for c in command[:3]):
                return f"another bcr explore (pid {process.pid})"
            shown = " ".join([Path(command[0]).name, *command[1:]]) if command else process.name()
            return f"pid {process.pid} ({shown[:60]})"
        except (psutil.NoSuchProcess, psutil.AccessDenied, AttributeError):
            continue
    return "another process"


def in_use(port: int, where: str) -> UsageError:
    return UsageError(f"port {port} on {where} is in use by {holder(port)}; pick another with --port")


def claim_port(port: int, host: str = HOST) -> socket.socket:
    """A socket bound to `host`:`port` and listening, for the server to take over: the kernel gives a port
    to one bind only, so of two explorers started at once on one port exactly one gets it. A one-line
    error naming what holds the port otherwise."""
    if not 1 <= port <= 65535:
        raise UsageError(f"--port must be in 1-65535, got {port}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as err:
        raise UsageError(f"--host {host!r} is not an address or a name this machine can resolve ({err})") from None
    family, _, _, _, address = infos[0]
    s = socket.socket(family)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Tornado does: a closed server's TIME_WAIT
        if family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.bind(address)
        s.listen(128)
        if host == HOST and not bindable(socket.AF_INET6, "::1", port):  # free on 127.0.0.1, held on [::1]
            raise in_use(port, "localhost ([::1])")
    except OSError as err:
        s.close()
        if err.errno == errno.EADDRINUSE:
            raise in_use(port, "localhost (127.0.0.1)" if host == HOST else host) from None
        raise UsageError(
            f"cannot listen on {host} port {port}: not an address of this machine ({err.strerror}); pick another --host"
        ) from None
    except BaseException:
        s.close()
        raise
    return s


def check_port(port: int, host: str = HOST) -> None:
    """`claim_port` without keeping the port: what `bcr explore --check` says."""
    claim_port(port, host).close()


def check_participants(participants: int | None) -> None:
    if participants is not None and participants < 1:
        raise UsageError(f"--participants must be at least 1, got {participants}")


def reachable(host: str) -> str:
    """The address this machine itself connects to, to reach a server listening on `host`."""
    return EVERYWHERE.get(host, host)


def public_address(host: str) -> str:
    """The address participants type for a server listening on `host`: for a wildcard, this machine's
    address on its default route (no packet is sent), else `host` itself."""
    if host not in EVERYWHERE:
        return host
    family, probe = (socket.AF_INET6, "2001:db8::1") if ":" in host else (socket.AF_INET, "192.0.2.1")
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((probe, 9))  # a UDP connect only picks the route
            return s.getsockname()[0]
    except OSError:  # no route: this machine alone
        return EVERYWHERE[host]


def url_of(host: str, port: int) -> str:
    address = public_address(host)
    return f"http://[{address}]:{port}/" if ":" in address else f"http://{address}:{port}/"


def max_kernels(participants: int | None, given: int | None) -> int:
    """The room's cap on kernels at once (0: none): as given, else twice the preheated pool."""
    if given is not None and given < 1:
        raise UsageError(f"--max-kernels must be at least 1, got {given}")
    if given is not None and participants and given < participants:
        raise UsageError(
            f"--max-kernels {given} is below --participants {participants}: the pool alone needs that many"
        )
    return given if given is not None else 2 * (participants or 0)


def voila_command(
    notebook: Path,
    port: int,
    host: str = HOST,
    participants: int | None = None,
    listen_fd: int = -1,
    cap: int = 0,
) -> list[str]:
    """The explorer's Voila server (`bcr_core.explorer_server`) serving one notebook on `host`, on the socket
    `listen_fd` when given: sources hidden, tracebacks shown (a lab, not a product). With `participants`,
    Voila's preheated kernel pool: that many kernels run the notebook before anyone asks, and each page
    takes one whose figure is already drawn (a taken one is not replaced). `cap` kernels at once at most
    (0: no cap); a kernel no page is connected to is culled after CULL_IDLE_S."""
    command = [
        sys.executable,
        "-m",
        "bcr_core.explorer_server",
        str(notebook),
        "--no-browser",
        f"--port={port}",
        f"--Voila.ip={host}",
        "--Voila.port_retries=0",
        f"--RoomVoila.listen_fd={listen_fd}",
        f"--RoomVoila.max_kernels={cap}",
        f"--RoomVoila.ready_path={READY}",
        f"--MappingKernelManager.cull_idle_timeout={CULL_IDLE_S}",
        f"--MappingKernelManager.cull_interval={CULL_EVERY_S}",
        "--MappingKernelManager.cull_connected=False",
        "--VoilaConfiguration.strip_sources=True",
        "--VoilaConfiguration.show_tracebacks=True",
        "--template=bcr",
        *(f"--VoilaConfiguration.extension_denylist={name}" for name in DENIED_EXTENSIONS),
    ]
    if participants:
        command += [
            "--VoilaConfiguration.preheat_kernel=True",
            f"--VoilaConfiguration.default_pool_size={participants}",
        ]
    return command


def voila_environment(explicit: tuple[str, ...] = (), preload: bool = False) -> dict:
    """This environment, with the lab's Voila template on JUPYTER_PATH, telling the notebook it is the app,
    which parameters the user set (so its smoke settings leave them alone) and, with `preload`, to load
    the model for live decoding as soon as the explorer is drawn (a preheated kernel's)."""
    from bcr_core.lab.live import PRELOAD
    from bcr_core.lab.params import EXPLICIT

    paths = [str(TEMPLATES.parent), *filter(None, os.environ.get("JUPYTER_PATH", "").split(os.pathsep))]
    values = {"JUPYTER_PATH": os.pathsep.join(paths), APP: "1", EXPLICIT: ",".join(explicit), PRELOAD: ""}
    return os.environ | values | ({PRELOAD: "1"} if preload else {})


READY = "/voila/bcr-ready"  # the explorer's server answers it at once (bcr_core.explorer_server.Ready)


def wait_listening(port: int, process: subprocess.Popen, timeout: float = 120.0, host: str = HOST) -> None:
    """Return once the server on `host`:`port` answers HTTP (a path that starts no kernel); raise
    if `process` exits first or time runs out. Connecting is not enough: the socket listens, and queues
    connections, from before the server starts."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerError(
                f"voila did not start: the server exited with code {process.returncode} before serving on port {port}"
            )
        connection = http.client.HTTPConnection(reachable(host), port, timeout=10)  # one request waits in the queue
        try:
            connection.request("GET", READY)
            connection.getresponse()  # any answer: also another server's, though one on our socket is ours
            return
        except OSError:
            time.sleep(0.2)
        finally:
            connection.close()
    raise ServerError(f"voila did not start: nothing answers on port {port} after {timeout:.0f} s")


def start(
    notebook: Path,
    port: int,
    log=None,
    explicit: tuple[str, ...] = (),
    host: str = HOST,
    participants: int | None = None,
    claimed: socket.socket | None = None,
    cap: int | None = None,
) -> subprocess.Popen:
    """The explorer's server serving `notebook` on `host`:`port` (with `participants` kernels preheated, at
    most `cap` kernels at once), running once it answers (stop it with `stop`). It serves on `claimed`,
    the port's socket already bound, else binds it here."""
    try:
        import voila  # noqa: F401
    except ImportError:
        raise UsageError(
            f"voila is not installed in this environment; `{sys.executable} -m pip install voila`"
        ) from None
    cap = max_kernels(participants, None) if cap is None else cap
    listening = claimed or claim_port(port, host)
    with listening:  # the server holds its own copy; this one goes once it is handed over
        process = subprocess.Popen(
            voila_command(notebook, port, host, participants, listening.fileno(), cap),
            stdout=log,
            stderr=subprocess.STDOUT if log else None,
            env=voila_environment(explicit, preload=bool(participants)),
            pass_fds=(listening.fileno(),),
        )
    try:
        wait_listening(port, process, host=host)
    except BaseException:  # it never served, or the wait was interrupted: no server is left behind
        stop(process)
        raise
    return process


SERVER_STOP_S = 15  # a server still running this long after SIGTERM is killed
STOP_WITHIN_S = 60  # `bcr explore` still running this long after Ctrl-C says where it hangs and exits (status 1)


def stop(process: subprocess.Popen) -> None:
    """Stop a server started here (its kernels are its children and end with it)."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=SERVER_STOP_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
