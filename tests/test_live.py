"""Answers decoded live on a read inspection (`bcr_core.lab.live`): on the embedded model, the explorer's
live answer for each selector at a setting nobody decoded before equals an independent decode (the
cache the requests were first served with, repaired by the engine, decoded by a greedy loop written out
here); the decoder's worker returns at once, drops a request the controls moved on from, and says why
it cannot decode instead of raising in its thread."""

from __future__ import annotations

import threading

import pytest
import torch
from conftest import rounding_close

from bcr_core import lab
from bcr_core.errors import UsageError
from bcr_core.lab import live
from bcr_core.lab import saved_inspection as saved
from bcr_core.lab.explorer import DECODING, NOT_DECODED

SETTINGS = dict(
    model="default", benchmark="synthetic", item_seed=34, agents=2, n=3, max_new_tokens=6, gamma=1.0, layout="single"
) | dict(rho=0.2, chunk=8)
CONDITION = "bcr-single@0.2:gamma=1,skip=off"


@pytest.fixture(scope="module")
def served(real):
    items = lab.Comparison(benchmark="synthetic", agents=2, n=3, max_new_tokens=6, item_seed=34).items()
    return lab.inspect_requests(real, "synthetic", items, 2, CONDITION, 6, progress=False, chunk=8)


def greedy(bb, kv, last_id: int, steps: int) -> str:
    """Greedy decoding written out: feed the prompt's last token, then each argmax, until a stop id."""
    cache, position, token, tokens = kv.to_cache(room=steps), kv.next_position, last_id, []
    with torch.inference_mode():
        for _ in range(steps):
            out = bb.model(
                input_ids=torch.tensor([[token]]), position_ids=torch.tensor([[position]]), cache=cache, use_cache=True
            )
            token = int(out.logits[0, -1].argmax())
            if token in bb.stop_ids:
                break
            tokens.append(token)
            position += 1
    return bb.decode(tokens)


def test_live_answers_equal_the_engines_decode_of_the_repaired_cache(served, real, tmp_path):
    assert served.views, "the embedded model served no call from an assembled cache"
    back = saved.load(saved.save(served, tmp_path, SETTINGS), SETTINGS)  # no answer decoded before
    assert all(v.kv is None for v in back.views)
    caches = live.LiveCaches("default", back, SETTINGS, served.condition, bb=real)
    explorer = lab.Explorer(None, back, served.condition, 6, "single", 0.2, 8, live=caches)
    assert not explorer.decode_w.value  # a read inspection: ticking it is what loads the model
    drawn = explorer.update(layout="chunk", rho=0.5, decode=True)  # a setting nobody decoded before
    assert DECODING in explorer.answers_w.value  # said at once, the figure already drawn
    table = explorer.wait(timeout=600)
    assert explorer.status_w.value == "" and DECODING not in explorer.answers_w.value
    view = explorer.view
    first = next(v for v in served.views if (v.index, v.node) == (view.index, view.node))
    wanted = {f"chunk at ρ=0.5, {drawn.count} rows": drawn.selected}
    wanted |= {f"{label}, {len(rows)} rows": rows for label, rows in drawn.picks.items()}
    shown = dict(zip(table["served as"], table["answer"]))
    assert len(wanted) == len(drawn.picks) + 1 > 5
    for label, rows in wanted.items():
        kv = first.kv if not rows else real.repair(first.kv, first.ids[:-1], rows)
        assert shown[label] == greedy(real, kv, first.ids[-1], 6), label
    assert NOT_DECODED not in explorer.answers_w.value


def test_rebuilt_caches_are_the_served_ones_and_are_shared_through_a_folder(served, real, tmp_path):
    path = saved.save(served, tmp_path, SETTINGS)
    first, said = live.LiveCaches("default", saved.load(path), SETTINGS, CONDITION, bb=real, folder=tmp_path), []
    first.prepare(said.append)
    assert first.shared.is_file() and any("rebuilding the assembled caches" in line for line in said)
    second, said = live.LiveCaches("default", saved.load(path), SETTINGS, CONDITION, bb=real, folder=tmp_path), []
    second.prepare(said.append)
    assert said == ["reading the assembled caches another page rebuilt …"]  # no second rebuild
    for view, again in zip(served.views, second.inspection.views):
        assert again.kv.positions.tolist() == view.kv.positions.tolist()
        assert rounding_close(again.kv.keys, view.kv.keys)  # the cache the call was served with
        assert rounding_close(again.kv.values, view.kv.values)


def test_caches_rebuilt_for_another_model_are_refused(served, tiny_chat, tmp_path):
    back = saved.load(saved.save(served, tmp_path, SETTINGS), SETTINGS)
    caches = live.LiveCaches("tiny", back, SETTINGS, served.condition, bb=tiny_chat)
    with pytest.raises(UsageError, match="this model is not the one the inspection was saved with"):
        caches.prepare(say=lambda line: None)


class Blocking:
    """A view whose decode waits for `release`: a slow decode, under the test's control."""

    def __init__(self):
        self.release, self.started, self.decoded = threading.Event(), threading.Event(), []

    def answer_with(self, bb, rows, max_new_tokens):
        self.started.set()
        assert self.release.wait(10)
        self.decoded.append(tuple(rows))


def test_the_decoder_never_blocks_and_drops_a_stale_request():
    view, done = Blocking(), []
    decoder = live.Decoder(bb=object())
    first = decoder.submit([(view, [1], 4), (view, [2], 4)], done.append, print)
    assert view.started.wait(10)  # the first decode runs in the worker, and submit returned meanwhile
    second = decoder.submit([(view, [3], 4)], done.append, print)
    view.release.set()
    decoder.wait(10)
    assert done == [second] and first != second  # the first request's answers are never shown
    assert view.decoded == [(1,), (3,)]  # it stopped between answers: [2] was never decoded


def test_a_failed_decode_is_said_in_the_table_not_raised():
    class Failing:
        def answer_with(self, bb, rows, max_new_tokens):
            raise RuntimeError("out of memory")

    decoder, done = live.Decoder(bb=object()), []
    decoder.submit([(Failing(), [0], 4)], done.append, print)
    decoder.wait(10)
    assert done == [1] and decoder.error == "RuntimeError: out of memory"
    assert not decoder.can_decode(Failing())


def test_a_model_on_this_machine_is_told_from_one_that_is_not(tmp_path):
    assert live.on_this_machine("default")  # the embedded model, converted by the session's fixtures
    assert not live.on_this_machine(str(tmp_path))  # a folder without a config.json
    (tmp_path / "config.json").write_text("{}")
    assert live.on_this_machine(str(tmp_path))
    assert not live.on_this_machine("nobody/no-such-model-here")
