"""Saved inspections: `save` writes an `Inspection` to one file and `load` reads it back, so the
explorer opens in seconds without serving anything (`bcr explore`); `find` looks one up by the
settings that decide its content (`KEYS`, the `bcr_core.schema.INSPECTION` settings).

A saved inspection keeps the draft's attention exactly (float32) but not the assembled caches: one
cache is about 23 KB per row in float16 on SmolLM2-135M (30 layers x 3 kv heads x 64 dims, keys and
values) against the attention's 2 KB, so a dozen calls would weigh some 50 MB. It keeps the
microscope's field (every selector's row scores, 4 bytes a row each) and, made with a model, each
call's searched set at the saved setting's count (`microscope.search_at`). The repaired answers a
loaded inspection can show are those decoded before saving: every call unrepaired, and at the
setting it was saved with by the layout, by each selector of the field and by the searched set.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import zipfile
from pathlib import Path

import torch

from bcr_core.agents.pipeline import RequestRecord
from bcr_core.engine.backbone import Draft
from bcr_core.errors import UsageError
from bcr_core.lab import microscope
from bcr_core.lab.inspection import CallView, Inspection
from bcr_core.paths import written_whole
from bcr_core.repair.layouts import LayoutConfig
from bcr_core.reuse.calls import CallRecord, Trace
from bcr_core.schema import INSPECTION

FORMAT = "bcr-inspection/3"  # 2: the microscope's field (`CallView.rankings`); 3: records store nothing implied
KEYS = tuple(INSPECTION)  # the settings that decide what an inspection holds: it is found by them


def settings_of(parameters: dict) -> dict:
    """The `KEYS` of a notebook's parameters: what decides an inspection's content."""
    missing = [k for k in KEYS if k not in parameters]
    if missing:
        raise UsageError(f"an inspection's settings need {', '.join(missing)}; got {', '.join(parameters)}")
    return {k: parameters[k] for k in KEYS}


def file_name(parameters: dict) -> str:
    """The file a saved inspection with these settings has: readable, plus a hash of all of them."""
    s = settings_of(parameters)
    digest = hashlib.sha256(json.dumps(s, sort_keys=True).encode()).hexdigest()[:10]
    return f"{s['benchmark']}-a{s['agents']}-n{s['n']}-t{s['max_new_tokens']}-{s['layout']}@{s['rho']:g}-{digest}.pt"


def save(inspection: Inspection, folder, parameters: dict, bb=None) -> Path:
    """Write `inspection` to `folder`/`file_name(parameters)`. With a model (`bb`), first search
    each call's best set at the saved layout's count (where the view holds Dense's cache) and decode
    every call's unrepaired answer and its answer at the saved layout and rho (BCR's summed score),
    by each selector of the field and by the searched set, so the explorer can show them without a
    model; the caches themselves are not saved."""
    path = Path(folder) / file_name(parameters)
    settings = settings_of(parameters)
    config = LayoutConfig(chunk=settings["chunk"])
    for v in inspection.views:
        chosen = v.select(settings["layout"], settings["rho"], config)
        if bb is not None and v.dense is not None and len(chosen) not in v.searched:
            v.searched[len(chosen)] = microscope.search_at(
                bb, v, len(chosen), settings["chunk"], settings["max_new_tokens"]
            )
        field = microscope.picks(v, len(chosen), settings["chunk"]).values()
        for rows in ([], chosen, *field):
            v.answer_with(bb, rows, settings["max_new_tokens"])
    views = [
        {
            "index": v.index,
            "item_id": v.item_id,
            "node": v.node,
            "tokens": v.tokens,
            "segments": v.segments,
            "dense_text": v.dense_text,
            "answers": [[list(rows), tokens, text] for (rows, tokens), text in v.answers.items()],
            "draft_tokens": list(v.draft_tokens),
            "searched": [{"count": count} | found for count, found in v.searched.items()],
        }
        for v in inspection.views
    ]
    tensors = {"attention": [v.attention.float().contiguous() for v in inspection.views]}
    for name in ("candidates", "scores"):
        tensors[name] = [getattr(v.record.trace, name) for v in inspection.views]
    tensors["rankings"] = [dict(v.rankings) for v in inspection.views]
    document = {
        "format": FORMAT,
        "parameters": settings,
        "condition": inspection.condition,
        "requests": [r.to_dict() for r in inspection.requests],
        "views": views,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with written_whole(path) as partial:
        torch.save({"document": json.dumps(document), "tensors": tensors}, partial)
    return path


def load(path, parameters: dict | None = None) -> Inspection:
    """Read an inspection written by `save`: its requests, and views whose records carry a trace
    (the draft's attention and the scores; the rows are the record's) without the assembled cache. With `parameters`,
    refuse one saved with other settings."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"no saved inspection at {path}")
    try:  # torch's own errors for a file that is not a torch archive, a torn one, or a bad zip
        stored = torch.load(path, weights_only=True)
    except (pickle.UnpicklingError, EOFError, RuntimeError) as err:
        raise UsageError(f"{path} is not a saved inspection ({type(err).__name__}: {err})") from None
    if not (isinstance(stored, dict) and isinstance(stored.get("document"), str) and "tensors" in stored):
        raise UsageError(f"{path} is not a saved inspection (it holds no document and tensors)")
    try:
        document, tensors = json.loads(stored["document"]), stored["tensors"]
    except json.JSONDecodeError as err:
        raise UsageError(f"{path} is not a saved inspection (its document is not JSON: {err})") from None
    if document.get("format") != FORMAT:
        raise UsageError(f"{path} has format {document.get('format')!r}; this lab reads {FORMAT!r}")
    if parameters is not None:
        wanted = settings_of(parameters)
        differ = [k for k in KEYS if document["parameters"].get(k) != wanted[k]]
        if differ:
            k = differ[0]
            raise UsageError(f"{path} was saved with {k}={document['parameters'].get(k)!r}, not {wanted[k]!r}")
    requests = [
        RequestRecord(r["item_id"], r["benchmark"], r["condition"], [CallRecord(**c) for c in r["calls"]])
        for r in document["requests"]
    ]
    views = []
    for i, v in enumerate(document["views"]):
        record = next(c for c in requests[v["index"]].calls if c.node == v["node"])
        draft = Draft(v["draft_tokens"], tensors["attention"][i])
        record.trace = Trace(None, draft, tensors["candidates"][i], tensors["scores"][i])
        answers = {(tuple(rows), tokens): text for rows, tokens, text in v["answers"]}
        views.append(
            CallView(
                v["index"],
                v["item_id"],
                record,
                v["tokens"],
                v["segments"],
                v["dense_text"],
                answers,
                tensors["rankings"][i],
                {found.pop("count"): found for found in v.get("searched", [])},
            )
        )
    return Inspection(document["condition"], requests, views, document["parameters"])


def find(parameters: dict, folders) -> Path | None:
    """The first of `folders` holding a saved inspection with these settings (by file name; `load`
    with the same parameters checks them), else None."""
    name = file_name(parameters)
    found = next((Path(f) / name for f in folders if (Path(f) / name).is_file()), None)
    if found is not None and not zipfile.is_zipfile(found):  # torch.save writes a zip, its index last
        raise UsageError(
            f"{found} is truncated or damaged (not a complete saved inspection); delete it and the requests "
            "are served with the model again"
        )
    return found
