"""The tiny GGUF the real-engine tests run: written deterministically, shaped as llama.cpp
expects."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.realengine.llama_server import SKIP_REASON

gguf = pytest.importorskip("gguf", reason=SKIP_REASON)
pytestmark = pytest.mark.realengine

from tests.realengine.tiny_gguf import (  # noqa: E402
    CHAT_TEMPLATE,
    IM_END,
    LAYERS,
    WIDTH,
    byte_to_unicode,
    vocabulary,
    write_tiny_gguf,
)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_seed_writes_the_same_bytes(tmp_path: Path) -> None:
    """Two writes with one seed are byte-identical; another seed changes the weights."""
    first = write_tiny_gguf(tmp_path / "a.gguf")
    second = write_tiny_gguf(tmp_path / "b.gguf")
    other = write_tiny_gguf(tmp_path / "c.gguf", seed=1)
    assert _digest(first) == _digest(second)
    assert _digest(first) != _digest(other)


def test_byte_map_is_gpt2s_reversible_map() -> None:
    """Every byte maps to a distinct character; printable ASCII maps to itself, space to 'Ġ'."""
    table = byte_to_unicode()
    assert len(set(table.values())) == 256
    assert all(table[b] == chr(b) for b in range(ord("!"), ord("~") + 1))
    assert table[ord(" ")] == "Ġ"


def test_file_holds_the_tokenizer_template_and_tensors_llama_cpp_needs(tmp_path: Path) -> None:
    """Metadata and tensor names as llama.cpp's llama architecture loads them."""
    reader = gguf.GGUFReader(write_tiny_gguf(tmp_path / "tiny.gguf"))

    def text(key: str) -> str:
        return str(reader.fields[key].contents())

    vocab = vocabulary()
    assert text("general.architecture") == "llama"
    assert text("tokenizer.ggml.model") == "gpt2"
    assert text("tokenizer.ggml.pre") == "gpt-2"
    assert text("tokenizer.chat_template") == CHAT_TEMPLATE
    assert reader.fields["tokenizer.ggml.tokens"].contents() == vocab.tokens
    assert len(reader.fields["tokenizer.ggml.merges"].contents()) == len(vocab.merges) > 0
    assert reader.fields["tokenizer.ggml.eos_token_id"].contents() == vocab.tokens.index(IM_END)
    names = {tensor.name for tensor in reader.tensors}
    per_layer = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                 "ffn_gate", "ffn_up", "ffn_down")  # fmt: skip
    expected = {"token_embd.weight", "output_norm.weight", "output.weight"} | {
        f"blk.{i}.{name}.weight" for i in range(LAYERS) for name in per_layer
    }
    assert names == expected
    embed = next(t for t in reader.tensors if t.name == "token_embd.weight")
    assert [int(n) for n in embed.shape] == [WIDTH, len(vocab.tokens)]
