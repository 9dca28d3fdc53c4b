"""tools/make_checkpoint.py's options for repeat-prone random targets: refused with the field
named (nothing written), and lm_head_from_embed / residual_scale do what they say."""
from __future__ import annotations

import pytest
from safetensors.torch import load_file

from _checkpoints import make_checkpoint_module


def test_bad_options_are_refused_before_anything_is_written(tmp_path):
    mc = make_checkpoint_module()
    for kw, field in (({"residual_scale": 0.0}, "residual_scale"), ({"residual_scale": 1.5}, "residual_scale"),
                      ({"shape": "llama-3.2-1b", "lm_head_from_embed": True}, "lm_head_from_embed")):
        out = tmp_path / field / str(len(kw))
        with pytest.raises(ValueError, match=field):
            mc.write_checkpoint(out, **kw)
        assert not any(out.glob("*.safetensors"))


def test_lm_head_copy_and_smaller_residual_writes(tmp_path):
    mc = make_checkpoint_module()
    plain = load_file(str(mc.write_checkpoint(tmp_path / "a") / "model.safetensors"))
    rep = load_file(str(mc.write_checkpoint(tmp_path / "b", lm_head_from_embed=True, residual_scale=0.1)
                        / "model.safetensors"))
    assert rep["lm_head.weight"].equal(rep["model.embed_tokens.weight"])
    o = "model.layers.0.self_attn.o_proj.weight"
    assert rep[o].float().std() < 0.2 * plain[o].float().std()
    q = "model.layers.0.self_attn.q_proj.weight"
    assert rep[q].equal(plain[q])                       # the other draws unchanged


def test_large_tokenizer_is_a_valid_byte_level_bpe(tmp_path):
    mc = make_checkpoint_module()
    tok = mc.build_tokenizer(tmp_path, vocab_size=mc.TRAINED_VOCAB_MAX + 1000)   # synthetic merges
    assert len(tok) == mc.TRAINED_VOCAB_MAX + 1000
    assert tok.convert_ids_to_tokens([0, 1]) == mc.SPECIALS[:2]                   # bos / eos ids as config.json says
    text = "Hello world, the graph token! caf\u00e9"
    assert tok.decode(tok.encode(text)) == text
