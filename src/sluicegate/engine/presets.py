"""Named engine configurations, calibrated from published figures where they exist.

Every number is approximate. Where a figure is derived from bandwidth or FLOP
arithmetic rather than measured, the comment says so. Hardware facts used:
H100 SXM 80 GB — 3.35 TB/s HBM3, 989 TFLOP/s dense BF16 (NVIDIA datasheet);
vLLM's usable GPU memory is ``gpu_memory_utilization`` = 0.9 of ~79.6 GiB.
Cross-checks against published serving benchmarks:

* Lambda Labs, "LLMs inference benchmarks, using vLLM" (github.com/LambdaLabsML/
  vllm-benchmark, benchmark_v0.md): Llama-3.1-8B on 1×H100, vLLM v0.6.0,
  max-num-seqs 256, 8,088 output tok/s at median TPOT 25.6 ms (≈ 207 in flight);
  Llama-3.1-70B on 4×H100 (TP=4), 2,291–3,543 tok/s at median ITL 63.5 ms /
  TPOT 61 ms. Llama-3.1-8B-FP8 on 1×H100 (v0.5.4): 3,400 tok/s at 19.75 ms ITL.
* vLLM blog, "vLLM v0.6.0: 2.7x Throughput Improvement" (blog.vllm.ai/2024/09/05/
  perf-update.html): Llama-3-8B on one H100 "can generate 1 token every 13 ms
  under light load" (v0.5, with its since-removed CPU overhead).
* ``tests/engine/test_engine_presets.py`` runs the 8B preset's engine model at
  these points: its pure-decode step at 207 sequences of ~1k context is 23 ms,
  within 15% below Lambda's 25.6 ms TPOT (which also holds arrivals' prefill
  chunks), and 6.6 ms for one sequence, between the 4.8 ms weight-read floor and
  the blog's 13 ms; no figure needed changing.
* vLLM ``EngineArgs.get_batch_defaults``: on GPUs with ≥ 70 GiB (H100) the
  OpenAI server defaults to ``max_num_seqs`` 1024 and ``max_num_batched_tokens``
  8192; ``block_size`` defaults to 16.
"""

from __future__ import annotations

from sluicegate.engine.engine_config import EngineConfig

