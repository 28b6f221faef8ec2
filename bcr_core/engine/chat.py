"""How a model's conversations are rendered to text: its tokenizer's chat template, or the plain-text
one for a base model that carries none. Dense, the reuse path's segments, base caches' header and
`Backbone.chat_ids` all render through here, so every path of one model sees the same text.
"""

from __future__ import annotations

# The template of a tokenizer that carries none: the same segments as a chat template (system text, the
# user turn, the assistant's cue) in plain text, for a base model such as Gemma 3 270M, whose gguf has no
# chat template and which was trained on plain text, not on turn markers. Each turn ends in a blank line,
# the BOS token opens the prefix (as Gemma's own chat template and its pretraining documents do), and the cue
# is "Answer:". Measured on Gemma 3 270M, 10 synthetic items (seed 1): this cue answered 10/10; the same
# text with a single newline before the cue 8/10, "Question:\n" before the user turn 7/10, and
# "User:"/"Assistant:" turns 0/6 (it continues the record list, as a base model continues a document).
PLAIN_TEMPLATE = (
    "{{ bos_token if bos_token else '' }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}Answer: {{ message['content'] }}\n\n"
    "{% else %}{{ message['content'] }}\n\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Answer:{% endif %}"
)


def chat_template(tokenizer) -> str:
    """The template a model's prompts are rendered with: the tokenizer's own chat template when it has
    one (SmolLM2's ChatML, any instruct model's), else `PLAIN_TEMPLATE` (a base model, e.g. Gemma 3
    270M). Dense, the reuse path's segments, base caches' header and `Backbone.chat_ids` all read this,
    so every path of one model renders the same text; only the tokenization differs (module docstring)."""
    return tokenizer.chat_template or PLAIN_TEMPLATE


def render_messages(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """A conversation rendered through `chat_template(tokenizer)`."""
    return tokenizer.apply_chat_template(
        messages,
        chat_template=chat_template(tokenizer),
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
    )
