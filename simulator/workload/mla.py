"""Attention shapes beyond plain multi-head attention: multi-head latent attention (MLA) and
sliding-window layers, as pure functions of a :class:`ModelConfig`.

MLA (DeepSeek-V2, Liu et al. 2024, Sec. 2.1; DeepSeek-V3 technical report Sec. 2.1.1): queries go
through a low-rank down projection h -> q_lora_rank (when q_lora_rank is set) and an up projection
to nq x (qk_nope + qk_rope); keys and values share one compressed latent h -> kv_lora_rank plus a
decoupled rope key h -> qk_rope (one per token, shared by the heads), and an up projection
kv_lora_rank -> nq x (qk_nope + v_head). The attention core runs with per-head query/key width
qk_nope + qk_rope (192 for V3) and value width v_head (128); the output projection maps nq x v_head
back to h. The KV cache per token per layer is kv_lora_rank + qk_rope elements (576 for V2/V3,
"4.5 d_h" in DeepSeek-V2 Table 1, against 2 nq d_h = 32768 for MHA with 128 heads of 128).

Tensor parallelism (Megatron-core ``MLASelfAttention``): the down projections are replicated on
every TP rank, the up projections are column-parallel over heads and the output projection
row-parallel, so per GPU the up and output GEMMs are split by tp and the down GEMMs are not.
"""

from __future__ import annotations

from simulator.scenario.config import ModelConfig


def mla_gemms(model: ModelConfig, tp: int) -> list[tuple[str, float, float]]:
    """(name, n, k) of each forward GEMM of an MLA block per GPU, for T tokens (m = T)."""
    h, nq = model.hidden_size, model.num_attention_heads
    nope, rope, v = model.qk_nope_head_dim or 0, model.qk_rope_head_dim or 0, model.v_dim
    kv_rank = model.kv_lora_rank or 0
    out: list[tuple[str, float, float]] = []
    if model.q_lora_rank:
        out += [("q_down_proj", model.q_lora_rank, h), ("q_up_proj", nq * (nope + rope) / tp, model.q_lora_rank)]
    else:
        out.append(("q_proj", nq * (nope + rope) / tp, h))
    out += [("kv_down_proj", kv_rank + rope, h), ("kv_up_proj", nq * (nope + v) / tp, kv_rank)]
    return out


def mla_norm_width(model: ModelConfig) -> int:
    """Elements per token of the two latent RMSNorms (q and kv latents)."""
    return (model.q_lora_rank or 0) + (model.kv_lora_rank or 0)


def attention_params(model: ModelConfig) -> int:
    """Weight parameters of one attention block (projections only).

    GQA: h (nq + 2 nkv) d + nq d h (Ainslie et al. 2023). MLA: the five projections above.
    """
    h, nq = model.hidden_size, model.num_attention_heads
    if not model.is_mla:
        hd, nkv = model.head_dim, model.num_key_value_heads
        return h * (nq + 2 * nkv) * hd + nq * hd * h
    return int(sum(n * k for _, n, k in mla_gemms(model, 1))) + nq * model.v_dim * h


def kv_cache_elements_per_token(model: ModelConfig) -> int:
    """KV cache elements per token per layer: kv_lora_rank + qk_rope for MLA, 2 nkv d otherwise."""
    if model.is_mla:
        return (model.kv_lora_rank or 0) + (model.qk_rope_head_dim or 0)
    return 2 * model.num_key_value_heads * model.head_dim


def window_fraction(seq: float, window: int | None) -> float:
    """Fraction of the causal score pairs a sliding-window layer computes.

    Query i attends to min(i + 1, w) keys: about w s - w^2 / 2 pairs against s^2 / 2 for full
    causal attention (Longformer, Beltagy et al. 2020; GPT-OSS alternates w = 128 and full layers).
    """
    if not window or window >= seq:
        return 1.0
    return min(1.0, (2.0 * window * seq - window * window) / (seq * seq))
