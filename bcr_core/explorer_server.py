"""The explorer's Voila server (`python -m bcr_core.explorer_server`, started by `bcr explore`): Voila,
serving on a socket `bcr explore` already bound, and keeping a room. It lives outside `bcr_core.lab`, whose
package imports torch: the server needs none of it.

The socket: `bcr explore` binds and listens before it prints the URL and hands the socket over
(`--RoomVoila.listen_fd`), so two explorers started on one port cannot both think they have it: the
kernel gives the port to one bind, and the other explorer stops before starting anything.

The room: with a preheated pool (`--participants`), the first pages take its kernels; a taken kernel is
not replaced (a refill runs the whole notebook and loads another model beside the pages just handed out),
so once the pool is empty a page starts a kernel of its own, with Voila's progress line ("Executing 3
of 20") until its figure is drawn. Past `max_kernels` kernels at once, a page says the room is full
and tries again every half minute. A page that closes or reloads releases its kernel (Voila's page
sends a shutdown as it unloads; the page is given the _xsrf cookie that shutdown needs); a kernel whose
page went without saying so (a browser that crashed) is culled after ten minutes without a connection
(`bcr_core.lab.app.CULL_IDLE_S`). The server's log (the instructor's console) says after each change how
many kernels are in use, how many preheated ones are free and how many more may start.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys

import tornado.web
import voila.app
from jupyter_core.utils import ensure_async
from jupyter_server.utils import url_path_join
from tornado.httpserver import HTTPServer
from traitlets import Integer, Unicode
from voila.app import Voila
from voila.tornado.handler import TornadoVoilaHandler

RELEASE_WAIT_S = 5.0  # a reload's request can arrive before the shutdown its old page sent as it unloaded
RETRY_S = 30  # the room-full page asks again this often
FULL_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="{retry}"><title>The room is full</title></head>
<body style="font-family: sans-serif; margin: 4em;">
<h2 id="room-full">The room is full</h2>
<p>All {cap} kernels this explorer may run at once are in use. This page tries again every {retry} s and
opens the explorer as soon as someone closes a page; or ask the instructor.</p>
</body></html>
"""


class RoomFull(Exception):
    """Every kernel the room may run is in use."""


class RoomKeeping:
    """Voila's kernel manager, keeping the room: a taken pool kernel is not replaced, a fresh kernel is
    refused past the cap, and each change is logged. Mixed in before Voila's own class (pooled or not)."""

    def __init__(self, **kwargs):
        self._taken: set[str] = set()  # kernels a page has (from the pool or started for it)
        self._starting = 0  # pages being given a kernel (the pool's or a fresh one) right now
        super().__init__(**kwargs)

    @property
    def cap(self) -> int:
        return self.parent.max_kernels

    def free(self) -> int:
        """Preheated kernels (ready or starting) no page has taken."""
        return sum(len(pool) for pool in getattr(self, "_pools", {}).values())

    def in_use(self) -> int:
        running = set(self.list_kernel_ids())
        return len(self._taken & running)

    def full(self) -> bool:
        return bool(self.cap) and self.free() == 0 and self.in_use() + self._starting >= self.cap

    def say(self, what: str) -> None:
        """One line on the instructor's console: kernels in use, free, and how many more may start."""
        used, free = self.in_use(), self.free()
        more = f", {max(self.cap - used - free, 0)} more can start (at most {self.cap})" if self.cap else ""
        self.log.info("room: %d kernels in use, %d preheated free%s; %s", used, free, more, what)

    def fill_if_needed(self, delay=None, notebook_name=None, **kwargs):
        if delay is None:  # Voila refilling the place of a kernel a page just took: not while the room runs
            return
        super().fill_if_needed(delay, notebook_name, **kwargs)

    async def get_rendered_notebook(self, *args, **kwargs):
        self._starting += 1
        try:
            task, rendered, kernel_id = await super().get_rendered_notebook(*args, **kwargs)
        finally:
            self._starting -= 1
        self._taken.add(kernel_id)
        self.say("a page took a preheated kernel")
        return task, rendered, kernel_id

    async def start_kernel(self, *args, **kwargs):
        """A fresh kernel for a page (the pool's kernels start through Voila's own path, not this one)."""
        waited = 0.0
        while self.full() and waited < RELEASE_WAIT_S:
            await asyncio.sleep(0.25)
            waited += 0.25
        if self.full():
            self.say("a page was told the room is full")
            raise RoomFull()
        self._starting += 1  # no await since the check: two pages cannot both take the last place
        try:
            kernel_id = await ensure_async(super().start_kernel(*args, **kwargs))
        finally:
            self._starting -= 1
        self._taken.add(kernel_id)
        self.say("a page started a kernel of its own")
        return kernel_id

    async def shutdown_kernel(self, kernel_id, *args, **kwargs):
        released = kernel_id in self._taken
        self._taken.discard(kernel_id)  # at once: the page reloading counts it free already
        try:
            return await ensure_async(super().shutdown_kernel(kernel_id, *args, **kwargs))
        finally:
            if released:
                self.say("a page closed or was reloaded")