PRESETS: dict[str, EngineConfig] = {
    # Llama-3.1-8B, BF16, 1×H100 80 GB, vLLM defaults (1024 seqs, 8192-token budget).
    # KV per token = 2 (K,V) · 32 layers · 8 KV heads · 128 dim · 2 bytes = 128 KiB.
    # KV memory ≈ 0.9 · 79.6 GiB − 15.0 GiB weights − ~2.5 GiB activations ≈ 54 GiB
    #   → ≈ 440k tokens; we use 28,000 blocks of 16 (derived, not measured).
    # base_s: 16.06 GB weights / 3.35 TB/s = 4.8 ms, at ~75% achieved bandwidth
    #   plus launch overhead ≈ 6.5 ms (derived); single-stream decode ≈ 150 tok/s.
    # per_kv_token_s: 128 KiB / (3.35 TB/s · 0.78) ≈ 5e-8 s (derived).
    # per_prefill_token_s: 2 · 8.03 GFLOP / (989 TFLOP/s · ~65% MFU) ≈ 2.5e-5 s (derived),
    #   i.e. ~40k prefill tok/s.
    # per_decode_seq_s: the same 16 GFLOP per token at ~50% plus sampling ≈ 3e-5 s.
    # Cross-check: 207 sequences at ~1k context → 23 ms/step, ~9k tok/s, vs
    #   Lambda's 25.6 ms TPOT and 8,088 tok/s (which includes prefill interference).
    "llama-3.1-8b-h100": EngineConfig(
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
        kv_capacity_tokens=28_000 * 16,
        block_size=16,
        base_s=0.0065,
        per_prefill_token_s=2.5e-5,
        per_decode_seq_s=3.0e-5,
        per_kv_token_s=5.0e-8,
    ),
    # Llama-3.1-70B, BF16, 4×H100 80 GB, tensor parallel 4, vLLM defaults.
    # KV per token = 2 · 80 layers · 8 KV heads · 128 dim · 2 bytes = 320 KiB (80 KiB/GPU).
    # KV memory ≈ 4 · (0.9 · 79.6 − 32.9 weights − ~3) GiB ≈ 143 GiB → ≈ 470k tokens;
    #   we use 29,000 blocks of 16 (derived).
    # base_s: 35 GB weights per GPU / 3.35 TB/s = 10.5 ms, at ~78% ≈ 13.5 ms, plus
    #   ~4 ms for 160 all-reduces per step ≈ 18 ms (derived).
    # per_kv_token_s: 80 KiB / (3.35 TB/s · 0.78) ≈ 3e-8 s (derived).
    # per_prefill_token_s: 141 GFLOP / (4 · 989 TFLOP/s · 55%) ≈ 6.5e-5 s (derived).
    # per_decode_seq_s: 141 GFLOP at ~50% plus TP traffic growing with the batch ≈ 1.2e-4 s.
    # Cross-check: 256 sequences at ~1k context → 56 ms/step, vs Lambda's
    #   63.5 ms median ITL at max-num-seqs 256 (v0.6.0).
    "llama-3.1-70b-4xh100": EngineConfig(
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
        kv_capacity_tokens=29_000 * 16,
        block_size=16,
        base_s=0.018,
        per_prefill_token_s=6.5e-5,
        per_decode_seq_s=1.2e-4,
        per_kv_token_s=3.0e-8,
    ),
    # A toy engine for tests and demos, not calibrated: ~2 ms steps, so real-time
    # emulation of a few hundred short requests finishes in seconds. Its small KV
    # (2,048 blocks = 32k tokens) makes preemption reachable in demos.
    "tiny": EngineConfig(
        max_num_seqs=32,
        max_num_batched_tokens=1024,
        kv_capacity_tokens=2048 * 16,
        block_size=16,
        base_s=0.002,
        per_prefill_token_s=2.0e-6,
        per_decode_seq_s=5.0e-5,
        per_kv_token_s=1.0e-8,
    ),
    # Near-zero compute, not calibrated: 0.2 ms steps and a batch of 256, so a
    # request of a few tokens costs about its HTTP handling. The overhead
    # benchmark puts it behind the gateway so that what it measures is the proxy.
    "instant": EngineConfig(
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        kv_capacity_tokens=65_536 * 16,
        block_size=16,
        base_s=0.0002,
        per_prefill_token_s=1.0e-8,
        per_decode_seq_s=1.0e-7,
        per_kv_token_s=0.0,
    ),
    # The demo's engine, not calibrated: a small, slow replica (16 sequences,
    # ~20 ms decode steps at full batch, ~50 tokens/s per stream) so that a
    # laptop-scale load of tens of requests per second saturates two of them
    # and the queueing in front of them is what the demo shows.
    "demo": EngineConfig(
        max_num_seqs=16,
        max_num_batched_tokens=2048,
        kv_capacity_tokens=4096 * 16,
        block_size=16,
        base_s=0.012,
        per_prefill_token_s=2.0e-5,
        per_decode_seq_s=5.0e-4,
        per_kv_token_s=1.0e-7,
    ),
    # The live precise-prefix benchmark's engine (benchmarks/prefix_precise_live.py), not
    # calibrated: the Llama-3.1-8B/H100 timings slowed ten-fold, so that four emulated
    # replicas, a gateway and the load generator keep real time on a 2-core machine
    # (~15 steps/s each), with a KV cache of 1,000 blocks (16 k tokens), so that a replica
    # holds about 10 of the benchmark's 24 customer contexts of 1,536 tokens and where each
    # customer goes matters.
    "prefix-live": EngineConfig(
        max_num_seqs=64,
        max_num_batched_tokens=8192,
        kv_capacity_tokens=1000 * 16,
        block_size=16,
        base_s=0.065,
        per_prefill_token_s=2.5e-4,
        per_decode_seq_s=3.0e-4,
        per_kv_token_s=5.0e-7,
    ),
    # llama.cpp's llama-server (llama-cpp-python 0.3.36 sdist) serving the tests' tiny GGUF
    # (2 layers, width 64) on this machine type's CPU (2-core x86_64 VM), started as
    # tests/realengine starts it: --parallel 4 (slots), -c 8192 (KV: 2,048 tokens per
    # slot), --threads 1, n_batch 2048 (most tokens per step; a longer prompt is split over
    # steps, as chunked prefill). Measured, not derived: `sluicegate calibrate` against the
    # engine pinned to a core of its own, the client on the other
    # (`python benchmarks/calibrate_llama_server.py --model tiny --repeats 5`, 2026-12-05;
    # table in docs/BENCHMARKS.md, rows in tests/engine/test_preset_llama_server.py).
    # Prefill is superlinear in the prompt (the attention term: 0.5 ms at 16 tokens,
    # 63 ms at 1,843); a decode step costs ~41 µs per sequence plus ~0.30 µs per context
    # token attended. What the formula misses: 3 sequences decode as slowly as 4 (llama.cpp's
    # kernels), and a short prompt's prefill has a fixed ~0.3 ms the step model lacks.
    # No KV preemption: llama-server's slots never share KV, and 4 × 2,048 fit 8,192.
    "llama-server-tiny-cpu": EngineConfig(
        max_num_seqs=4,
        max_num_batched_tokens=2048,
        kv_capacity_tokens=8192,
        block_size=16,
        base_s=5.69e-05,
        per_prefill_token_s=9.35e-06,
        per_decode_seq_s=4.126e-05,
        per_kv_token_s=2.974e-07,
        per_prefill_attn_s=2.373e-08,
        request_overhead_s=0.0009478,
        response_overhead_s=0.0001355,
    ),
    # The same server and set-up serving the fidelity benchmark's larger model (4 layers,
    # width 256, ffn 768: tests/realengine/tiny_gguf.Shape, benchmarks/fidelity_live.SHAPE),
    # whose steps take milliseconds, so HTTP is not most of a request. Calibrated through a
    # sluicegate gateway in front of the pinned engine, so the gateway's relay is in the
    # fixed overheads (`python benchmarks/calibrate_llama_server.py --model small
    # --repeats 5`, 2026-12-05). Fit errors: first token median 2.2%, prefill 3.2%, decode
    # 8.4% (the largest, 32%, is llama.cpp running 3 sequences more slowly than 4).
    "llama-server-small-cpu": EngineConfig(
        max_num_seqs=4,
        max_num_batched_tokens=2048,
        kv_capacity_tokens=8192,
        block_size=16,
        base_s=0.0006216,
        per_prefill_token_s=8.613e-05,
        per_decode_seq_s=0.0001037,
        per_kv_token_s=1.439e-06,
        per_prefill_attn_s=9.132e-08,
        request_overhead_s=0.001786,
        response_overhead_s=7.997e-05,
    ),
    # Eight independent servers for queueing-theory checks (Erlang C, Allen–Cunneen):
    # a request's service time is exactly 0.01 s per output token + 1e-5 s per
    # prompt token (EngineConfig.solo_service_s), whatever else is running.
    "independent": EngineConfig(
        max_num_seqs=8,
        max_num_batched_tokens=8192,
        kv_capacity_tokens=1_000_000,
        block_size=16,
        base_s=0.01,
        per_prefill_token_s=1.0e-5,
        per_decode_seq_s=0.0,
        per_kv_token_s=0.0,
        batch_independent=True,
    ),
}


def preset(name: str) -> EngineConfig:
    """The named engine configuration.

    Raises:
        KeyError: unknown name; the message lists the known ones.
    """
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise KeyError(f"unknown engine preset {name!r}; known presets: {known}") from None
