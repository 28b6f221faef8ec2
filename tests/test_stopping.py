"""The `line` stop rule: on a hand-made token stream, then in every decoding path (one sequence, the batch,
OpenGate's draft and continuation, a pipeline's calls) on a tiny random model."""

import pytest
from helpers import QUESTIONS, run

from bcr_core.agents import pipeline as pipeline_module
from bcr_core.agents.pipeline import Pipeline
from bcr_core.engine.batching import BatchDecoder
from bcr_core.engine.stopping import first_block_closed, first_line_ended, stop_rule
from bcr_core.repair.opengate import OpenGateServer
from bcr_core.reuse.calls import drive, stopping
from bcr_core.reuse.servers import DenseServer
from bcr_core.setting_kinds import SettingError


class Pieces:
    """A tokenizer whose token i is the text pieces[i]."""

    def __init__(self, pieces):
        self.pieces = pieces

    def decode(self, tokens, **_):
        return "".join(self.pieces[t] for t in tokens)


def stops_after(pieces, rule) -> int | None:
    """The index of the token after which `rule` first stops the stream 0, 1, 2, ..., or None."""
    return next((i for i in range(len(pieces)) if rule(list(range(i + 1)))), None)


def test_the_line_rule_stops_after_the_first_non_blank_line_and_never_before_visible_text():
    rule = stop_rule("line", Pieces(["\n\n", " 587", "\n\n", "Answer", " with"]))
    assert stops_after(["\n\n", " 587", "\n\n", "Answer", " with"], rule) == 2  # the newline token is kept
    blank = ["\n", "\n\n", " ", "\t\n"]
    assert stops_after(blank, stop_rule("line", Pieces(blank))) is None  # only blank text: never
    inside = ["\n", " Oslo.\nAnswer", " more"]
    assert stops_after(inside, stop_rule("line", Pieces(inside))) == 1  # a newline inside a token counts
    assert stop_rule("eos", Pieces([])) is None
    assert [first_line_ended(t) for t in ("", "  \n\n", "x", "\nx", "x\n", " \n x \n")] == [
        False,
        False,
        False,
        False,
        True,
        True,
    ]
    with pytest.raises(SettingError, match="unknown stop rule 'para'.*eos, line, code"):
        stop_rule("para", Pieces([]))


def test_the_code_rule_stops_where_the_first_fenced_block_closes():
    """The token that closes the first fence ends the answer (kept, like the line rule's newline); prose, a
    fence still open, or an answer with no fence never stop it (the end token and the cap still do)."""
    pieces = ["Here", " is", ":\n```", "python\n", "def f(x):\n", "    return x\n", "```", "\n\nIt", " works"]
    assert stops_after(pieces, stop_rule("code", Pieces(pieces))) == 6
    merged = ["```python\ndef f(x): return x", "\n```\n", "more"]  # the closing fence inside a token
    assert stops_after(merged, stop_rule("code", Pieces(merged))) == 1
    never = ["def f(x):\n", "    return x\n", "\nThis", " adds", " `x`."]
    assert stops_after(never, stop_rule("code", Pieces(never))) is None
    assert [first_block_closed(t) for t in ("", "```py\nx", "```py\nx\n```", "``` ```")] == [False, False, True, True]


class Marked:
    """A tokenizer view for a tiny random model, which seldom emits a newline: the ids in `newlines` decode to
    a newline, those in `blanks` to a space, every other id to a letter."""

    def __init__(self, newlines=(), blanks=()):
        self.newlines, self.blanks = set(newlines), set(blanks)

    def decode(self, tokens, **_):
        return "".join("\n" if t in self.newlines else " " if t in self.blanks else "a" for t in tokens)


def first_new(tokens: list[int], at_least: int) -> int:
    """The first index >= at_least whose token did not occur before it."""
    return next(i for i in range(at_least, len(tokens)) if tokens[i] not in tokens[:i])


PROMPT = "Ann lives in Oslo.\nAnn's pet is a cat.\n\nWhere does Ann live?"


@pytest.fixture(scope="module")
def stream(tiny_chat):
    """A prompt's cache and its unstopped greedy stream of 30 tokens."""
    kv = tiny_chat.prefill(tiny_chat.tokenizer(PROMPT, add_special_tokens=False)["input_ids"])
    return kv, tiny_chat.generate(kv, 25, 30, stop_ids=()).tokens


