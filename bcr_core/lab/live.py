"""Answers decoded live on a read inspection, off the explorer's controls' path.

A saved inspection keeps no assembled caches (about 5 MB a call), so by itself it can show only the
answers decoded when it was saved. `LiveCaches` gets the caches back where the model is on this
machine: on first use it loads the model once and serves the inspection's requests again, in order,
through the condition they were served with (the anchor pool warms up as it did then), keeping the
assembled cache of every inspectable call. Each call must come back with the ids it was saved with,
so row j of a view is row j of its cache; then `CallView.answer_with` decodes any selection.
Given a folder, the first kernel to rebuild them writes them there (beside the runs an app saves)
and every other kernel reads them instead, one at a time under a file lock: a room of participants
pays for one rebuild, not one each.

`Decoder` does that work in one worker thread for the explorer: a control change that needs answers
hands it the list and returns at once (the figure is already drawn); a newer request makes an older
one stale, and a stale one stops between answers and shows nothing.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from bcr_core.errors import UsageError
from bcr_core.paths import held_exclusively

PRELOAD = "BCR_PRELOAD_MODEL"  # set (by `bcr explore --participants`): load the model as soon as the explorer is drawn


def on_this_machine(model: str) -> bool:
    """Whether `model` can be loaded without a network: a fetched model's converted folder, a local
    folder, or a hub id in the local Hugging Face cache."""
    from bcr_core.engine.assets import cache_dir
    from bcr_core.engine.models import fetched_folder

    folder = fetched_folder(model)
    if folder is not None:
        return (cache_dir() / "models" / folder / "model.safetensors").is_file()
    path = Path(os.path.expanduser(model))
    if path.is_dir():
        return (path / "config.json").is_file()
    if model.count("/") == 1:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(model, "config.json"), str)
    return False


class LiveCaches:
    """The assembled caches of a read inspection's views, rebuilt with the model on first use."""

    def __init__(self, model: str, inspection, settings: dict, served_as: str, bb=None, folder=None):
        self.model, self.inspection, self.settings, self.served_as = model, inspection, settings, served_as
        self.bb = bb  # a model already loaded (tests), else loaded by `prepare`
        self.folder = None if folder is None else Path(folder)  # where rebuilt caches are shared
        self.ready = False
        self.lock = threading.Lock()

    @property
    def shared(self) -> Path | None:
        """The file the rebuilt caches are shared through (None: not shared)."""
        from bcr_core.lab.saved_inspection import file_name

        return None if self.folder is None else self.folder / f"{Path(file_name(self.settings)).stem}.caches.pt"

    def prepare(self, say: Callable[[str], None] = print):
        """The model, with every view's assembled cache back in place; `say` hears each step."""
        with self.lock:
            if self.ready:
                return self.bb
            if self.bb is None:
                from bcr_core.engine.loading import load_backbone

                say(f"loading the model ({self.model}) once, for live decoding …")
                self.bb = load_backbone(self.model)
            if self.shared is None:
                self.rebuild(say)
            else:
                self.rebuild_or_read(say)
            self.ready = True
            return self.bb

    def rebuild_or_read(self, say: Callable[[str], None]) -> None:
        """Read the shared caches where another kernel wrote them, else rebuild and write them (under an
        exclusive lock, so a kernel that would rebuild at the same time waits and reads them)."""

        def waiting() -> None:
            say("waiting for the assembled caches another page is rebuilding …")

        with held_exclusively(self.shared.with_suffix(".lock"), on_wait=waiting):
            if self.shared.is_file():
                say("reading the assembled caches another page rebuilt …")
                try:
                    read_caches(self.inspection, self.shared)
                    return
                except (UsageError, RuntimeError, KeyError, ValueError):  # torn or stale: rebuild it
                    pass
            self.rebuild(say)
            write_caches(self.inspection, self.shared)

    def rebuild(self, say: Callable[[str], None]) -> None:
        from bcr_core.lab.comparisons import Comparison
        from bcr_core.lab.inspection import inspect_requests

        s, requests = self.settings, self.inspection.requests
        items = Comparison.from_params(s).items()
        wanted = [r.item_id for r in requests]
        if [str(i["id"]) for i in items] != wanted:
            raise UsageError(f"this benchmark's items are not the inspection's ({wanted}): cannot rebuild its caches")
        total = len(items)

        def served(done: int) -> None:
            say(f"rebuilding the assembled caches: serving the {total} requests again ({done}/{total}) …")

        served(0)
        fresh = inspect_requests(
            self.bb,
            s["benchmark"],
            items,
            s["agents"],
            self.served_as,
            s["max_new_tokens"],
            dense=False,
            progress=False,
            chunk=s["chunk"],
            rank=False,
            each=lambda i: served(i + 1),
        )
        attach(self.inspection, fresh)


