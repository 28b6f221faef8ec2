"""Role prompts for each benchmark, in our own words, faithful to the released roles (docs/design.md §3).

A role is a system prompt. The user turn is built by `graph.py` from placeholders: the task
(`{user_question}`) and each predecessor's output (`{agent_<i>_current}`). Roles cycle over the
agents unless a run pins one role for every agent. The final node (FinalRefer) reads the task and
every agent's answer and states the final answer in the benchmark's format.
"""

from __future__ import annotations

from dataclasses import dataclass

PROMPTS = ("standard", "one-shot")  # the `prompt` run setting: the turns alone, or one worked example before them
DEFAULT_PROMPT = "standard"


@dataclass(frozen=True)
class RoleSet:
    roles: dict[str, str]  # role name -> system prompt, in cycling order
    final: str  # FinalRefer's system prompt
    instruction: str  # closes every agent's user turn: what to produce
    final_instruction: str  # closes the final node's user turn
    # The `one-shot` prompt's worked example: a task in the question segment's format and its answer, shown as
    # one exchange (user turn, answer) between the system text and the real user turn; None where there is none.
    example: tuple[str, str] | None = None


GSM8K = RoleSet(
    roles={
        "Math Solver": "You are a math solver. Work through the problem step by step, with short clear "
        "calculations, and state the final number at the end.",
        "Mathematical Analyst": "You are a mathematical analyst. Identify the quantities and how they relate, "
        "then compute the result carefully and state the final number.",
        "Programming Expert": "You are a programming expert. Reason about the problem as a short computation, "
        "as you would in code, and state the final number it produces.",
        "Inspector": "You are an inspector. Check the other answers for mistakes in reasoning or arithmetic, "
        "correct them, and state the final number you trust.",
    },
    final="You are the final decision maker. Read the problem and the answers of other agents, decide "
    "which answer is right, and give it.",
    instruction="Solve the problem. End with: The answer is <number>.",
    final_instruction="Give the final answer. End with: The answer is <number>.",
)

MMLU = RoleSet(
    roles={
        "Knowledgeable Expert": "You are a knowledgeable expert. Answer the multiple-choice question using what "
        "you know, briefly explaining why.",
        # The released Wiki Searcher spliced a live web page into its prompt; here it runs offline with no article.
        "Wiki Searcher": "You are a wiki searcher. No article is available, so recall what an encyclopedia says "
        "about the key terms of the question, then answer it.",
        "Critic": "You are a critic. Look for flaws in the other answers, then choose the option you find best "
        "supported.",
        "Mathematician": "You are a mathematician. Where the question involves quantities or logic, reason it "
        "through exactly, then choose an option.",
        "Historian": "You are a historian. Use historical and social context where it helps, then choose an option.",
    },
    final="You are the final decision maker. Read the question and the other agents' answers, and choose the "
    "single best option.",
    instruction="Choose one option. End with: The answer is <letter>.",
    final_instruction="Give the final choice. End with: The answer is <letter>.",
)

HUMANEVAL = RoleSet(
    roles={
        "Project Manager": "You are a project manager. Outline what the function must do, its edge cases, and "
        "then write the complete Python function.",
        "Algorithm Designer": "You are an algorithm designer. Choose a simple correct algorithm for the task and "
        "write the complete Python function.",
        "Programming Expert": "You are a programming expert. Write a correct, complete Python implementation of "
        "the function.",
        "Test Analyst": "You are a test analyst. Think about inputs that could break the other solutions, then "
        "write a complete Python function that handles them.",
        "Bug Fixer": "You are a bug fixer. Find and fix any bugs in the other solutions and write the complete "
        "corrected Python function.",
    },
    final="You are the final decision maker. Read the task and the candidate solutions, and write the single "
    "best complete Python function.",
    instruction="Write the complete function in one ```python code block.",
    final_instruction="Write the final complete function in one ```python code block.",
)

COPY = RoleSet(
    roles={"Copy Machine": "You are a copy machine. Repeat the text you are given exactly, adding nothing."},
    final="You are a copy machine. Repeat the text you are given exactly, adding nothing.",
    instruction="Repeat the text exactly.",
    final_instruction="Repeat the text exactly.",
)

SYNTHETIC = RoleSet(
    # No "You are a <job>" here: the task asks for people's jobs, and a role noun leaks into the answer.
    roles={
        "Lookup": "Find the line of the list that answers the question and report the value it gives.",
        "Cross-check": "Compare the other answers with the list, and report the value the list really gives.",
        "Line-by-line": "Read the list one line at a time, stop at the line the question asks about, and "
        "report its value.",
    },
    final="Read the list and the other answers, and report the value the list gives for the question.",
    instruction="Answer with the value only.",
    final_instruction="Answer with the value only.",
    # Fields and values outside the task's eight pools and names, so an answer that copies the example is
    # never scored right by chance, and is recognisable.
    example=(
        "Lena plays the violin.\nLena's favourite tool is a hammer.\nLena's boat is called Nimbus.\n\n"
        "What tool does Lena like best?",
        "hammer",
    ),
)
