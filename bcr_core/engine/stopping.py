"""When greedy decoding stops, beyond the model's end token and the token cap.

A base model never emits its end token on a short-answer task: it states the value, then goes on
with whatever a document would hold next (a blank line, the template's next line). Under `eos` it
runs to the cap, and every agent downstream reads that tail. The `line` rule ends the answer at its
first line: decoding stops at the first newline that follows a non-blank character, the token that
holds the newline kept (so a continuation teacher-forced on it is the one decoded); newlines before
any visible text never stop it, and the cap still applies. An instruction-tuned coder writes its
function in a fenced block and then explains and tests it until the cap: the `code` rule stops at the
token that closes the answer's first fenced code block (the block HumanEval's grader reads), and an
answer without a fence runs to its end token or the cap. The rule is a run setting, the same for
every condition of a cell, and recorded in its `cell.json`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bcr_core.setting_kinds import SettingError

RULES = ("eos", "line", "code")  # "eos": the model's end token or the cap, the default
SHORT_ANSWER_RULES = ("eos", "line")  # the rules a short-answer task chooses between (`bcr calibrate`)
FENCE = "```"
DEFAULT_RULE = "eos"

StopRule = Callable[[Sequence[int]], bool]  # the tokens generated so far -> stop after the last one


def first_line_ended(text: str) -> bool:
    """Whether `text` holds a newline after its first non-blank character."""
    return "\n" in text.lstrip()


def first_block_closed(text: str) -> bool:
    """Whether `text` holds a fenced code block that has been closed (an opening and a closing fence)."""
    return text.count(FENCE) >= 2


def stop_rule(name: str, tokenizer) -> StopRule | None:
    """The rule called `name` for this tokenizer's text, or None for `eos` (nothing beyond the end token)."""
    if name not in RULES:
        raise SettingError("stop", f"unknown stop rule {name!r}; the rules: {', '.join(RULES)}")
    if name == "eos":
        return None
    ended = first_line_ended if name == "line" else first_block_closed
    return lambda tokens: ended(tokenizer.decode(list(tokens)))
