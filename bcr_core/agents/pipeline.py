"""A multi-agent request: the FullConnected graph's calls in order, each served by one server.

    bb = Backbone.load()
    pipeline = Pipeline(bb, "gsm8k", n_agents=3, max_new_tokens=128)
    dense, kvcomm = DenseServer(bb), KVCommServer(bb)
    for item in items:
        a = pipeline.run(dense, item_id, question)
        b = pipeline.run(kvcomm, item_id, question)   # the anchor pool warms up across items

A server keeps its state (KVComm's anchor pool) across requests, so one server must see the
items of a run in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bcr_core.agents.graph import FINAL, full_connected
from bcr_core.data.roles import DEFAULT_PROMPT
from bcr_core.engine.capacity import check_rows_fit
from bcr_core.engine.stopping import DEFAULT_RULE, stop_rule
from bcr_core.errors import UsageError
from bcr_core.reuse.calls import CallRecord, drive, stopping
from bcr_core.reuse.fidelity import call_fidelity
from bcr_core.reuse.prompts import QUESTION, agent_placeholder, build_prompt

NO_ANSWER = "(no answer)"  # stands in for an empty agent output: a placeholder cannot be empty


@dataclass
class RequestRecord:
    item_id: str
    benchmark: str
    condition: str
    calls: list[CallRecord] = field(default_factory=list)

    @property
    def final_text(self) -> str:
        return self.calls[-1].output_text

    @property
    def reuse_rate(self) -> float:
        return sum(c.mode == "reuse" for c in self.calls) / len(self.calls)

    def to_dict(self) -> dict:
        return {
            "item_id": self.item_id,
            "benchmark": self.benchmark,
            "condition": self.condition,
            "final_text": self.final_text,
            "calls": [c.to_dict() for c in self.calls],
        }


class Pipeline:
    def __init__(
        self,
        bb,
        benchmark: str,
        n_agents: int = 3,
        max_new_tokens: int = 512,
        pinned: str | None = None,
        prompt: str = DEFAULT_PROMPT,
        stop: str = DEFAULT_RULE,
    ):
        """`prompt` picks the templates' form (`data.roles.PROMPTS`), `stop` the rule every call's decoding
        ends by (`engine.stopping.RULES`), the same for every server the pipeline serves."""
        if max_new_tokens < 1:
            raise UsageError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        context = getattr(bb.config, "max_position_embeddings", None)
        if isinstance(context, int) and max_new_tokens >= context:
            raise UsageError(
                f"--max-new-tokens {max_new_tokens} does not fit the model's context of {context} tokens "
                "(config max_position_embeddings), which also holds the prompt; give fewer"
            )
        check_rows_fit(bb, max_new_tokens, f"--max-new-tokens {max_new_tokens}")
        self.bb = bb
        self.benchmark = benchmark
        self.templates = full_connected(benchmark, n_agents, pinned, prompt)
        self.max_new_tokens = max_new_tokens
        self.stop_rule = stop_rule(stop, bb.tokenizer)

    def prompts(self, question: str, outputs: dict[str, str]):
        """The prompt of every node whose inputs are all in `outputs` (for inspection)."""
        values = {QUESTION: question, **outputs}
        return [
            build_prompt(self.bb.tokenizer, t, values)
            for t in self.templates
            if all(p in values for p in t.placeholders)
        ]

    def run(self, server, item_id: str, question: str, reference=None, keep_caches: bool = False) -> RequestRecord:
        """Serve every node in order, feeding each agent's output to its successors.

        With a `reference` server (Dense), every call's prompt is also served by it and the call
        records its in-situ fidelity: identical output, first-token agreement, teacher-forced KL.
        """
        return drive(self.bb, self.steps(server, item_id, question, reference, keep_caches))

    def steps(self, server, item_id: str, question: str, reference=None, keep_caches: bool = False):
        """`run` as steps that yield every call's `Decode` requests (for the batched runner)."""
        if not question.strip():
            raise UsageError(f"item {item_id} has an empty question")
        values = {QUESTION: question}
        record = RequestRecord(str(item_id), self.benchmark, server.name)
        for i, template in enumerate(self.templates, start=1):
            prompt = build_prompt(self.bb.tokenizer, template, values)
            call = yield from stopping(server.steps(prompt, self.max_new_tokens), self.stop_rule)
            if reference is not None:
                dense = yield from stopping(reference.steps(prompt, self.max_new_tokens), self.stop_rule)
                call.fidelity = call_fidelity(self.bb, dense, call, getattr(reference, "log_probs", None))
            if not keep_caches:
                call.served = None
            record.calls.append(call)
            if template.node != FINAL:
                values[agent_placeholder(i)] = call.output_text if call.output_text.strip() else NO_ANSWER
        return record
