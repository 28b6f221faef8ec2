"""`bcr explore`: the port claimed, notebook 09 prepared with its parameters (a saved inspection found, or the
model run first), the Voila server started, what serves where printed, and the server waited on and stopped."""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bcr_core.lab import app


@dataclass(frozen=True)
class Room:
    """Where and for whom the explorer serves: `bcr explore`'s flags."""

    port: int
    host: str = app.HOST
    participants: int | None = None
    max_kernels: int | None = None
    results: Path = app.SAVED


def what_serves(prepared: app.Prepared, room: Room, cap: int) -> str:
    """One line: the inspection the page reads (or the requests the model serves first), and the room's kernels."""
    source = (
        f"reads {prepared.saved}"
        if prepared.saved
        else f"no saved inspection matches: serves {prepared.parameters['n']} requests with the model first "
        f"(minutes), then saves them to {app.FRESH / 'explorer'}"
    )
    if room.participants:
        source += f"; {room.participants} kernels preheated with the model loaded"
    if cap:
        source += f"; at most {cap} kernels at once, then a page says the room is full"
    return source


def serve(parameters: dict, room: Room, check: bool = False, as_json: bool = False) -> int:
    """Serve notebook 09 until Ctrl-C (or, with `check`, say what would serve and stop); the exit code."""
    app.check_participants(room.participants)
    cap = app.max_kernels(room.participants, room.max_kernels)
    with app.claim_port(room.port, room.host) as claimed, tempfile.TemporaryDirectory(prefix="bcr-explore-") as folder:
        prepared = app.explorer_notebook(parameters, Path(folder), results=room.results)
        url = app.url_of(room.host, room.port)
        source = what_serves(prepared, room, cap)
        said = {
            "url": url,
            "saved": str(prepared.saved or ""),
            "participants": room.participants or 0,
            "max_kernels": cap,
        }
        if check:
            print(json.dumps(said) if as_json else f"ok: {source}")
            return 0
        server = app.start(
            prepared.notebook,
            room.port,
            explicit=prepared.explicit,
            host=room.host,
            participants=room.participants,
            claimed=claimed,
            cap=cap,
        )
        print(json.dumps(said) if as_json else f"explorer: {url}\n{source}", flush=True)
        if room.host != app.HOST:
            print(app.WARNING.format(url=url), file=sys.stderr, flush=True)
        print("Ctrl-C stops it.", file=sys.stderr, flush=True)
        code = wait(server)
    if code:  # it stopped by itself: the URL printed no longer serves, and the exit code must not say success
        how = f"was killed by signal {-code}" if code < 0 else f"stopped with code {code}"
        raise app.ServerError(f"the explorer's server {how}; its log is above")
    return 0


def wait(server) -> int:
    """The server's exit code, or 0 after Ctrl-C (which stops it, bounded by `stop_within`)."""
    try:
        return server.wait()
    except KeyboardInterrupt:
        stop_within(app.STOP_WITHIN_S)
        return 0
    finally:
        app.stop(server)


def stop_within(seconds: float) -> None:
    """After Ctrl-C, a bound on the rest: a process still here `seconds` later prints where every thread
    is (`faulthandler`) and exits with status 1, whatever its server or kernels are doing."""
    import faulthandler

    faulthandler.dump_traceback_later(seconds, exit=True)
