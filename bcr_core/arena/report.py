"""The arena's tables as the README shows them, from a run folder or its compact copy.

`python -m bcr_core.arena.report results/arena` prints the per-selector table at BCR-chunk's own
count (per-item KL with its interval, the share of the achievable gain, per-call rates, rows and
cost) and one line per verdict; a test checks that every line of it is in the README.
"""

from __future__ import annotations

import sys

import pandas as pd

from bcr_core.analysis.claims_report import p_text
from bcr_core.arena import measures


def selector_markdown(frame: pd.DataFrame) -> str:
    table = measures.selector_table(frame)
    shares = measures.gap_share(frame)[1].set_index("selector")
    lines = [
        f"On {table['items'].iloc[0]} items, {frame.drop_duplicates(['item_id', 'node']).shape[0]} assembled calls, "
        "every selector at BCR-chunk's own row count on each call:",
        "",
        "| selector | KL to Dense per item [95% CI] | share of the achievable gain [95% CI] | first-token agree % | "
        "identical continuation % | rows / call | wasted rows / call | passes | ms / call |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in table.itertuples():
        share = ""
        if r.selector in shares.index and not pd.isna(shares.loc[r.selector, "gap_share"]):
            s = shares.loc[r.selector]
            share = f"{100 * s.gap_share:.0f}% [{100 * s.lo:.0f}, {100 * s.hi:.0f}]"
        lines.append(
            f"| `{r.selector}` | {r.kl_per_item:.4f} [{r.kl_lo:.4f}, {r.kl_hi:.4f}] | {share} | "
            f"{100 * r.first_token_agree:.1f} | {100 * r.identical:.1f} | {r.rows_per_call:.1f} | "
            f"{r.rows_wasted_per_call:.1f} | {r.passes:.1f} | {r.ms_per_call:.0f} |"
        )
    return "\n".join(lines)


def verdict_markdown(frame: pd.DataFrame) -> str:
    """One line per verdict: the claim, its effect and interval (+ = less KL), raw and Holm p."""
    lines = []
    for r in measures.verdicts(frame).itertuples():
        effect = "" if pd.isna(r.effect) else f" ({r.effect:+.4f} [{r.ci_lo:+.4f}, {r.ci_hi:+.4f}]"
        effect += "" if not effect else f", p {p_text(r.p)}, Holm {p_text(r.p_holm)})"
        on = f", read on the {r.read_on}" if isinstance(r.read_on, str) and r.read_on else ""
        lines.append(f"- {r.claim}: **{r.verdict}**{effect}{on}")
    return "\n".join(lines)


def markdown(folder) -> str:
    frame = measures.read_arena(folder)
    return selector_markdown(frame) + "\n\n" + verdict_markdown(frame)


if __name__ == "__main__":
    print(markdown(sys.argv[1] if len(sys.argv) > 1 else "results/arena"))
