"""Where the tokenization tax comes from: the seams at which the reuse path's ids part from Dense's.

The reuse path tokenizes each segment of a prompt on its own (the template's text, the question, each
earlier agent's answer) and concatenates the ids; Dense tokenizes the whole text once through the chat
template. Where a segment boundary falls inside what the whole text's tokenizer makes one token (the
":\\n\\n\\n" after a HumanEval docstring, the "```\\n\\n" after an earlier agent's code block), the two id
sequences differ there. `seams` finds each differing span of one call (model-free, on ids); `seam_rows`
puts the text on each side with a tokenizer, and `seam_counts` counts each kind (the text Dense makes of it)
over a cell's calls.
"""

from __future__ import annotations

import difflib
import json

import pandas as pd


def seam_spans(dense_ids: list[int], merged_ids: list[int]) -> list[tuple[int, int, int, int]]:
    """Each span where the two id sequences differ, as (Dense's start, stop, the reuse path's start, stop)."""
    matcher = difflib.SequenceMatcher(a=dense_ids, b=merged_ids, autojunk=False)
    return [(a0, a1, b0, b1) for op, a0, a1, b0, b1 in matcher.get_opcodes() if op != "equal"]


def seams(dense_ids: list[int], merged_ids: list[int]) -> list[tuple[list[int], list[int]]]:
    """Each span where the two id sequences differ: (Dense's ids there, the reuse path's ids there)."""
    return [(dense_ids[a0:a1], merged_ids[b0:b1]) for a0, a1, b0, b1 in seam_spans(dense_ids, merged_ids)]


def seam_rows(calls: list[dict], tokenizer) -> pd.DataFrame:
    """One row per seam of each call that holds both id lists: its call, Dense's text and tokens there, the
    reuse path's tokens there and their text (each decoded alone by the model's tokenizer, whatever its kind of
    tokens: byte-level, SentencePiece), and the seam's kind (Dense's text, escaped)."""
    rows = []
    for call in calls:
        if "merged_ids" not in call:
            continue
        for dense, merged in seams(call["dense_ids"], call["merged_ids"]):
            text = tokenizer.decode(dense)
            rows.append(
                {
                    "condition": call["condition"],
                    "item_id": call["item_id"],
                    "node": call["node"],
                    "kind": repr(text),
                    "dense_tokens": tokenizer.convert_ids_to_tokens(dense),
                    "merged_tokens": tokenizer.convert_ids_to_tokens(merged),
                    "merged_pieces": [tokenizer.decode([i]) for i in merged],
                    "length_change": len(merged) - len(dense),
                }
            )
    return pd.DataFrame(rows)


def seam_counts(rows: pd.DataFrame, calls: int) -> pd.DataFrame:
    """Per kind of seam: how many seams, on how many of the `calls` calls, and the reuse path's split of it
    (its commonest, as a JSON list of the pieces' text)."""
    if rows.empty:
        return pd.DataFrame(columns=["kind", "seams", "calls", "share_of_calls", "reuse_path_split"])
    split = rows["merged_pieces"].map(lambda pieces: json.dumps(pieces, ensure_ascii=False))
    rows = rows.assign(call=rows["item_id"] + "/" + rows["node"], split=split)
    grouped = rows.groupby("kind")
    table = pd.DataFrame(
        {
            "seams": grouped.size(),
            "calls": grouped["call"].nunique(),
            "reuse_path_split": grouped["split"].agg(lambda s: s.mode().iloc[0]),
        }
    )
    table["share_of_calls"] = table["calls"] / calls
    return table.sort_values("seams", ascending=False).reset_index()[
        ["kind", "seams", "calls", "share_of_calls", "reuse_path_split"]
    ]
