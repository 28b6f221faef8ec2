"""Saved inspections and `bcr explore`: an inspection saved and loaded back gives the explorer the same
views; the committed one matches notebook 09's defaults; bad arguments are one-line errors."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import types
import urllib.request
from pathlib import Path

import pytest
import torch

from bcr_core import lab
from bcr_core.cli import main
from bcr_core.errors import UsageError
from bcr_core.lab import app
from bcr_core.lab import saved_inspection as saved
from bcr_core.paths import CHECKOUT
from bcr_core.repair.layouts import LayoutConfig

SETTINGS = dict(
    model="tiny", benchmark="synthetic", item_seed=34, agents=2, n=4, max_new_tokens=4, gamma=1.0, layout="single"
) | dict(rho=0.2, chunk=8)


@pytest.fixture(scope="module")
def served(tiny_chat):
    items = lab.Comparison(benchmark="synthetic", agents=2, n=4, max_new_tokens=4, item_seed=34).items()
    return lab.inspect_requests(tiny_chat, "synthetic", items, 2, "bcr-single@0.2:gamma=1,skip=off", 4, progress=False)


def test_a_saved_inspection_loads_back_to_identical_views(served, tiny_chat, tmp_path):
    path = saved.save(served, tmp_path, SETTINGS, tiny_chat)
    assert saved.find(SETTINGS, [tmp_path / "elsewhere", tmp_path]) == path
    back = saved.load(path, SETTINGS)
    assert back.parameters == {k: SETTINGS[k] for k in saved.KEYS} and back.condition == served.condition
    assert len(back.views) == len(served.views) > 0
    config = LayoutConfig(chunk=8, skip="off")
    for a, b in zip(served.views, back.views):
        assert (a.index, a.item_id, a.node, a.tokens, a.segments, a.dense_text) == (
            b.index,
            b.item_id,
            b.node,
            b.tokens,
            b.segments,
            b.dense_text,
        )
        assert b.attention.dtype == torch.float32 and torch.equal(a.attention, b.attention)
        assert a.record.to_dict() == b.record.to_dict() and b.kv is None  # the cache is not saved
        for layout_name, rho, layer, head in [
            ("single", 0.2, None, None),
            ("chunk", 0.5, None, None),
            ("grow", 0.3, 1, 0),
        ]:
            assert a.select(layout_name, rho, config, layer, head) == b.select(layout_name, rho, config, layer, head)
        # answers decoded before saving come back; others cannot be decoded without the cache
        unrepaired = a.answer_with(tiny_chat, [], 4)
        assert b.answer_with(tiny_chat, [], 4) == unrepaired
        assert b.answer_with(tiny_chat, a.select("single", 0.2, LayoutConfig(chunk=8)), 4) is not None
        assert b.answer_with(tiny_chat, [0, 1, 2], 3) is None
    assert back.calls_frame().equals(served.calls_frame())


def test_a_saved_inspection_with_other_settings_or_a_bad_file_is_refused(served, tmp_path):
    path = saved.save(served, tmp_path, SETTINGS)
    with pytest.raises(UsageError, match=r"was saved with rho=0.2, not 0.3"):
        saved.load(path, SETTINGS | {"rho": 0.3})
    assert saved.find(SETTINGS | {"n": 5}, [tmp_path]) is None
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises(UsageError, match="is not a saved inspection"):
        saved.load(tmp_path / "junk.pt")
    with pytest.raises(UsageError, match="settings need"):
        saved.file_name({"n": 3})


def test_the_explorer_runs_on_a_loaded_inspection_without_a_model(served, tmp_path):
    back = saved.load(saved.save(served, tmp_path, SETTINGS))
    explorer = lab.Explorer(None, back, served.condition, 4, "single", 0.2, 8)
    drawn = explorer.update(layout="chunk", rho=0.5)
    assert lab.highlighted_rows(explorer.figure) == drawn.selected
    assert not explorer.decode_w.value and "not decoded" not in explorer.answers_w.value  # unticked: held answers
    explorer.update(decode=True)
    assert "not decoded" in explorer.answers_w.value  # no model, no cache: said, not raised
    # a view drawn later (Voila, a reloaded page) starts from the widget's synced state: the latest
    assert [int(x) for x in explorer.figure._widget_data[2]["x"]] == drawn.selected
    assert f"{drawn.count} selected" in explorer.figure._widget_layout["title"]["text"]


def test_the_committed_inspection_is_small_and_matches_notebook_09(tmp_path):
    prepared = app.explorer_notebook({}, tmp_path)
    assert prepared.saved is not None and prepared.saved.parent == app.SAVED
    assert prepared.saved.stat().st_size < 4_000_000
    inspection = saved.load(prepared.saved, prepared.parameters)
    assert inspection.views and all(v.kv is None for v in inspection.views)
    # every view can show its unrepaired answer and the one at the saved setting without a model
    p = prepared.parameters
    for v in inspection.views:
        assert v.answer_with(None, [], p["max_new_tokens"]) is not None
        rows = v.select(p["layout"], p["rho"], LayoutConfig(chunk=p["chunk"]))
        assert v.answer_with(None, rows, p["max_new_tokens"]) is not None


HUMANEVAL = dict(model="qwen2.5-coder-0.5b", benchmark="humaneval", dtype="bfloat16", n=3, max_new_tokens=64)


def test_the_committed_humaneval_inspection_is_chosen_by_its_parameters_and_marks_the_seams(tmp_path, capsys):
    """The Qwen coder's HumanEval calls, committed beside the default: `-p` with its settings opens it without
    the model; on every call the explorer marks the seams where the reuse path's ids part from Dense's, and
    they are the two the tokenizer makes of the task: after "Task" and after the docstring, the reuse path has
    two tokens (a colon or the closing quotes with one newline, then a blank line) where the chat template's
    ids have one."""
    from bcr_core.lab.explorer import seam_rows

    args = [a for k, v in HUMANEVAL.items() for a in ("-p", f"{k}={v}")]
    assert main(["explore", "--check", "--port", str(app.free_port()), *args]) == 0
    assert capsys.readouterr().out.startswith(f"ok: reads {app.SAVED}/humaneval-")
    prepared = app.explorer_notebook(HUMANEVAL, tmp_path)
    assert prepared.saved.stat().st_size < 4_000_000
    inspection = saved.load(prepared.saved, prepared.parameters)
    assert {v.node for v in inspection.views} == {"agent_1", "agent_2", "agent_3", "final"}
    for v in inspection.views:
        seams = [v.tokens[start:stop] for start, stop in seam_rows(v)]
        assert seams == [[":Ċ", "ĊĊ"], ['Ġ"""Ċ', "ĊĊ"]], (v.node, seams)
        assert len(v.record.merged_ids) > len(v.record.dense_ids)  # the reuse path's split is the longer