def test_generate_stops_after_the_first_newline_that_follows_visible_text(tiny_chat, stream):
    kv, free = stream
    k = first_new(free, 3)
    ruled = tiny_chat.generate(kv, 25, 30, stop_ids=(), stop_rule=stop_rule("line", Marked([free[k]])))
    assert ruled.tokens == free[: k + 1] and ruled.stopped  # the newline token kept, nothing after it
    blank_first = Marked([free[k]], blanks=set(free[:k]))  # only blanks before the newline: it does not stop
    later = tiny_chat.generate(kv, 25, 30, stop_ids=(), stop_rule=stop_rule("line", blank_first))
    assert later.tokens[: k + 1] == free[: k + 1] and len(later.tokens) > k + 1
    assert (
        tiny_chat.generate(kv, 25, 2, stop_ids=(), stop_rule=stop_rule("line", Marked([free[k]]))).tokens == (free[:2])
    )  # never past the cap
    prior = tiny_chat.generate(kv, 25, 30, stop_ids=(), stop_rule=stop_rule("line", blank_first), prior=[7])
    assert prior.tokens == free[: k + 1]  # visible text decoded before this request counts


def test_the_batch_applies_each_rows_rule_to_its_own_stream(tiny_chat, stream):
    kv, free = stream
    short = kv.slice(0, kv.length - 4)
    other = tiny_chat.generate(short, 25, 30, stop_ids=()).tokens
    k, j = first_new(free, 2), first_new(other, 5)
    rule = stop_rule("line", Marked([free[k], other[j]]))
    decoder = BatchDecoder(tiny_chat, stop_ids=())
    decoder.add("a", kv, 25, 30, rule)
    decoder.add("b", short, 25, 30, rule)
    done = {}
    while decoder:
        done.update(decoder.step())
    cut = lambda tokens: tokens[: next(i for i, t in enumerate(tokens) if t in {free[k], other[j]}) + 1]  # noqa: E731
    assert done["a"].tokens == cut(free) and done["b"].tokens == cut(other)
    assert done["a"].stopped and done["b"].stopped


def warmed_opengate(bb) -> OpenGateServer:
    """OpenGate serving every assembled call (theta 0), its anchor pool warmed by three requests."""
    server = OpenGateServer(bb, theta=0.0)
    run(bb, server, QUESTIONS[:3], tokens=6)
    return server


def test_opengates_answer_is_judged_as_one_across_its_draft_and_continuation(tiny_chat):
    """OpenGate's answer is a 2-token draft and a continuation: the rule cuts it after a newline in either, the
    continuation judged with the draft as its prior tokens."""
    bb = tiny_chat
    prompt = Pipeline(bb, "gsm8k", 2, max_new_tokens=24).prompts(QUESTIONS[3], {})[0]
    free = warmed_opengate(bb).serve(prompt, 24)
    assert free.mode == "reuse" and len(free.output_tokens) == 24
    tokens = free.output_tokens
    assert tokens[2] not in tokens[:2]
    for at in (1, 2):  # in the draft; the continuation's first token, which only the prior makes a line end
        rule = stop_rule("line", Marked([tokens[at]]))
        ruled = drive(bb, stopping(warmed_opengate(bb).steps(prompt, 24), rule))
        assert ruled.mode == "reuse" and ruled.output_tokens == tokens[: at + 1]


def test_a_pipeline_gives_every_call_its_stop_rule(tiny_chat, monkeypatch):
    """`Pipeline(stop="line")`: each Dense call is its `eos` call cut after the first newline."""
    bb = tiny_chat
    free = Pipeline(bb, "synthetic", 2, max_new_tokens=24).run(DenseServer(bb), "0", PROMPT)
    first = free.calls[0].output_tokens
    mark = Marked([first[first_new(first, 2)]])
    monkeypatch.setattr(pipeline_module, "stop_rule", lambda name, tokenizer: stop_rule(name, mark))
    ruled = Pipeline(bb, "synthetic", 2, max_new_tokens=24, stop="line").run(DenseServer(bb), "0", PROMPT)
    assert ruled.calls[0].output_tokens == first[: first_new(first, 2) + 1]
    for call in ruled.calls:
        text = mark.decode(call.output_tokens)
        assert "\n" not in text.lstrip()[:-1] and (text.endswith("\n") or len(call.output_tokens) == 24)
    with pytest.raises(SettingError, match="unknown stop rule"):
        Pipeline(bb, "synthetic", 2, max_new_tokens=8, stop="never")
