"""A room of participants on `bcr explore`: N browser pages opened at once, what each waits for its first
figure, and what the server's processes hold in memory. The load test and benchmarks/explorer_load.py
both measure through here; Playwright (a test extra) drives the system Chromium.

Memory is the proportional set size (PSS) of the server and every process under it (its kernels):
pages a process shares with another count half to each, so the sum is what the room adds to the
machine, whatever else runs on it.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

# the explorer's figure, once plotly has drawn it with every trace and its title (the first figure)
FIGURE = "() => document.querySelector('.js-plotly-plot')"
TITLE = (
    f"() => {{ const p = ({FIGURE})(); "
    "return p && p.data && p.data.length >= 6 && p._fullLayout ? p._fullLayout.title.text : null; }"
)
POLL_MS = 100  # how often a page is asked (not per animation frame: a page out of view gets few)
# one browser holds the room's pages; each participant's would be in front on their own laptop, so none
# is put in the background here (Chromium would stop drawing it and slow its timers)
EVERY_PAGE_IN_VIEW = [
    "--disable-background-timer-throttling",
    "--disable-renderer-backgrounding",
    "--disable-backgrounding-occluded-windows",
]


def chromium() -> str | None:
    """The system Chromium, or None."""
    found = (shutil.which("chromium"), shutil.which("chromium-browser"), "/usr/bin/chromium")
    return next((p for p in found if p and Path(p).exists()), None)


def processes(server):
    """The server's process and every process under it (its kernels), as psutil sees them."""
    import psutil

    root = psutil.Process(server.pid)
    return [root, *root.children(recursive=True)]


def kernels(server) -> list:
    return [p for p in processes(server) if "ipykernel" in " ".join(p.cmdline())]


def memory_bytes(server) -> int:
    """PSS of the server and its kernels together (processes that ended meanwhile count nothing)."""
    import psutil

    total = 0
    for p in processes(server):
        try:
            total += p.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def wait_settled(server, count: int, timeout: float = 900.0, quiet_s: float = 5.0, busy: float = 10.0) -> float:
    """Wait until `count` kernels run under the server and all of them are idle (under `busy` % of one
    core together over `quiet_s`): a preheated pool whose notebooks have run and whose models have
    loaded. Returns the seconds it took; raises TimeoutError past `timeout`."""
    import psutil

    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        found = kernels(server)
        if len(found) >= count:
            try:
                for p in found:
                    p.cpu_percent(None)
                time.sleep(quiet_s)
                if sum(p.cpu_percent(None) for p in found) < busy:
                    return time.perf_counter() - started
            except psutil.NoSuchProcess:
                continue
        else:
            time.sleep(1.0)
    raise TimeoutError(f"{count} kernels did not settle in {timeout:.0f} s")


@dataclass
class Page:
    """One participant's page: seconds from its arrival to the first figure (and from one control
    moved to the figure after it), and what its console said was an error."""

    first_figure_s: float | None = None
    control_s: float | None = None
    title: str | None = None  # the figure's title when the page was left
    errors: list[str] = field(default_factory=list)
    failure: str | None = None


async def participant(browser, url: str, move: bool, timeout_ms: int, delay_s: float = 0.0) -> Page:
    page_record = Page()
    await asyncio.sleep(delay_s)
    started = time.perf_counter()  # the participant's own wait starts when they arrive
    context = await browser.new_context(viewport={"width": 1400, "height": 1000})
    page = await context.new_page()
    page.on("console", lambda m: page_record.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: page_record.errors.append(f"page error: {e}"))
    stage = "first figure"
    try:
        await page.goto(url, timeout=timeout_ms)
        await page.wait_for_function(f"() => ({TITLE})() !== null", timeout=timeout_ms, polling=POLL_MS)
        page_record.first_figure_s = time.perf_counter() - started
        stage = "control"
        if move:  # one control: the layout, to single rows; the title's count changes with it
            before = await page.evaluate(TITLE)
            moved = time.perf_counter()
            await page.locator(".widget-toggle-button", has_text="single").first.click()
            await page.wait_for_function(
                f"(before) => {{ const t = ({TITLE})(); return t !== null && t !== before; }}",
                arg=before,
                timeout=timeout_ms,
                polling=POLL_MS,
            )
            page_record.control_s = time.perf_counter() - moved
        page_record.title = await page.evaluate(TITLE)
    except Exception as err:  # a page that never got there is the measurement, not a crash of the room
        page_record.failure = f"at the {stage}: {type(err).__name__}: {str(err).splitlines()[0]}"
    finally:
        await context.close()
    return page_record


async def open_room_async(
    url: str, count: int, move: bool = False, timeout_ms: int = 600_000, stagger_s: float = 0.0
) -> list[Page]:
    from playwright.async_api import async_playwright

    executable = chromium()
    if executable is None:
        raise RuntimeError("no chromium on this machine: `apt-get install chromium` (make setup does it as root)")
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=executable, headless=True, args=EVERY_PAGE_IN_VIEW)
        pages = await asyncio.gather(
            *(participant(browser, url, move, timeout_ms, i * stagger_s) for i in range(count))
        )
        await browser.close()
    return list(pages)


def open_room(
    url: str, count: int, move: bool = False, timeout_ms: int = 600_000, stagger_s: float = 0.0
) -> list[Page]:
    """`count` pages opened on `url` at the same moment (or arriving `stagger_s` apart), each waiting for
    the explorer's figure (and, with `move`, moving the layout control and waiting for the figure to
    follow). Pages that land on a preheated pool while others still load can come up with dead
    controls (Voila 0.5.13 here: two or three of four at once, two of four 3 s apart, with or without
    the model loading); each page's `failure` says where it stopped."""
    return asyncio.run(open_room_async(url, count, move, timeout_ms, stagger_s))
