"""Write a tiny llama-architecture GGUF that llama.cpp loads and runs: no download needed.

Two layers of width 64 with seeded random weights, a byte-level GPT-2 BPE
tokenizer (the 256 bytes in GPT-2's byte-to-unicode form plus a few merges,
since llama.cpp refuses a BPE vocabulary without merges), ChatML control
tokens with ``<|im_end|>`` as end of sequence, and a ChatML chat template.

Random weights would emit arbitrary bytes, and a lone byte ≥ 0x80 is not
valid UTF-8. So residual dimension 0 is a constant the layers never write to,
and the output layer reads it as a bias: up for printable ASCII tokens, down
for every other one (end of sequence included). Answers are therefore
printable ASCII and always run to ``max_tokens``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

ARCH = "llama"
WIDTH = 64
LAYERS = 2
HEADS = 4
FFN = 128
TRAIN_CONTEXT = 2048
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
MERGES = ("Ġ t", "h e", "i n", "e r")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Residual dimension 0 holds this constant in every position (see the module docstring).
BIAS_LEVEL = 6.0
BIAS_WEIGHT = 3.0


def chatml(messages: Iterable[Mapping[str, object]]) -> str:
    """What ``CHAT_TEMPLATE`` renders for text ``messages`` with a generation prompt."""
    turns = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)
    return turns + f"{IM_START}assistant\n"


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable unicode characters."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {byte: chr(char) for byte, char in zip(printable, chars, strict=True)}


@dataclass(frozen=True)
class Vocabulary:
    """Token texts, their types, merges, and which ids are printable and which are control."""

    tokens: list[str]
    types: list[int]
    merges: list[str]
    printable: np.ndarray
    im_start: int
    im_end: int


def vocabulary() -> Vocabulary:
    """256 byte tokens, one token per merge, then the two ChatML control tokens."""
    to_unicode = byte_to_unicode()
    tokens = [to_unicode[byte] for byte in range(256)]
    printable = [0x20 <= byte <= 0x7E for byte in range(256)]
    for merge in MERGES:
        tokens.append(merge.replace(" ", ""))
        printable.append(True)  # merges of printable ASCII characters
    types = [int(gguf.TokenType.NORMAL)] * len(tokens)
    im_start, im_end = len(tokens), len(tokens) + 1
    tokens += [IM_START, IM_END]
    types += [int(gguf.TokenType.CONTROL)] * 2
    printable += [False, False]
    return Vocabulary(tokens, types, list(MERGES), np.array(printable), im_start, im_end)


@dataclass(frozen=True)
class Shape:
    """A model's size: the tiny default, or a larger one whose steps take milliseconds
    (the fidelity benchmark's, so HTTP is not most of a request's time)."""

    width: int = WIDTH
    layers: int = LAYERS
    heads: int = HEADS
    ffn: int = FFN


def _weights(vocab: Vocabulary, seed: int, shape: Shape) -> dict[str, np.ndarray]:
    """Every tensor, in numpy's (rows = outputs) order, which GGUF stores reversed."""
    width, ffn = shape.width, shape.ffn
    rng = np.random.default_rng(seed)
    n_vocab = len(vocab.tokens)

    def normal(rows: int, cols: int, scale: float) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    embed = normal(n_vocab, width, 1.0)
    embed[:, 0] = BIAS_LEVEL
    output = normal(n_vocab, width, 0.3)
    output[:, 0] = np.where(vocab.printable, BIAS_WEIGHT, -BIAS_WEIGHT)
    tensors = {
        "token_embd.weight": embed,
        "output_norm.weight": np.ones(width, dtype=np.float32),
        "output.weight": output,
    }
    fan_in = width**-0.5
    for layer in range(shape.layers):
        attn_out = normal(width, width, fan_in)
        down = normal(width, ffn, ffn**-0.5)
        attn_out[0, :] = 0.0  # the layers never write to the bias dimension
        down[0, :] = 0.0
        block = f"blk.{layer}."
        tensors |= {
            block + "attn_norm.weight": np.ones(width, dtype=np.float32),
            block + "attn_q.weight": normal(width, width, fan_in),
            block + "attn_k.weight": normal(width, width, fan_in),
            block + "attn_v.weight": normal(width, width, fan_in),
            block + "attn_output.weight": attn_out,
            block + "ffn_norm.weight": np.ones(width, dtype=np.float32),
            block + "ffn_gate.weight": normal(ffn, width, fan_in),
            block + "ffn_up.weight": normal(ffn, width, fan_in),
            block + "ffn_down.weight": down,
        }
    return tensors


def write_tiny_gguf(path: Path, *, seed: int = 0, shape: Shape = Shape()) -> Path:
    """Write the model to ``path`` (same ``seed`` and shape, same bytes) and return ``path``."""
    vocab = vocabulary()
    writer = gguf.GGUFWriter(path, ARCH)
    writer.add_name("sluicegate-tiny")
    writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    writer.add_context_length(TRAIN_CONTEXT)
    writer.add_embedding_length(shape.width)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.heads)
    writer.add_rope_dimension_count(shape.width // shape.heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(vocab.tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_merges(vocab.merges)
    writer.add_bos_token_id(vocab.im_start)
    writer.add_eos_token_id(vocab.im_end)
    # No BOS is prepended, so a prompt's token count is the same whether the engine
    # tokenizes it for generation or for /extras/tokenize/count.
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    for name, tensor in _weights(vocab, seed, shape).items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
