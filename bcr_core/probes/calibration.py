"""Choosing the prompt and stop rule a model's grid runs under, before the grid runs (`bcr calibrate`).

Each candidate (a `prompt` and a `stop` rule, `data.roles.PROMPTS` x `engine.stopping.SHORT_ANSWER_RULES`)
serves Dense's multi-agent pipeline on synthetic items of an item seed the grid never uses, twice per item:
with the record list (the task) and without it (the no-record control: the question alone, scored against
the same record values, so a prompt that lets the model answer without reading scores above chance there).
Beside each candidate's accuracy stands its seam share: the share of calls whose reuse-path ids equal Dense's, so a
candidate that hides the tokenization seam shows it.

The rule (`choose`), fixed before any candidate is run: the candidate with the highest Dense accuracy whose
no-record accuracy is at most `NO_RECORD_MAX`; the goal is a Dense accuracy of at least `GOAL`. Records are
appended per item and a rerun resumes them.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from bcr_core.agents.pipeline import Pipeline
from bcr_core.analysis.statistics.binary import wilson_ci
from bcr_core.data import benchmarks, synthetic
from bcr_core.data.roles import PROMPTS
from bcr_core.engine.stopping import SHORT_ANSWER_RULES
from bcr_core.errors import UsageError
from bcr_core.paths import write_text_whole
from bcr_core.reuse.servers import DenseServer
from bcr_core.run_folder import append_jsonl, numbered_jsonl, rewrite_jsonl
from bcr_core.setting_kinds import differences

CANDIDATES = tuple((prompt, stop) for prompt in PROMPTS for stop in SHORT_ANSWER_RULES)
CONTROLS = ("records", "no-records")
GOAL = 0.5  # Dense accuracy in the pipeline the chosen candidate should reach
NO_RECORD_MAX = 0.10  # near chance: the record values are eight, one of them right, and most answers name none
RECORDS = "records.jsonl"


def calibrate(
    bb,
    out: Path,
    n: int = 50,
    item_seed: int = 1,
    agents: int = 3,
    max_new_tokens: int = 8,
    candidates=CANDIDATES,
    progress: bool = True,
) -> pd.DataFrame:
    """Run (or resume) every candidate on the first `n` items of `item_seed`; returns `calibration_table`."""
    if n < 1:
        raise UsageError(f"--n must be >= 1, got {n}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / RECORDS
    rows, torn = numbered_jsonl(path)
    records = [row for _, row in rows]
    if torn:
        rewrite_jsonl(path, records)
    settings = {"agents": agents, "max_new_tokens": max_new_tokens, "item_seed": item_seed}
    for row in records:
        if {key: row[key] for key in settings} != settings:
            found = differences({key: row[key] for key in settings}, settings)
            raise UsageError(f"{path} holds records of other settings ({found}); use another --out")
    done = {(r["prompt"], r["stop"], r["control"], r["item_id"]) for r in records}
    items = benchmarks.load_items("synthetic", n, seed=item_seed)
    bar = tqdm(total=len(candidates) * len(items) * len(CONTROLS), initial=len(done), disable=not progress)
    for prompt, stop in candidates:
        pipeline = Pipeline(bb, "synthetic", agents, max_new_tokens, prompt=prompt, stop=stop)
        for index, item in enumerate(items):
            for control in CONTROLS:
                if (prompt, stop, control, item["id"]) in done:
                    continue
                question = item["question"] if control == "records" else synthetic.question_only(item)
                request = pipeline.run(DenseServer(bb), item["id"], question)
                record = settings | {
                    "prompt": prompt,
                    "stop": stop,
                    "control": control,
                    "item_id": item["id"],
                    "index": index,
                    "correct": bool(synthetic.score_answer(request.final_text, item)["correct"]),
                    "calls": [
                        {
                            "node": c.node,
                            "output_text": c.output_text,
                            "tokens": len(c.output_tokens),
                            "ids_match": c.dense_ids == c.merged_ids,
                        }
                        for c in request.calls
                    ],
                }
                append_jsonl(path, [record])
                records.append(record)
                bar.update(1)
    bar.close()
    table = calibration_table(records)
    write_text_whole(out / "table.csv", table.to_csv(index=False))
    return table


def calibration_table(records: list[dict]) -> pd.DataFrame:
    """Per candidate: items, Dense accuracy (the final answer's) with its Wilson 95% interval, the no-record
    accuracy, and over the task's calls the share whose reuse-path ids equal Dense's and the mean answer
    length in tokens."""
    frame = pd.DataFrame(records)
    rows = []
    for (prompt, stop), group in frame.groupby(["prompt", "stop"], sort=False):
        task = group[group.control == "records"]
        control = group[group.control == "no-records"]
        calls = [c for calls in task.calls for c in calls]
        k, m = int(task.correct.sum()), len(task)
        lo, hi = wilson_ci(k, m)
        rows.append(
            {
                "prompt": prompt,
                "stop": stop,
                "items": m,
                "dense_accuracy": k / m,
                "dense_accuracy_lo": lo,
                "dense_accuracy_hi": hi,
                "no_record_accuracy": float(control.correct.mean()) if len(control) else float("nan"),
                "ids_match_share": sum(c["ids_match"] for c in calls) / len(calls),
                "tokens_per_call": sum(c["tokens"] for c in calls) / len(calls),
            }
        )
    return pd.DataFrame(rows)


def choose(table: pd.DataFrame) -> pd.Series:
    """The rule in the module docstring: the most accurate candidate whose no-record accuracy is near chance
    (the least accurate no-record one if none is)."""
    near_chance = table[table.no_record_accuracy <= NO_RECORD_MAX]
    pool = near_chance if len(near_chance) else table.nsmallest(1, "no_record_accuracy")
    return pool.sort_values("dense_accuracy", ascending=False, kind="stable").iloc[0]


# ------------------------------------------------------------------------------- a decoding budget
SLACK_ITEMS = 1  # a candidate may pass this many tasks fewer than the longest budget and still be chosen


def budget_table(folders: dict[str, Path]) -> pd.DataFrame:
    """Per candidate (a run folder of Dense alone, named by its grid cell), on the items every candidate
    finished: its stop rule and cap, items, tasks passed (with the Wilson 95% interval of pass@1), new tokens
    per item (over all its calls) and the share of calls that ran to the cap."""
    from bcr_core.run_folder import RunFolder

    runs = {name: RunFolder(Path(path)) for name, path in folders.items()}
    items = {name: {r["item_id"]: r for r in run.items() if r["condition"] == "dense"} for name, run in runs.items()}
    shared = set.intersection(*(set(found) for found in items.values())) if items else set()
    rows = []
    for name, run in runs.items():
        cap = run.settings["max_new_tokens"]
        calls = [c for c in run.calls() if c["condition"] == "dense" and c["item_id"] in shared]
        passed = sum(bool(items[name][i]["correct"]) for i in shared)
        lo, hi = wilson_ci(passed, len(shared)) if shared else (float("nan"), float("nan"))
        rows.append(
            {
                "candidate": name,
                "stop": run.settings.get("stop", "eos"),
                "max_new_tokens": cap,
                "items": len(shared),
                "passed": passed,
                "pass_at_1": passed / len(shared) if shared else float("nan"),
                "pass_at_1_lo": lo,
                "pass_at_1_hi": hi,
                "tokens_per_item": sum(len(c["output_tokens"]) for c in calls) / max(len(shared), 1),
                "calls_at_cap": sum(len(c["output_tokens"]) >= cap for c in calls) / max(len(calls), 1),
            }
        )
    return pd.DataFrame(rows)


def choose_budget(table: pd.DataFrame, longest: str) -> pd.Series:
    """The rule fixed before the calibration ran: of the candidates passing at most `SLACK_ITEMS` tasks fewer
    than the `longest` budget's on the same items, the one that spends the fewest new tokens per item."""
    floor = int(table.set_index("candidate").loc[longest, "passed"]) - SLACK_ITEMS
    pool = table[table["passed"] >= floor]
    return pool.sort_values("tokens_per_item", kind="stable").iloc[0]


STOP_SAID = {"eos": "end token", "line": "first line", "code": "first code block closed"}


def budget_markdown(table: pd.DataFrame) -> str:
    """`budget_table` as the calibration folder's README shows it."""
    lines = [
        "| candidate | stop | cap | passed | pass@1 [95% CI] | new tokens per item | calls at the cap |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for _, row in table.iterrows():
        interval = f"{100 * row['pass_at_1']:.1f}% [{100 * row['pass_at_1_lo']:.1f}, {100 * row['pass_at_1_hi']:.1f}]"
        lines.append(
            f"| {row['candidate']} | {STOP_SAID[row['stop']]} | {row['max_new_tokens']} | {row['passed']} / "
            f"{row['items']} | {interval} | {row['tokens_per_item']:,.1f} | {100 * row['calls_at_cap']:.1f}% |"
        )
    return "\n".join(lines)


def budget_report(folders: list[Path], out: Path | None = None) -> None:
    """`bcr report budget`: each folder a candidate's Dense run (the first the longest budget, the one the rule
    measures against), the table printed with the candidate the rule chooses; with `out`, table.csv written there."""
    table = budget_table({folder.name: folder for folder in folders})
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_text_whole(out / "table.csv", table.to_csv(index=False))
    chosen = choose_budget(table, folders[0].name)["candidate"]
    print(f"{budget_markdown(table)}\n\nThe rule (at most {SLACK_ITEMS} task fewer than {folders[0].name}, then the")
    print(f"fewest new tokens per item) chooses **{chosen}**.")