def room_kernel_manager(base: type) -> type:
    """Voila's kernel manager class `base` (with or without a preheated pool) keeping the room."""

    class RoomKernelManager(RoomKeeping, base):
        pass

    return RoomKernelManager


ORIGINAL_FACTORY = voila.app.voila_kernel_manager_factory


def voila_kernel_manager_factory(*args, **kwargs) -> type:
    """Voila's factory of its kernel manager class (pooled or not), wrapped to keep the room."""
    return room_kernel_manager(ORIGINAL_FACTORY(*args, **kwargs))


class RoomPage(TornadoVoilaHandler):
    """The notebook's page, or the room-full page when no kernel can be had."""

    @tornado.web.authenticated
    async def get(self, path=None):
        # Voila's page posts a shutdown of its kernel as it unloads (a reload, a closed tab) with the _xsrf
        # cookie's value, but Voila sets no such cookie: refused (403), the kernel stayed. Reading the token
        # sets the cookie.
        self.xsrf_token  # noqa: B018
        try:
            await super().get(path)
        except RoomFull:  # raised before the page wrote anything: Voila starts the kernel first
            self.set_status(503)
            self.set_header("Retry-After", str(RETRY_S))
            self.finish(FULL_PAGE.format(cap=self.kernel_manager.cap, retry=RETRY_S))


class Ready(tornado.web.RequestHandler):
    """Answers `bcr explore`'s "are you serving yet?" (at `ready_path`) with nothing, unlogged (a 204)."""

    def get(self):
        self.set_status(204)


class QuietAboutTrust(logging.Filter):
    """Voila runs the lab's own notebook whether or not it is signed: the warning that it is not trusted
    is nothing the instructor or a participant can act on."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "is not trusted" not in record.getMessage()


class RoomVoila(Voila):
    listen_fd = Integer(-1, config=True, help="a listening socket to serve on, bound by `bcr explore`")
    ready_path = Unicode("", config=True, help="a path answered at once, for `bcr explore` to see it serves")
    max_kernels = Integer(0, config=True, help="kernels at once, past which a page says the room is full (0: none)")

    def init_settings(self):
        voila.app.voila_kernel_manager_factory = voila_kernel_manager_factory  # the room's kernel manager
        self.log.addFilter(QuietAboutTrust())
        return super().init_settings()

    def init_handlers(self):
        handlers = super().init_handlers()
        page = [(route, RoomPage if h is TornadoVoilaHandler else h, *rest) for route, h, *rest in handlers]
        ready = [(url_path_join(self.server_url, self.ready_path), Ready)] if self.ready_path else []
        return [*ready, *page]  # before the page's catch-all route

    def listen(self):
        """Voila's listen (its log line, its loop, its stop), on the inherited socket instead of a new bind."""
        if self.listen_fd >= 0:
            inherited = socket.socket(fileno=self.listen_fd)
            os.set_inheritable(inherited.fileno(), False)  # not into the kernels
            inherited.setblocking(False)

            def serve_inherited(port, address=None, **kwargs):
                server = HTTPServer(self.app, **kwargs)
                server.add_sockets([inherited])
                return server

            self.app.listen = serve_inherited
        super().listen()


if __name__ == "__main__":
    sys.exit(RoomVoila.launch_instance())
