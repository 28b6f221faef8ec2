"""The FullConnected topology: agents 1..N as a DAG i -> j for i < j, plus a FinalRefer node
fed by every agent (docs/design.md §3). Agent j's user turn carries the task and agents 1..j-1's
outputs; the final node's carries the task and all N outputs, so the task is prefilled N + 1
times and agent i's output N - i + 1 times.
"""

from __future__ import annotations

from bcr_core.data import benchmarks
from bcr_core.data.roles import DEFAULT_PROMPT, PROMPTS, RoleSet
from bcr_core.reuse.prompts import QUESTION, Template, agent_placeholder
from bcr_core.setting_kinds import SettingError

MIN_AGENTS, MAX_AGENTS = 2, 5
FINAL = "final"


def user_turn(predecessors: list[tuple[int, str]], instruction: str, task: str = "{" + QUESTION + "}") -> str:
    text = "Task:\n" + task + "\n"
    if predecessors:
        text += "\nAnswers from the other agents:\n"
        for i, role in predecessors:
            text += f"\nAgent {i} ({role}):\n{{{agent_placeholder(i)}}}\n"
    return text + "\n" + instruction


def full_connected(
    benchmark: str, n_agents: int, pinned: str | None = None, prompt: str = DEFAULT_PROMPT
) -> list[Template]:
    """The templates of one request, in execution order (agents 1..N, then the final node). Under the
    `one-shot` prompt every template opens with the benchmark's worked example: the example task in an
    agent's user turn, then its answer (`RoleSet.example`)."""
    if not MIN_AGENTS <= n_agents <= MAX_AGENTS:
        raise SettingError("agents", f"agent count must be between {MIN_AGENTS} and {MAX_AGENTS}, got {n_agents}")
    roles = benchmarks.get(benchmark).roles
    example = worked_example(benchmark, roles, prompt)
    names = assign_roles(roles, n_agents, pinned)
    templates = []
    for j, role in enumerate(names, start=1):
        predecessors = list(enumerate(names[: j - 1], start=1))
        user = user_turn(predecessors, roles.instruction)
        templates.append(Template(f"agent_{j}", role, roles.roles[role], user, example))
    every = list(enumerate(names, start=1))
    templates.append(Template(FINAL, "FinalRefer", roles.final, user_turn(every, roles.final_instruction), example))
    return templates


def worked_example(benchmark: str, roles: RoleSet, prompt: str) -> tuple[str, str] | None:
    """The (user turn, answer) exchange the prompt puts before the real user turn, or None."""
    if prompt not in PROMPTS:
        raise SettingError("prompt", f"unknown prompt {prompt!r}; the prompts: {', '.join(PROMPTS)}")
    if prompt == "standard":
        return None
    if roles.example is None:
        raise SettingError("prompt", f"benchmark {benchmark} has no worked example, so no one-shot prompt")
    task, answer = roles.example
    return user_turn([], roles.instruction, task), answer


def assign_roles(roles: RoleSet, n_agents: int, pinned: str | None) -> list[str]:
    """Roles cycle over the agents, or every agent gets the pinned role."""
    if pinned is not None:
        if pinned not in roles.roles:
            raise SettingError("pinned", f"unknown role {pinned!r}; this benchmark's roles: {', '.join(roles.roles)}")
        return [pinned] * n_agents
    cycle = list(roles.roles)
    return [cycle[i % len(cycle)] for i in range(n_agents)]