def test_explore_check_says_what_it_reads(capsys):
    assert main(["explore", "--check", "--port", str(app.free_port())]) == 0
    assert capsys.readouterr().out.startswith(f"ok: reads {app.SAVED}")
    assert main(["explore", "--check", "--port", str(app.free_port()), "-p", "n=4"]) == 0
    assert "no saved inspection matches: serves 4 requests with the model first" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (["-p", "n=two"], "parameter 'n': expected int >= 1, got str 'two'"),
        (["-p", "rho=1.5"], "parameter 'rho': expected float"),
        (["-p", "layers=3"], "notebook 09 has no parameter 'layers' to set"),
        (["-p", "results=/tmp"], "notebook 09 has no parameter 'results' to set (results folders are --results)"),
        (["-p", "n"], "-p takes NAME=VALUE, got 'n'"),
        (["--port", "70000"], "--port must be in 1-65535, got 70000"),
        (["--results", "/nonexistent/folder"], "--results /nonexistent/folder is not a folder"),
        (["-p", "n=2"], "parameter 'n': got 2, but KVComm serves no call from an assembled cache until two earlier"),
    ],
)
def test_explore_bad_arguments_are_one_line_errors(args, message, capsys):
    assert main(["explore", "--check", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bcr explore: error: ") and message in err, err


def test_explore_keeps_an_explicit_parameter_over_the_smoke_settings(capsys):
    """`-p smoke=true -p n=5`: smoke mode's n = 4 must not replace the n the user set."""
    assert main(["explore", "--check", "--port", str(app.free_port()), "-p", "smoke=true", "-p", "n=5"]) == 0
    assert "serves 5 requests with the model first" in capsys.readouterr().out
    assert app.voila_environment(("n", "smoke"))["BCR_EXPLICIT_PARAMETERS"] == "n,smoke"  # and so does the app


def test_explore_refuses_a_truncated_saved_inspection(tmp_path, capsys):
    saved = app.explorer_notebook({}, tmp_path).saved  # the inspection the defaults read
    (tmp_path / saved.name).write_bytes(saved.read_bytes()[: saved.stat().st_size // 2])
    assert main(["explore", "--check", "--port", str(app.free_port()), "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is truncated or damaged" in err and saved.name in err, err


def test_explore_sees_a_port_held_on_the_ipv6_loopback(capsys):
    try:
        busy = socket.socket(socket.AF_INET6)
        busy.bind(("::1", 0))
    except OSError:
        pytest.skip("this machine has no IPv6 loopback")
    with busy:
        busy.listen()
        port = busy.getsockname()[1]
        assert not app.port_free(port)
        assert main(["explore", "--check", "--port", str(port)]) == 2
    assert f"port {port} on localhost ([::1]) is in use by pid {os.getpid()} (" in capsys.readouterr().err
    assert main(["explore", "--check", "--json", "--port", str(app.free_port())]) == 0
    assert json.loads(capsys.readouterr().out)["url"].startswith("http://127.0.0.1:")  # where Voila listens


def test_explore_on_a_busy_port_is_a_one_line_error_naming_what_holds_it(capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["explore", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"port {port} on localhost (127.0.0.1) is in use by pid {os.getpid()} (" in err, err
    assert err.endswith("; pick another with --port\n")


def explorer(port: int, folder: Path, name: str) -> tuple[subprocess.Popen, Path, Path]:
    """`bcr explore` on `port` as a user starts it, on this checkout's code: the process, its stdout and stderr."""
    out, err = folder / f"{name}.out", folder / f"{name}.err"
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(CHECKOUT), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "bcr_core", "explore", "--port", str(port)]
    with open(out, "w") as o, open(err, "w") as e:
        started = subprocess.Popen(
            command, stdout=o, stderr=e, env=env, start_new_session=True, preexec_fn=interruptible
        )
        return started, out, err


def interruptible() -> None:
    """Ctrl-C reaches the child as it reaches a user's: a suite started in the background of a shell runs
    with SIGINT ignored, which its children inherit, and Python installs no KeyboardInterrupt handler then."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop(process: subprocess.Popen) -> None:
    """Ctrl-C, as a user stops it. With the rest of the suite on 2 cores, the server whose page had
    just started a kernel twice took over a minute to exit (15 s alone); one still running after
    three is killed with its group (its kernels too), and the caller's check of its exit status fails."""
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def page_answers(url: str) -> str:
    """The first bytes of the explorer's page at `url` (the request starts a kernel: the server is stopped after)."""
    with urllib.request.urlopen(url, timeout=120) as response:
        assert response.status == 200
        return response.read(4000).decode(errors="replace")


def test_two_explorers_started_together_on_one_port_one_serves_the_other_says_who_holds_it(tmp_path):
    pytest.importorskip("voila")
    port = app.free_port()
    started = [explorer(port, tmp_path, name) for name in ("a", "b")]  # in the same instant
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not any(
            p.poll() is not None and out.read_text() == "" for p, out, _ in started
        ):
            time.sleep(0.2)
        losers = [s for s in started if s[0].poll() is not None]
        winners = [s for s in started if s[0].poll() is None]
        assert len(losers) == 1 and len(winners) == 1, [(p.poll(), err.read_text()[-500:]) for p, _, err in started]
        (loser, loser_out, loser_err), (winner, winner_out, _) = losers[0], winners[0]
        assert loser.returncode == 2 and loser_out.read_text() == ""  # no URL from the one that does not serve
        said = loser_err.read_text()
        assert said.count("\n") == 1, said
        assert said == (
            f"bcr explore: error: port {port} on localhost (127.0.0.1) is in use by another bcr explore "
            f"(pid {winner.pid}); pick another with --port\n"
        )
        while time.monotonic() < deadline and winner.poll() is None and "explorer: " not in winner_out.read_text():
            time.sleep(0.2)
        url = f"http://127.0.0.1:{port}/"
        assert winner_out.read_text().startswith(f"explorer: {url}\n")
        assert "<title>09_attention_explorer</title>" in page_answers(url)
        assert winner.poll() is None
    finally:
        for p, _, _ in started:
            if p.poll() is None:
                stop(p)
    winner_err = next(err for p, _, err in started if p is winner)
    assert winner.returncode == 0, winner_err.read_text()[-3000:]  # past app.STOP_WITHIN_S: where it hung


@pytest.mark.parametrize(
    "args, message",
    [
        (["--host", "999.1.2.3"], "--host '999.1.2.3' is not an address or a name this machine can resolve"),
        (["--host", "192.0.2.55"], "cannot listen on 192.0.2.55 port"),  # a documentation address: nobody's
        (["--participants", "0"], "--participants must be at least 1, got 0"),
        (["--participants", "-3"], "--participants must be at least 1, got -3"),
    ],
)
def test_explore_bad_host_or_participants_are_one_line_errors(args, message, capsys):
    assert main(["explore", "--check", "--port", str(app.free_port()), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bcr explore: error: ") and message in err, err


def test_explore_for_a_room_says_the_address_participants_type(capsys):
    port = app.free_port()
    assert main(["explore", "--check", "--json", "--host", "0.0.0.0", "--port", str(port), "--participants", "4"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["participants"] == 4 and said["url"].endswith(f":{port}/")
    assert not said["url"].startswith("http://0.0.0.0")  # nobody can type the wildcard
    assert app.url_of("::1", 8866) == "http://[::1]:8866/" and app.url_of("10.1.2.3", 80) == "http://10.1.2.3:80/"
    assert app.reachable("0.0.0.0") == "127.0.0.1" and app.reachable("10.1.2.3") == "10.1.2.3"
    warning = app.WARNING.format(url=app.url_of("10.1.2.3", 80))
    assert "anyone who can reach http://10.1.2.3:80/ can use the app" in warning and "\n" not in warning


def test_participants_preheat_that_many_kernels_with_the_model_loading_and_cap_the_room():
    from bcr_core.lab.live import PRELOAD

    plain = app.voila_command(app.NOTEBOOK, 8866)
    assert "--Voila.ip=127.0.0.1" in plain and not [a for a in plain if "preheat" in a or "pool_size" in a]
    assert "--RoomVoila.max_kernels=0" in plain and "--MappingKernelManager.cull_connected=False" in plain
    room = app.voila_command(app.NOTEBOOK, 8866, "0.0.0.0", participants=8, listen_fd=5, cap=16)
    assert "--Voila.ip=0.0.0.0" in room and "--RoomVoila.listen_fd=5" in room and "--RoomVoila.max_kernels=16" in room
    assert {"--VoilaConfiguration.preheat_kernel=True", "--VoilaConfiguration.default_pool_size=8"} <= set(room)
    assert not [a for a in room if "fill_delay" in a]  # the room keeps its pool from refilling, not a delay
    assert app.voila_environment(preload=True)[PRELOAD] == "1" and app.voila_environment()[PRELOAD] == ""
    assert app.max_kernels(None, None) == 0 and app.max_kernels(4, None) == 8 and app.max_kernels(4, 5) == 5


@pytest.mark.parametrize(
    "args, message",
    [
        (["--max-kernels", "0"], "--max-kernels must be at least 1, got 0"),
        (["--participants", "4", "--max-kernels", "3"], "--max-kernels 3 is below --participants 4"),
    ],
)
def test_explore_bad_max_kernels_is_a_one_line_error(args, message, capsys):
    assert main(["explore", "--check", "--port", str(app.free_port()), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bcr explore: error: ") and message in err, err


def test_explore_check_says_the_rooms_cap(capsys):
    assert main(["explore", "--check", "--json", "--port", str(app.free_port()), "--participants", "3"]) == 0
    assert json.loads(capsys.readouterr().out)["max_kernels"] == 6
    assert (
        main(["explore", "--check", "--port", str(app.free_port()), "--participants", "3", "--max-kernels", "4"]) == 0
    )
    assert "at most 4 kernels at once, then a page says the room is full" in capsys.readouterr().out


class PooledManager:
    """A stand-in for Voila's pooled kernel manager: `pool` kernels preheated, kernels that start at once,
    and Voila's refill call after a page takes a pool kernel (recorded, as `fills`)."""

    def __init__(self, pool: int = 2, cap: int = 3):
        self.parent, self.log = types.SimpleNamespace(max_kernels=cap), logging.getLogger("room")
        self.kernels = [f"pool-{i}" for i in range(pool)]
        self._pools = {"nb": [self.ready({"kernel_id": k}) for k in self.kernels]}
        self.fills, self.started = [], 0

    @staticmethod
    def ready(value):
        future = asyncio.get_event_loop().create_future()
        future.set_result(value)
        return future

    def list_kernel_ids(self):
        return list(self.kernels)

    async def get_rendered_notebook(self, notebook_name, **kwargs):
        content = await self._pools[notebook_name].pop(0)
        self.fill_if_needed(delay=None, notebook_name=notebook_name)  # as Voila does after a take
        return None, [], content["kernel_id"]

    def fill_if_needed(self, delay=None, notebook_name=None, **kwargs):
        self.fills.append(delay)

    async def start_kernel(self, **kwargs):
        await asyncio.sleep(0.05)
        self.started += 1
        self.kernels.append(f"fresh-{self.started}")
        return self.kernels[-1]

    async def shutdown_kernel(self, kernel_id, **kwargs):
        self.kernels.remove(kernel_id)


def test_the_room_hands_out_its_pool_then_fresh_kernels_then_says_it_is_full(monkeypatch, caplog):
    server = pytest.importorskip("bcr_core.explorer_server")
    monkeypatch.setattr(server, "RELEASE_WAIT_S", 0.5)
    caplog.set_level(logging.INFO, "room")

    async def room():
        manager = server.room_kernel_manager(PooledManager)()
        taken = [(await manager.get_rendered_notebook("nb"))[2] for _ in range(2)]
        assert taken == ["pool-0", "pool-1"] and manager.fills == []  # the pool empties: no refill waits in it
        assert (manager.in_use(), manager.free(), manager.full()) == (2, 0, False)
        # two pages past the pool at once, one place left under the cap of 3: one kernel, one room-full
        results = await asyncio.gather(manager.start_kernel(), manager.start_kernel(), return_exceptions=True)
        assert sorted(map(type, results), key=str) == sorted([str, server.RoomFull], key=str), results
        assert manager.in_use() == 3 and manager.full()
        # a reload: its new page asks before the old page's shutdown lands, and gets the place it frees
        asking = asyncio.ensure_future(manager.start_kernel())
        await asyncio.sleep(0.1)
        await manager.shutdown_kernel("pool-0")
        assert await asking == "fresh-2" and manager.in_use() == 3

    asyncio.run(room())
    said = [r.getMessage() for r in caplog.records]
    assert (
        "room: 2 kernels in use, 0 preheated free, 1 more can start (at most 3); a page took a preheated kernel" in said
    )
    assert (
        "room: 3 kernels in use, 0 preheated free, 0 more can start (at most 3); a page was told the room is full"
        in said
    )
    assert (
        "room: 2 kernels in use, 0 preheated free, 1 more can start (at most 3); a page closed or was reloaded" in said
    )


def test_an_explorer_whose_server_dies_exits_non_zero_saying_so(tmp_path):
    pytest.importorskip("voila")
    psutil = pytest.importorskip("psutil")
    port = app.free_port()
    process, out, err = explorer(port, tmp_path, "a")
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and process.poll() is None and "explorer: " not in out.read_text():
            time.sleep(0.2)
        (server,) = psutil.Process(process.pid).children()
        server.kill()
        assert process.wait(timeout=60) == 2
    finally:
        if process.poll() is None:
            process.kill()
    last = err.read_text().splitlines()[-1]
    assert last == "bcr explore: error: the explorer's server was killed by signal 9; its log is above"


def test_after_ctrl_c_a_hung_explore_says_where_and_exits_within_its_bound(tmp_path):
    """The bound `bcr explore` sets after Ctrl-C (`lab.serving.stop_within`), injected into a process that
    then hangs: it exits with status 1 at the bound, its stderr naming the line it hung on."""
    hang = "from bcr_core.lab.serving import stop_within\nimport time\nstop_within(1)\ntime.sleep(60)\n"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", hang], capture_output=True, text=True, timeout=30, cwd=CHECKOUT)
    assert done.returncode == 1 and time.monotonic() - started < 20
    assert "Timeout (0:00:01)!" in done.stderr and 'File "<string>", line 4' in done.stderr, done.stderr
