"""Agent prompts as templates with placeholders, and the two ways of turning one into token ids.

A template is a system prompt and a user turn containing placeholders: `{user_question}` and
`{agent_<i>_current}` (agent i's output). Rendered through the model's chat template (`engine.chat.chat_template`
says which one a model gets), the text splits at the placeholders into pieces:

    prefix | value_1 | text after value_1 | value_2 | text after value_2 | ...

- The Dense path tokenizes the whole rendered text once.
- The reuse path tokenizes every piece on its own and concatenates the ids (docs/design.md §1).

Both are kept on every `Prompt`; where they differ is the tokenization term, which
`tokenization_diff` shows token by token. A dense prefill of the reuse path's ids is the
token-matched Dense control.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field, replace

from bcr_core.engine.chat import render_messages

PLACEHOLDER = re.compile(r"\{(user_question|agent_[1-9][0-9]*_current)\}")
ANY_BRACED_NAME = re.compile(r"\{([A-Za-z0-9_]+)\}")
QUESTION = "user_question"


def agent_placeholder(i: int) -> str:
    return f"agent_{i}_current"


@dataclass(frozen=True)
class Template:
    node: str  # graph node: "agent_1" ... or "final"
    role: str
    system: str
    user: str  # contains placeholders
    example: tuple[str, str] | None = None  # a worked (user turn, answer) exchange before `user`, or None

    def __post_init__(self):
        unknown = [n for n in ANY_BRACED_NAME.findall(self.user) if not PLACEHOLDER.fullmatch("{" + n + "}")]
        if unknown:
            raise ValueError(
                f"template for {self.node} has unknown placeholder(s) {unknown}; "
                "known: {user_question} and {agent_<i>_current}"
            )

    @property
    def placeholders(self) -> list[str]:
        return PLACEHOLDER.findall(self.user)


@dataclass(frozen=True)
class Segment:
    name: str  # "prefix", a placeholder name, or "after:<placeholder>"
    text: str
    ids: list[int]
    placeholder: bool  # a shared value (question or an agent's output), reused across calls

    @property
    def after(self) -> str | None:
        return self.name.split(":", 1)[1] if self.name.startswith("after:") else None


@dataclass
class Prompt:
    template: Template
    text: str  # the whole rendered prompt
    dense_ids: list[int]  # the chat template's text tokenized once
    segments: list[Segment]
    dense_segment_of: list[str] = field(repr=False)  # per dense token, the segment whose text it starts in

    @property
    def merged_ids(self) -> list[int]:
        """The reuse path's ids: every segment tokenized on its own, concatenated."""
        return [t for s in self.segments for t in s.ids]

    @property
    def tokenization_matches(self) -> bool:
        return self.dense_ids == self.merged_ids

    def aligned(self) -> Prompt:
        """The same text cut where Dense's tokenization has a boundary: each segment holds the Dense tokens
        whose first character falls in its text, so the reuse path's ids are Dense's and the tokenization
        tax is gone. A token that straddles a seam (the docstring's closing quotes and the blank line
        after them) goes to the segment it starts in. The paper's advice (§4.3: "where entry
        tokenizations do not coincide, the assembly path is the cheaper thing to fix"), an option beside
        the released assembly (`KVCommConfig.assembly`)."""
        ids: dict[str, list[int]] = {s.name: [] for s in self.segments}
        for token, owner in zip(self.dense_ids, self.dense_segment_of):
            ids[owner].append(token)
        empty = [s.name for s in self.segments if s.placeholder and not ids[s.name]]
        if empty:
            raise ValueError(f"aligned assembly: no token of Dense's starts in placeholder {empty[0]!r}")
        segments = [replace(s, ids=ids[s.name]) for s in self.segments if ids[s.name]]
        return replace(self, segments=segments)

    def segment_map(self, dense: bool = False) -> list[dict]:
        """Which token rows belong to which segment: [{name, start, stop, placeholder}]."""
        if not dense:
            spans, start = [], 0
            for s in self.segments:
                spans.append({"name": s.name, "start": start, "stop": start + len(s.ids), "placeholder": s.placeholder})
                start += len(s.ids)
            return spans
        spans = []
        for row, name in enumerate(self.dense_segment_of):
            if spans and spans[-1]["name"] == name:
                spans[-1]["stop"] = row + 1
            else:
                spans.append(
                    {
                        "name": name,
                        "start": row,
                        "stop": row + 1,
                        "placeholder": PLACEHOLDER.fullmatch("{" + name + "}") is not None,
                    }
                )
        return spans