def attach(inspection, fresh) -> None:
    """Put the assembled cache of each of `fresh`'s views on the view of the same call in `inspection`
    (a UsageError where a call is missing or came back with other ids: its rows would not line up)."""
    caches = {(v.index, v.node): v for v in fresh.views}
    for view in inspection.views:
        again = caches.get((view.index, view.node))
        if again is None or list(again.ids) != list(view.ids):
            why = "was not served from an assembled cache" if again is None else "came back with other token ids"
            raise UsageError(
                f"served again here, item {view.index}'s {view.node} {why}: this model is not the one the "
                "inspection was saved with"
            )
        view.record.trace.assembled = again.kv


def write_caches(inspection, path: Path) -> None:
    """Every view's assembled cache, with the ids it holds, to `path` (whole or not at all)."""
    import torch

    from bcr_core.paths import written_whole

    stored = {
        "ids": [list(v.ids) for v in inspection.views],
        "keys": [v.kv.keys for v in inspection.views],
        "values": [v.kv.values for v in inspection.views],
        "positions": [v.kv.positions for v in inspection.views],
    }
    with written_whole(path) as partial:
        torch.save(stored, partial)


def read_caches(inspection, path: Path) -> None:
    """Put the caches `write_caches` wrote back on the views (a UsageError where the ids differ)."""
    import torch

    from bcr_core.engine.kv import KV

    stored = torch.load(path, weights_only=True)
    if len(stored["ids"]) != len(inspection.views):
        raise UsageError(f"{path} holds {len(stored['ids'])} caches for {len(inspection.views)} calls")
    if any(ids != list(v.ids) for ids, v in zip(stored["ids"], inspection.views)):
        raise UsageError(f"{path} holds caches of other token ids than the inspection's calls")
    for i, view in enumerate(inspection.views):
        view.record.trace.assembled = KV(stored["keys"][i], stored["values"][i], stored["positions"][i])


def caches_for(model: str, inspection, settings: dict, served_as: str, folder=None) -> LiveCaches | None:
    """Live caches for a read inspection when its model is on this machine, else None; rebuilt ones
    are shared through `folder` when one is given."""
    return LiveCaches(model, inspection, settings, served_as, folder=folder) if on_this_machine(model) else None


class Decoder:
    """Decodes answers in one worker thread, the latest request first; stale requests are dropped."""

    def __init__(self, bb=None, caches: LiveCaches | None = None):
        self.bb, self.caches = bb, caches
        self.generation = 0
        self.error: str | None = None
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def can_decode(self, view) -> bool:
        """Whether `view`'s missing answers can be decoded here (now, or once the caches are rebuilt)."""
        if self.error is not None:
            return False
        return (self.bb is not None and view.kv is not None) or self.caches is not None

    @property
    def loaded(self) -> bool:
        return self.bb is not None and (self.caches is None or self.caches.ready)

    def submit(self, jobs: list, done: Callable[[int], None], say: Callable[[str], None]) -> int:
        """Decode `jobs` ((view, rows, max_new_tokens) each) in the worker, then call `done(generation)`
        unless a newer request came first; `say` hears the model load and the cache rebuild. Returns
        this request's generation."""
        self.generation += 1
        generation = self.generation
        self.thread = threading.Thread(target=self.work, args=(generation, jobs, done, say), daemon=True)
        self.thread.start()
        return generation

    def stale(self, generation: int) -> bool:
        return generation != self.generation

    def work(self, generation: int, jobs: list, done: Callable[[int], None], say: Callable[[str], None]) -> None:
        with self.lock:
            if self.stale(generation):
                return
            try:
                if self.caches is not None:
                    self.bb = self.caches.prepare(say)
                for view, rows, max_new_tokens in jobs:
                    if self.stale(generation):
                        return  # the controls moved on: what was decoded stays cached, nothing is shown
                    view.answer_with(self.bb, rows, max_new_tokens)
            except Exception as err:  # shown in the explorer, not raised in a thread nobody reads
                self.error = f"{type(err).__name__}: {err}" if not isinstance(err, UsageError) else str(err)
            if not self.stale(generation):
                done(generation)

    def wait(self, timeout: float | None = None) -> None:
        """Block until the latest request has been handled (for code and tests; the widgets never wait)."""
        if self.thread is not None:
            self.thread.join(timeout)
