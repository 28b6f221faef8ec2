"""Helpers several test files share: a story long enough to repair, questions about it, a run of a
two-agent pipeline over them with the served caches kept, and a recorder of the matrix products a block
runs."""

import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from bcr_core.agents.pipeline import Pipeline

STORY = (
    "The harbour town kept a ledger of every ship that arrived, with the captain's name, the cargo, the "
    "number of crates and the day of arrival, and the clerks copied each line twice so that nothing was lost. "
    "In the winter the ledger was kept by the harbour master himself, who wrote slowly and checked every sum. "
)
QUESTIONS = [
    STORY + f"On day {d}, how many crates did the ship carrying {c} unload?"
    for d, c in [(3, "salt"), (5, "wool"), (8, "tea"), (2, "iron"), (9, "rice")]
]


def run(bb, server, questions, tokens=5):
    """One request per question, served in order by `server` (its state carried across them)."""
    pipeline = Pipeline(bb, "gsm8k", n_agents=2, max_new_tokens=tokens)
    return [pipeline.run(server, str(i), q, keep_caches=True) for i, q in enumerate(questions)]


class Products(TorchFunctionMode):
    """(rows, input dtype) of every `F.linear` run inside the block, in order."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.linear:
            self.seen.append((args[0].reshape(-1, args[0].shape[-1]).shape[0], args[0].dtype))
        return func(*args, **(kwargs or {}))

    @property
    def rows(self) -> list[int]:
        return [rows for rows, _ in self.seen]