def base_header(tokenizer) -> str:
    """The text between a system turn's content and a user turn's content in the chat template."""
    sys_mark, user_mark = "\x01SYSTEM\x01", "\x02USER\x02"
    text = render(tokenizer, sys_mark, user_mark)
    return text[text.index(sys_mark) + len(sys_mark) : text.index(user_mark)]


def begin_of_text(tokenizer) -> str:
    """The model's begin-of-text token where its prompts open with one, else "".

    A begin-of-text token opens a rendered conversation once (Llama 3's `<|begin_of_text|>`, Mistral's
    `<s>`, Gemma's `<bos>`); a tokenizer whose "BOS" opens every turn (SmolLM2's ChatML `<|im_start|>`)
    names a turn marker, which the user-turn header already ends with, so it adds nothing."""
    bos = tokenizer.bos_token
    text = render(tokenizer, "\x01SYSTEM\x01", "\x02USER\x02")
    return bos if bos and text.startswith(bos) and text.count(bos) == 1 else ""


def base_prefix(tokenizer) -> str:
    """What a segment's base cache is computed behind: begin-of-text, then the user-turn header.

    The released KVCOMM renders every anchor's segment as begin-of-text + user header + content
    (`include_begin=True`) and drops the header rows by count: a segment's first token never stands
    where the model only ever sees its begin-of-text token (the attention sink). Without it, Gemma 3
    270M's unrepaired reuse leaves about 7x the KL to Dense (docs/design.md §2)."""
    return begin_of_text(tokenizer) + base_header(tokenizer)


def render(tokenizer, system: str, user: str, example: tuple[str, str] | None = None) -> str:
    messages = [{"role": "system", "content": system}]
    if example is not None:
        messages += [{"role": "user", "content": example[0]}, {"role": "assistant", "content": example[1]}]
    return render_messages(tokenizer, [*messages, {"role": "user", "content": user}])


def tokenize(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def build_prompt(tokenizer, template: Template, values: dict[str, str]) -> Prompt:
    """Fill a template's placeholders and tokenize it both ways."""
    rendered = render(tokenizer, template.system, template.user, template.example)
    pieces = PLACEHOLDER.split(rendered)  # text, name, text, name, ..., text
    texts, names = pieces[0::2], pieces[1::2]
    for name in names:
        if name not in values:
            raise ValueError(f"no value for placeholder {{{name}}} in {template.node}'s prompt")
        if not values[name].strip():
            raise ValueError(f"placeholder {{{name}}} in {template.node}'s prompt has an empty value")

    segments = [Segment("prefix", texts[0], tokenize(tokenizer, texts[0]), False)]
    for name, after in zip(names, texts[1:]):
        segments.append(Segment(name, values[name], tokenize(tokenizer, values[name]), True))
        if after:
            segments.append(Segment(f"after:{name}", after, tokenize(tokenizer, after), False))

    full_text = "".join(s.text for s in segments)
    encoded = tokenizer(full_text, add_special_tokens=False, return_offsets_mapping=True)
    return Prompt(
        template, full_text, encoded["input_ids"], segments, owner_of_tokens(segments, encoded["offset_mapping"])
    )


def owner_of_tokens(segments: list[Segment], offsets) -> list[str]:
    """For each dense token, the segment its first character falls in."""
    bounds, end = [], 0
    for s in segments:
        end += len(s.text)
        bounds.append((end, s.name))
    owners, k = [], 0
    for start, _ in offsets:
        while k < len(bounds) - 1 and start >= bounds[k][0]:
            k += 1
        owners.append(bounds[k][1])
    return owners


def tokenization_diff(tokenizer, dense_ids: list[int], merged_ids: list[int]) -> list[dict]:
    """Where the reuse path's ids differ from the Dense path's: one entry per differing span."""
    matcher = difflib.SequenceMatcher(a=dense_ids, b=merged_ids, autojunk=False)
    return [
        {
            "op": op,
            "dense_rows": (a0, a1),
            "merged_rows": (b0, b1),
            "dense_tokens": tokenizer.convert_ids_to_tokens(dense_ids[a0:a1]),
            "merged_tokens": tokenizer.convert_ids_to_tokens(merged_ids[b0:b1]),
        }
        for op, a0, a1, b0, b1 in matcher.get_opcodes()
        if op != "equal"
    ]
