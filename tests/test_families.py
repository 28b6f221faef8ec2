"""`bcr verify` on a config-only model of every supported family: exact repair, exact re-rotation."""

import json

import pytest
from conftest import FAMILIES, tiny_family_config

from bcr_core.engine.backbone import Backbone
from bcr_core.probes.verify import verify

EMBEDDED_VOCAB = 49152  # config-only models speak the embedded model's tokenizer


@pytest.mark.parametrize("family", FAMILIES)
def test_verify_passes_on_a_config_only_model(family, tmp_path, chat_tokenizer):
    config = tiny_family_config(
        family,
        vocab_size=EMBEDDED_VOCAB,
        eos_token_id=chat_tokenizer.eos_token_id,
        bos_token_id=chat_tokenizer.bos_token_id,
        pad_token_id=chat_tokenizer.eos_token_id,
        initializer_range=0.1,
    )
    config.save_pretrained(tmp_path)
    bb = Backbone.load(f"config:{tmp_path}", device="cpu")
    assert bb.config.model_type == family
    report = verify(bb)
    print(
        family,
        json.dumps(
            {
                k: report.to_dict()[k]
                for k in (
                    "repair_max_abs_err",
                    "rerotation_max_abs_err",
                    "corruption_max_abs_err",
                    "unrepaired_token_identical",
                )
            }
        ),
    )
    assert report.passed, report.to_dict()
    assert report.repair_max_abs_err < 1e-4
    assert report.corruption_max_abs_err > 1e-2  # the corruption was real, so the repair had work to do
