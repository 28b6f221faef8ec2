"""The TTFT benchmark's protocol (not its timings: no timing assertions in tests)."""

import random

import pandas as pd
import pytest

from bcr_core.experiments.latency import summarize_ttft, symbol_segment, ttft_calls


def test_symbol_segments_have_the_requested_length(chat_tokenizer):
    text = symbol_segment(chat_tokenizer, 300, random.Random(0))
    assert len(chat_tokenizer(text, add_special_tokens=False)["input_ids"]) == 300


def test_every_call_is_served_every_way_and_paired(tiny_chat):
    calls = ttft_calls(tiny_chat, lengths=(300,), rhos=(0.25,), samples=1, progress=False)
    assert set(calls["method"]) == {"dense", "kvcomm", "bcr-chunk", "coin-chunk"}
    assert len(calls) == 5 * 4  # five agents, four methods, one timed request
    assert (calls.groupby("node")["dense_ttft_s"].nunique() == 1).all()  # one Dense reference per call
    repaired = calls[calls.method.isin(["bcr-chunk", "coin-chunk"])]
    m = calls["segment_tokens"].iloc[0]
    assert m == 300 and (repaired["rows"] > 0).all()
    assert (calls[calls.method == "kvcomm"]["rows"] == 0).all()
    table = summarize_ttft(calls)
    assert set(table.columns) >= {"length", "method", "rho", "ttft_ms", "speedup_vs_dense"}
    dense = table[table.method == "dense"].iloc[0]
    assert dense["speedup_vs_dense"] == pytest.approx(1.0) and pd.isna(dense["rho"])
    assert len(table) == 4


def test_samples_must_be_positive(tiny_chat):
    with pytest.raises(ValueError, match="samples"):
        ttft_calls(tiny_chat, lengths=(64,), samples=0)
