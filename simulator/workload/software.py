"""Kernel-level software costs that FLOPs and bytes miss: pure functions of a layer's cost and the
resolved framework profile (:class:`simulator.workload.frameworks.Software`).

The reference is stepsim's compute model (``compute.py``): Megatron-core with Transformer Engine,
whose fused kernels (norm, bias+activation, FP8 casts inside LayerNormLinear, multi-tensor Adam)
are the ops it already prices. Each term here is what a framework does *beyond* that reference,
as its own named :class:`Op` (so a ``megatron-core`` profile adds nothing):

- Unfused elementwise ops (eager PyTorch without torch.compile), forward bytes per element; the
  backward moves 2x (compute.py's convention):
  * RMSNorm as torch's composite ``rms_norm`` (aten/src/ATen/native/layer_norm.cpp, torch 2.5-2.6):
    upcast (r2 w4), pow (r4 w4), mean (r4), add-eps and rsqrt (per row, ~0), mul (r4 w4), cast back
    (r4 w2), mul by weight (r2 w2): 36 bytes and 7 kernels against the fused kernel's 4 bytes and 1:
    32 bytes and 6 kernels more per element of the normalised activation.
  * RoPE as complex multiply (torchtitan ``apply_rotary_emb``): float cast (r2 w4), complex multiply
    (r4 w4), cast back (r4 w2) on q and on k: 20 bytes and 3 kernels per element of q and of k,
    beyond the reference's fused kernel (compute.py ``rope``: 4 bytes, one kernel per tensor).
  * SwiGLU as ``silu(gate) * up``: silu (r2 w2) and mul (r2 r2 w2), 10 bytes and 2 kernels against
    the fused 6 bytes and 1: 4 bytes and 1 kernel more per element of the activation output.
    GeLU is one kernel either way (no extra). Residual adds and dropout (0 in these recipes) are
    already what the reference prices.
- FP8 casts, per GEMM and micro-batch, on the tensors a recipe quantises: the input X (m x k),
  the weight W (k x n) and, in the backward, the output gradient dY (m x n), each needed in two
  layouts (Hopper FP8 GEMMs take only the TN layout). Cost per 16-bit element (bytes, kernels):
  * delayed (TE ``cast_transpose``, amax fused, scale from the amax history): r2 w1 w1 = 4, 1.
  * tensorwise (dynamic, torchao Float8Linear / TE Float8CurrentScaling): the amax must be known
    before the cast, so an amax pass (r2, plus a tiny final reduction) then a cast and a transposed
    copy: eager 2 + 3 + 2 = 7 bytes in 4 kernels; compiled, Inductor fuses cast and transpose:
    2 + 4 = 6 bytes in 2 kernels (torchao/float8/float8_scaling_utils.py, float8_linear.py).
  * rowwise (torchao): each orientation has its own scales: two amax passes and two casts,
    2 x (2 + 3) = 10 bytes, 4 kernels eager, 2 compiled.
  * blockwise (TE Float8BlockScaling, 1x128 / 128x128) and mxfp8 (TE MXFP8, 32-element blocks):
    one quantize kernel writes both layouts with local scales: r2 w1 w1 (+ 1 scale byte per 128 or
    per 32 elements per layout) = 4.02 / 4.06 bytes, 1 kernel.
  The reference (TE delayed, LayerNormLinear) pays 4 bytes / 1 kernel for every X except those a
  norm produces (QKV, MLP up: cast fused into the norm, 0), for every dY, and casts each weight once
  per step (amortised to 0 per micro-batch); compute.py prices those as ``*_quantize`` ops
  (``quantize_bytes``). A profile pays its recipe's cost on every tensor, except norm-produced X when
  it fuses casts into producers with a single-pass recipe, and the weight when it caches FP8
  weights over micro-batches; the difference is an ``fp8_cast`` op in the forward and
  ``fp8_cast_bwd`` in the backward.
- Megatron-core's model-specific unfused paths (profile ``model.code: megatron-core``; the reference
  prices the fused kernels, so these are extra ops of their own; ``megatron_layer_extras``), each
  read in Megatron-LM at d7288711 (Megatron-core 0.17.0rc0, the 26.04 NeMo container; the same code
  at 0d8e0714 and d0b3b775, 25.11 and 26.06):
  * RoPE with a YaRN attention factor other than 1 (``model.rope_mscale``, GPT-OSS 1.347):
    rope_utils.py:279-284 falls back to the eager ``_apply_rotary_pos_emb_bshd`` (Megatron-LM PR
    2038, "disable rope fusion when mscale is used"): per element of q and of k, forward t*cos
    (r2 w2), neg of one half (r1 w1), cat of the halves (r2 w2), *sin (r2 w2), the sum (r4 w2) and
    cat with the empty pass-through part (r2 w2), 24 bytes, 6 kernels plus 6 on cos/sin; backward
    the mirrored muls, neg, the sum of the two input gradients and the cats, 24 bytes, 6 kernels.
    (``MEGATRON_ROPE_UNFUSED``, in place of the reference's fused ``rope`` op.)
  * GLU clamp (``model.swiglu_limit``, GPT-OSS 7.0): fused_bias_geglu.py:424-432 clamps the two
    halves of the fc1 output and concatenates them in eager ops before the fused activation:
    per element of the fc1 output forward 8 bytes in 3 kernels (two clamps r1 w1 on their half,
    the cat r2 w2), backward 10 (clamp gradients r4 w2 on their half, the cat of the two
    gradients r2 w2) in 3; the forward again under ``moe_act`` recompute (``GLU_CLAMP``).
  * Expert output biases (``model.expert_bias``): TEGroupedMLP builds fc2 with skip_bias_add
    (experts.py:214) and ``_apply_bias`` (experts.py:251-266) adds each local expert's bias times
    its routing probabilities in a Python loop, ``torch.cat([t + b * p ...])``: per element of
    the fc2 output forward b*p (w2), the add (r4 w2) and the cat (r2 w2), 12 bytes in 2 kernels
    per local expert and one cat; backward g*p and its row sum (dbias), g*b and its sum over the
    hidden dim (dprob), the split's cat, 16 bytes in 4 kernels per expert and one
    (``EXPERT_BIAS``).
  With ``framework_options.te_op_fuser`` (Megatron-core's use_transformer_engine_op_fuser, 0.18)
  the experts run as one fused op holding the clamp and the biases (experts.py _make_fused_ops at
  d0b3b775): only the RoPE path remains.
  Not priced: the blocking host-to-device copy ``torch.tensor(linear_offset, device=...)`` in the
  same activation (fused_bias_geglu.py:434), a stream sync per MoE forward, and the attention
  output bias left unfused (bias_dropout_fusion off with biases, well under 1% of a layer).
- Host issue (``host_issue_s`` per kernel) is applied by the engine, which keeps each rank's host
  clock: see ``simulator.engine.engine``; ``BlockCost.kernels`` counts the launches.
- Selective recompute per framework (profile ``recompute.selective``, with ``training.recompute:
  selective``): ``attention_core`` is the reference (Megatron, Korthikanti et al. 2022);
  ``every_second_matmul`` is torchtitan's per-op SAC (torchtitan/distributed/activation_checkpoint.py),
  which saves every mm output except the 2nd, 4th, ... of a block and re-runs everything else: in a
  Llama block (mm order wq, wk, wv, wo, w1, w3, w2) wk, wo and w3 (the K share of the fused QKV
  GEMM, the output projection, half of the fused up-projection; for GeLU, mm order wq, wk, wv,
  wo, w1, w2: wk, wo and w2) plus every elementwise op; ``elementwise`` (MaxText minimal_flash) re-runs
  only the elementwise ops; ``attention_projections`` (MaxText's custom policy saving Q, K, V and the
  output projection, NVIDIA's DGX Cloud Llama 2 70B recipe) re-runs the attention core and the MLP's
  input projections (gate and up, or the one up projection) besides the elementwise ops. All of it
  runs before the attention backward; MoE layers keep the reference.
- Context-parallel merges per framework (profile ``attention.cp_merge``, cp > 1): the reference
  (``te``, Transformer Engine's fused correction kernels) is compute.py's ``attn_cp_merge`` (10
  bytes per merged output element, 2x backward). PyTorch's ``context_parallel`` (``torch``,
  torch.distributed.tensor.experimental._attention, torch 1963fc8 of 2024-12 and 2.6-2.7) does it
  in fp32 tensor ops instead (``cp_merge_bytes``); with Q the rank's query/output elements, KV the
  elements of its K (= of V; all query heads when the profile says K/V are repeated before the
  call) and n = cp - 1 later ring steps, half of them on all queries (step i <= rank) and half
  "partial" on the second query chunk (mean rank):
  * eager, forward: ``key/value.contiguous()`` (r2 w2 on K and V: 8 KV); per later step
    ``torch.cat([key.flatten(), value.flatten()])`` (8 KV); ``_SDPAMerger.step`` upcasts the block
    output (r2 w4), ``out - block_out`` (r4 r4 w4), ``sigmoid(..) * diff`` (r4 w4), ``out - ..``
    (r4 r4 w4): 38 bytes per merged element, the partial steps on Q / 2 plus a ``torch.cat`` of the
    whole fp32 output in ``_partial_update`` (r4 w4: 8 Q); the first output's upcast and the final
    cast back (6 Q each): 8 KV + 12 Q + n (8 KV + 32.5 Q).
  * eager, backward (``_templated_ring_attention_backward``): fp32 ``zeros_like`` of dQ, dK, dV
    (4 Q + 8 KV), ``contiguous`` (8 KV), the K/V ``cat`` per later step (8 KV), step 0's fp32
    ``+=`` of dK, dV (r4 r2 w4: 20 KV), per later step the received dK/dV plus this step's (23 KV
    mean: full ``+=`` 20, partial ``+=`` on half and a ``cat`` 26), per step the fp32 send buffer
    ``torch.cat`` (r4 w4 on 2 KV: 16 KV, cp times), dQ ``+=`` (10 Q; partial 13 Q), the final casts
    (6 Q + 12 KV): 20 Q + 64 KV + n (11.5 Q + 47 KV).
  * compiled (torchtitan compiles each block with fullgraph=True, so the ring is traced and
    Inductor fuses each step's pointwise chain into one kernel and drops the per-step K/V ``cat``
    the all-gather rotater never sends): forward one K/V ``cat`` (8 KV) and per later step a fused
    merge (r4 r2 w4: 10 per merged element) plus the partial steps' copy of the untouched half
    (r4 w4 on Q / 2): 8 KV + 9.5 n Q; backward the first K/V ``cat`` (8 KV), per step the fused
    dK/dV accumulate-into-send-buffer (r4 r2 w4 on 2 KV, the partial steps copying the untouched
    half: 19 KV mean, cp times) and dQ (10 Q; partial 9 Q): 8 KV + 10 Q + 19 (n + 1) KV + 9.5 n Q.
  The op keeps the reference's name (``attn_cp_merge``, ``_bwd``) and place, after the calls on
  arriving keys. The fp32 dK/dV the backward rotates (2x the bf16 bytes, cp transfers) are not
  priced: the program sends 2x the forward's K/V bytes in the backward for every framework.
- The language-model loss (profile ``fusion.cross_entropy``, ``fusion.cross_entropy_compiled``
  under torch.compile, or ``framework_options.cross_entropy``), bytes and big (T x V / tp sized)
  kernels per logit forward / backward and bytes per logit kept for the backward
  (``CROSS_ENTROPY``; read in each implementation's source, the Inductor code generated for it):
  * ``megatron``: Megatron-core's unfused vocab_parallel_cross_entropy, compute.py's reference
    (``MEGATRON_CROSS_ENTROPY``): 38 in 6 / 14 in 2, kept 4. Megatron-DeepSpeed's older copy
    (.float() outside the Function, out-of-place subtract) moves the same bytes.
  * ``megatron-fused``: ``cross_entropy_loss_fusion`` with impl native
    (megatron/core/fusions/fused_cross_entropy.py; ``jit_fuser`` is torch.compile from torch 2.2,
    megatron/core/jit.py): the cast fused into the max (r2 w4), subtract + exp + sum in one
    reduction (r4 w4), the div (r4 w4): 22 in 3; backward a full copy of the saved softmax (the
    functionalised in-place index update, r4 w4) and one kernel writing the bf16 gradient and the
    softmax back (r4 w2 w4): 18 in 2; kept 4.
  * ``te``: Transformer Engine parallel_cross_entropy (impl te; TE 2.2 to 2.17,
    transformer_engine/pytorch/triton/cross_entropy.py): an online-softmax pass (r2) and a pass
    writing the gradient in place into the bf16 logits (r2 w2): 6 in 2; backward the in-place
    multiply by Megatron's per-token gradient (r2 w2): 4 in 1; kept 2 (the logits' buffer). From
    TE 2.18 (commit 01bbe3eea) the gradient is an fp32 buffer instead: 8 / 14, kept 4, not priced.
  * ``torch``: ``F.cross_entropy(logits.float(), labels)`` eager (torchtitan
    components/loss.py, NeMo AutoModel MaskedCrossEntropy): the cast (r2 w4) and log_softmax's
    three passes over a row too long for the shared-memory kernel (cunn_SoftMaxForward: r12 w4):
    22 in 2; backward nll_loss_backward's zero-fill (w4), log_softmax backward's two passes (r12 w4)
    and the cast back (r4 w2): 26 in 3; kept 4 (the fp32 log-probabilities).
  * ``torch-compiled``: the same under torch.compile (torchtitan compiles the loss with the
    model): one reduction over the bf16 logits (two loops before Inductor's online softmax, torch
    2.7: r4), backward one kernel recomputing the softmax and writing the bf16 gradient (r2 w2): 4
    in 1 / 4 in 1; kept 2 (the logits).
  * ``triton``: flash-attn's CrossEntropyLoss (llm-foundry's default ``fused_crossentropy``,
    flash_attn/ops/triton/cross_entropy.py): one online pass (r2), backward one kernel writing the
    bf16 gradient (r2 w2): 2 in 1 / 4 in 1; kept 2.
  * ``xla``: MaxText's custom-VJP cross_entropy_with_logits on fp32-cast logits
    (utils/max_utils.py, layers/decoders.py ``cast_logits_to_fp32``), fused by XLA: the max (r2),
    the exp written for the backward with its sum (r2 w4) and the loss reduction (r2): 10 in 3;
    backward one fusion reading the saved exp and writing the bf16 gradient (r4 w2): 6 in 1; kept
    4. An estimate from the VJP's residuals and XLA's reduction fusion (no GPU HLO read).
  The rows are nominal HBM traffic: a row re-read inside one kernel may hit L2 when the rows in
  flight fit in it (V / tp below ~32K fp32), which would make the multi-pass kernels cheaper.
- Optimizer passes per framework (profile ``optimizer`` section): ``grad_norm`` (clipping), ``adam``
  and ``zero_grad`` as memory-bound kernels, bytes per parameter from the profile's source.
"""

from __future__ import annotations

from dataclasses import replace

from simulator.scenario.config import ModelConfig, ParallelConfig, TrainingConfig
from simulator.parts.gpus import GPUSpec
from simulator.workload.compute import (MEGATRON_CROSS_ENTROPY, RECOMPUTE_MODULE_OPS, attention_steps, local_tokens, mlp_steps, mem_chain,
                                        unfused_scores)
from simulator.workload.kernels import ACT_BYTES, BlockCost, LayerCost, Op, Gemm
from simulator.workload.frameworks import Software
from simulator.workload.moe import local_experts

# (forward bytes, forward kernels, backward bytes, backward kernels, bytes kept for the backward)
# per logit, by implementation (module docstring)
CROSS_ENTROPY = {
    "megatron": MEGATRON_CROSS_ENTROPY,
    "megatron-fused": (22.0, 3, 18.0, 2, 4.0),
    "te": (6.0, 2, 4.0, 1, 2.0),
    "torch": (22.0, 2, 26.0, 3, 4.0),
    "torch-compiled": (4.0, 1, 4.0, 1, 2.0),
    "triton": (2.0, 1, 4.0, 1, 2.0),
    "xla": (10.0, 3, 6.0, 1, 4.0),
}
NORM_EXTRA = (32.0, 6)  # bytes per element, kernels: composite rms_norm over the fused kernel
ROPE_UNFUSED = (20.0, 3)  # per element of q and of k
ROPE_FUSED_BYTES = 4.0  # what the reference's fused kernel moves per element (compute.py ``rope``)
# Megatron-core's eager paths (module docstring): (forward bytes, forward kernels, backward bytes,
# backward kernels) per element of q and of k / of the fc1 output / of the fc2 output; the
# expert-bias kernels are per local expert, plus one cat
MEGATRON_ROPE_UNFUSED = (24.0, 12, 24.0, 6)
GLU_CLAMP = (8.0, 3, 10.0, 3)
EXPERT_BIAS = (12.0, 2, 16.0, 4)
SWIGLU_EXTRA = (4.0, 1)  # per element of the activation output
# transformers' NewGELUActivation (src/transformers/activations.py, the model.hidden_act gelu_new of
# GPT-2 and its kin): 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * pow(x, 3)))) as eager ops
# under autocast, which runs pow in float32 (PyTorch "Automatic Mixed Precision package", CUDA ops
# that autocast to float32: pow, softmax, layer_norm) so that every op after it is float32 until
# the next matmul casts back. Per element of the 16-bit activation input, (forward bytes, forward
# kernels, backward bytes, backward kernels) beyond the one-kernel GELU the reference prices
# (compute.py ``mlp_act``: 4 bytes forward, 8 backward, one kernel each). Forward, 10 kernels, 76 bytes:
# 0.5 * x (read 2, write 2), the autocast cast of x (2, 4) and pow (4, 4), * 0.044715 (4, 4), x + that
# (2 + 4, 4), * sqrt(2 / pi) (4, 4), tanh (4, 4), 1 + (4, 4), the product (2 + 4, 4), the next
# matmul's cast to 16 bits (4, 2). Backward, autograd's formula per op, 15 kernels, 118 bytes: the
# cast back (2, 4); the product's two gradients (4 + 4, 4 then 4, 2 to the 16-bit input's dtype,
# and 4 + 2, 4); tanh_backward (4 + 4, 4); the two constant products (4, 4 each); the sum's
# gradient to x cast to 16 bits (4, 2); pow_backward, grad * 3 * x^2 (4, 4; 4, 4; 4 + 4, 4) and its
# autocast cast (4, 2); 0.5 * grad (2, 2); autograd's two adds of x's three gradients (2 + 2, 2 each).
GELU_NEW_COMPOSED = (76.0 - 4.0, 10 - 1, 118.0 - 8.0, 15 - 1)
# transformers' GPT2Attention._attn (src/transformers/models/gpt2/modeling_gpt2.py), the eager
# attention of training.attention: unfused under autocast, against Megatron's fused
# scale-mask-softmax that compute.py ``_attn_core_unfused`` prices (softmax read 2, write 2 and
# its backward 6 bytes per score; dropout 5 and 5 in both). Per score, (forward bytes, forward
# kernels, backward bytes, backward kernels) beyond it: forward, the division by sqrt(d) (read 2,
# write 2), torch.where with the causal mask (2, 2; the boolean mask is one s x s buffer for every
# head), autocast's cast to float32 for softmax (2, 4), the softmax in float32 (4, 4, against the
# fused kernel's 4 bytes), .type back to 16 bits (4, 2): 4 kernels and 24 bytes more; backward, the
# casts' gradients (2, 4 and 4, 2), softmax_backward in float32 (4 + 4, 4, against 6), where's and
# the division's gradients (2, 2 each): 4 kernels and 26 bytes more. Llama-style models' eager
# path (eager_attention_forward) asks softmax for float32 in-kernel and moves somewhat less.
EAGER_SOFTMAX = (24.0, 4, 26.0, 4)
NORM_OPS = ("input_norm", "post_attn_norm", "final_norm", "qk_norm")
ACT_OPS = ("mlp_act", "expert_act", "shared_act")
NORM_FED_GEMMS = ("qkv_proj", "mlp_up", "shared_up", "router", "lm_head")
SINGLE_PASS_RECIPES = ("delayed", "blockwise", "mxfp8")
_REFERENCE_CAST = (4.0, 1)


def fp8_cast_cost(recipe: str, compiled: bool) -> tuple[float, int]:
    """(bytes, kernels) per 16-bit element to produce both FP8 layouts of one tensor (module docstring)."""
    if recipe == "delayed":
        return 4.0, 1
    if recipe == "tensorwise":
        return (6.0, 2) if compiled else (7.0, 4)
    if recipe == "rowwise":
        return (10.0, 2) if compiled else (10.0, 4)
    if recipe == "blockwise":
        return 4.0 + 2.0 / 128, 1
    return 4.0 + 2.0 / 32, 1  # mxfp8


def _gemms(plan) -> list[Gemm]:
    return [st for st in plan if isinstance(st, Gemm)]


def fp8_extra(gemms: list[Gemm], sw: Software) -> tuple[float, int, float, int]:
    """(forward bytes, forward kernels, backward bytes, backward kernels) of FP8 casts beyond the
    reference, per micro-batch, for these GEMMs (module docstring)."""
    c_bytes, c_kern = fp8_cast_cost(sw.fp8_recipe, sw.compile)
    r_bytes, r_kern = _REFERENCE_CAST
    fb = bb = 0.0
    fk = bk = 0
    for g in gemms:
        x, w, dy = g.groups * g.m * g.k, g.groups * g.k * g.n, g.groups * g.m * g.n
        norm_fed = g.name in NORM_FED_GEMMS
        ref_x = (0.0, 0) if norm_fed else (r_bytes, r_kern)
        fused_x = norm_fed and sw.fp8_casts_fused and sw.fp8_recipe in SINGLE_PASS_RECIPES
        own_x = (0.0, 0) if fused_x else (c_bytes, c_kern)
        fb += max(0.0, own_x[0] - ref_x[0]) * x
        fk += max(0, own_x[1] - ref_x[1]) * g.groups
        if not sw.fp8_weight_cast_once:  # cached weights cost once per step, amortised to ~0 as in the reference
            fb += c_bytes * w
            fk += c_kern * g.groups
        bb += max(0.0, c_bytes - r_bytes) * dy
        bk += max(0, c_kern - r_kern) * g.groups
    return fb, fk, bb, bk


def cp_merge_bytes(q: float, kv: float, cp: int, compiled: bool) -> tuple[float, float, int, int]:
    """(forward bytes, backward bytes, forward kernels, backward kernels) of PyTorch
    context_parallel's merges and accumulations for one rank and micro-batch (module docstring):
    ``q`` query/output elements, ``kv`` elements of K (= of V), ``cp`` ranks."""
    n = cp - 1
    if compiled:
        return 8 * kv + 9.5 * n * q, 8 * kv + 10 * q + 19 * (n + 1) * kv + 9.5 * n * q, 1 + n, 2 + 2 * cp
    return (8 * kv + 12 * q + n * (8 * kv + 32.5 * q), 20 * q + 64 * kv + n * (11.5 * q + 47 * kv),
            5 + 10 * n, 12 + 9 * n)


def _with_cp_merge(block: BlockCost, name: str, nbytes: float, kernels: int, gpu: GPUSpec) -> BlockCost:
    """``block`` with its op ``name`` (the reference merge) replaced by a merge of ``nbytes``."""
    ops = tuple(mem_chain(name, nbytes, kernels, gpu) if op.name == name else op for op in block.ops)
    return BlockCost(ops)


def _qk_elements(model: ModelConfig, tokens: float, tp: int) -> float:
    """Elements of q and k one GPU rotates (RoPE) per micro-batch."""
    q = model.num_attention_heads * model.head_dim / tp
    k = max(model.num_key_value_heads, tp) * model.head_dim / tp
    return tokens * (q + k)


def _replace_op(block: BlockCost, name: str, op: Op) -> BlockCost:
    """``block`` with its op ``name`` replaced by ``op`` (appended when it has none)."""
    if not any(o.name == name for o in block.ops):
        return BlockCost(block.ops + (op,))
    return BlockCost(tuple(op if o.name == name else o for o in block.ops))


def _add(block: BlockCost, extra: list[Op]) -> BlockCost:
    extra = [op for op in extra if op.bytes > 0]
    return BlockCost(block.ops + tuple(extra)) if extra else block


def _insert(block: BlockCost, op: Op, before: str | None = None, after: str | None = None) -> BlockCost:
    """``block`` with ``op`` placed before the first op named ``before`` or after the last op named
    ``after`` (prefix match, so per-expert GEMMs count), or at its end when there is none."""
    names = [o.name for o in block.ops]
    if before is not None:
        at = next((i for i, n in enumerate(names) if n.startswith(before)), len(names))
    else:
        at = max((i + 1 for i, n in enumerate(names) if n.startswith(after)), default=len(names))
    return BlockCost(block.ops[:at] + (op,) + block.ops[at:])


def _activation_start(block: BlockCost) -> str:
    """The op the experts' GLU clamp runs before: the offset copy's sync when the block has it
    (the clamps come first in fused_bias_geglu.py), else the activation."""
    return "moe_glu_sync" if any(op.name == "moe_glu_sync" for op in block.ops) else "expert_act"


def megatron_layer_extras(cost: LayerCost, model: ModelConfig, training: TrainingConfig, par: ParallelConfig,
                          gpu: GPUSpec, layer: int, sw: Software) -> LayerCost:
    """``cost`` with Megatron-core's model-specific unfused paths (module docstring): eager RoPE
    under a YaRN attention factor, the GLU clamp and the per-expert bias loop, each its own op."""
    out = cost
    if model.rope_mscale != 1.0 and sw.fused_rope and model.rotary_qk:
        tokens, _ = local_tokens(training, par)
        elems = _qk_elements(model, tokens, par.tp)
        fb, fk, bb, bk = MEGATRON_ROPE_UNFUSED
        fwd = mem_chain("rope_unfused", fb * elems, 2 * fk, gpu)
        # in place of the fused kernel the reference prices
        out = replace(out, attn_fwd=_replace_op(out.attn_fwd, "rope", fwd),
                      attn_bwd=_replace_op(out.attn_bwd, "rope_bwd",
                                           mem_chain("rope_unfused_bwd", bb * elems, 2 * bk, gpu)))
        if cost.attn_recompute is cost.attn_fwd:  # full recompute re-runs it; selective re-runs modules RoPE is not in
            out = replace(out, attn_recompute=out.attn_fwd)
    if not model.is_moe_layer(layer) or sw.te_op_fuser:  # the fused op holds the clamp and the biases
        return out
    ffe, etp = model.expert_intermediate_size, par.expert_tp
    down = sum(op.flops for op in cost.mlp_fwd.ops if op.name.startswith("expert_down"))
    rows = down / (2.0 * model.hidden_size * ffe / etp)  # routed copies the busiest rank's experts take
    mlp_fwd, mlp_bwd, mlp_re = out.mlp_fwd, out.mlp_bwd, out.mlp_recompute
    full = cost.mlp_recompute is cost.mlp_fwd
    if model.swiglu_limit is not None and model.mlp_matrices == 3 and rows > 0:
        elems = rows * 2 * ffe / etp
        fb, fk, bb, bk = GLU_CLAMP
        clamp = mem_chain("expert_act_clamp", fb * elems, fk, gpu)
        mlp_fwd = _insert(mlp_fwd, clamp, before=_activation_start(mlp_fwd))
        mlp_bwd = _insert(mlp_bwd, mem_chain("expert_act_clamp_bwd", bb * elems, bk, gpu), after="expert_act_bwd")
        if not full and any(op.name == "expert_act" for op in mlp_re.ops):  # moe_act recompute
            mlp_re = _insert(mlp_re, clamp, before=_activation_start(mlp_re))
    if model.expert_bias and rows > 0:
        elems, nloc = rows * model.hidden_size, local_experts(model, par)
        fb, fk, bb, bk = EXPERT_BIAS
        mlp_fwd = _insert(mlp_fwd, mem_chain("expert_down_bias", fb * elems, fk * nloc + 1, gpu), after="expert_down")
        mlp_bwd = _insert(mlp_bwd, mem_chain("expert_down_bias_bwd", bb * elems, bk * nloc + 1, gpu),
                          before="expert_down_dgrad")
    return replace(out, mlp_fwd=mlp_fwd, mlp_bwd=mlp_bwd, mlp_recompute=mlp_fwd if full else mlp_re)


def weight_passes(weights: float, tensors: int, sw: Software, gpu: GPUSpec, microbatches: int,
                  grad_shard: int, expert_weights: float = 0.0, expert_shard: int = 1) -> tuple[list[Op], list[Op]]:
    """The passes over a block's weights and their gradients outside the GEMMs, per micro-batch, as
    (forward ops, backward ops); ``weights`` local weight elements in ``tensors`` tensors, one
    kernel per tensor and pass (profile keys ``optimizer.*_bytes_per_param``):

    - ``weight_cast``: autocast over fp32 weights casts each weight to 16 bits once per forward
      (read 4, write 2; torch.autocast keeps the cast in its weight cache for that forward only,
      ``cache_enabled``, PyTorch docs "Automatic Mixed Precision package"), and again in a
      recomputed forward;
    - ``grad_pass``, every micro-batch: the backward of that cast returns the 16-bit weight
      gradient to the fp32 parameter's dtype (read 2, write 4), or a framework adds it into its own
      fp32 accumulator (nanotron);
    - ``grad_accumulate``, every micro-batch but the first: autograd's AccumulateGrad adds the new
      gradient into the existing ``.grad`` in place (``variable_grad += new_grad``,
      torch/csrc/autograd/functions/accumulate_grad.h; on the first micro-batch it takes the new
      tensor without a copy). A micro-batch's program is the same for all of them, so each carries
      the average, (m - 1) / m of the pass; under ZeRO-2 and ZeRO-3 / FSDP the gradient kept is
      the rank's partition: 1 / ``grad_shard`` of the dense weights' and 1 / ``expert_shard`` of
      the ``expert_weights``' (of ``weights``), which are partitioned over the expert-data-parallel
      group as the optimizer and the memory model partition them.
    """
    fwd, bwd = [], []
    if sw.weight_cast_bytes_per_param > 0:
        fwd.append(mem_chain("weight_cast", sw.weight_cast_bytes_per_param * weights, tensors, gpu))
    if sw.grad_cast_bytes_per_param > 0:
        bwd.append(mem_chain("grad_pass", sw.grad_cast_bytes_per_param * weights, tensors, gpu))
    if sw.grad_accumulate_bytes_per_param > 0 and microbatches > 1:
        kept = (weights - expert_weights) / grad_shard + expert_weights / expert_shard
        share = (microbatches - 1) / microbatches
        bwd.append(mem_chain("grad_accumulate", sw.grad_accumulate_bytes_per_param * kept * share, tensors, gpu))
    return fwd, bwd


def _eager_extras(block: str, model: ModelConfig, training: TrainingConfig, par: ParallelConfig, sw: Software,
                  tokens: float, layer: int) -> tuple[str, tuple, float] | None:
    """(op name, its bytes and kernels per element, elements) of the eager kernels a framework runs
    beyond the reference's fused one in ``block``: transformers' composed gelu_new in a dense MLP
    (``GELU_NEW_COMPOSED``, per element of the activation), its eager scale, mask and float32
    softmax of unfused attention (``EAGER_SOFTMAX``, per score); None if neither applies."""
    if (block == "mlp" and sw.gelu_new == "composed" and model.hidden_act == "gelu_new"
            and not model.is_moe_layer(layer)):
        return "eager_gelu", GELU_NEW_COMPOSED, tokens * model.intermediate_size / par.tp
    if block == "attn" and sw.unfused_softmax == "eager_autocast" and training.attention == "unfused":
        return "eager_softmax", EAGER_SOFTMAX, unfused_scores(model, training, par)
    return None


def _plan_weights(plan) -> tuple[float, int, float]:
    """Weight elements and weight tensors of a block's GEMMs, and of those elements the routed
    experts' (``moe.py`` names their GEMMs ``expert_*``): each Gemm (m x k)(k x n) holds a k x n
    weight per group."""
    gemms = _gemms(plan)
    return (sum(g.k * g.n * g.groups for g in gemms), sum(g.groups for g in gemms),
            sum(g.k * g.n * g.groups for g in gemms if g.name.startswith("expert_")))


def layer_with_software(cost: LayerCost, model: ModelConfig, training: TrainingConfig, par: ParallelConfig,
                        gpu: GPUSpec, layer: int, sw: Software, microbatches: int = 1,
                        grad_shard: int = 1, expert_shard: int = 1) -> LayerCost:
    """``cost`` with the profile's unfused elementwise ops, FP8 casts and passes over the weights
    and gradients (``weight_passes``, over ``microbatches`` per step) as their own ops, and
    Megatron-core's model-specific unfused paths when the profile runs its layers."""
    if sw.megatron_layers:
        cost = megatron_layer_extras(cost, model, training, par, gpu, layer, sw)
    tokens, tokens_norm = local_tokens(training, par)
    attn_plan = attention_steps(model, tokens, tokens_norm, par.tp)
    mlp_plan = mlp_steps(model, layer, tokens, tokens_norm, par)
    swiglu = model.mlp_matrices == 3
    blocks = {}
    for name, fwd, bwd, plan in (("attn", cost.attn_fwd, cost.attn_bwd, attn_plan),
                                 ("mlp", cost.mlp_fwd, cost.mlp_bwd, mlp_plan)):
        nbytes, kernels = 0.0, 0
        for op in fwd.ops:
            if op.name in NORM_OPS and not sw.fused_norm:
                nbytes += NORM_EXTRA[0] * op.bytes / (2 * ACT_BYTES)
                kernels += NORM_EXTRA[1] * op.kernels
            elif op.name in ACT_OPS and not sw.fused_activation and swiglu:
                nbytes += SWIGLU_EXTRA[0] * op.bytes / (3 * ACT_BYTES)
                kernels += SWIGLU_EXTRA[1]
        if name == "attn" and not sw.fused_rope and model.rotary_qk:
            # beyond the fused kernel the reference prices (compute.py ``rope``: 4 bytes, one kernel
            # on q and one on k)
            nbytes += (ROPE_UNFUSED[0] - ROPE_FUSED_BYTES) * _qk_elements(model, tokens, par.tp)
            kernels += 2 * (ROPE_UNFUSED[1] - 1)
        fwd_extra = [mem_chain("unfused_elementwise", nbytes, kernels, gpu)] if kernels else []
        bwd_extra = [mem_chain("unfused_elementwise_bwd", 2.0 * nbytes, 2 * kernels, gpu)] if kernels else []
        eager = _eager_extras(name, model, training, par, sw, tokens, layer)
        if eager is not None:
            label, (fb, fk, bb, bk), elements = eager
            fwd_extra.append(mem_chain(label, fb * elements, fk, gpu))
            bwd_extra.append(mem_chain(f"{label}_bwd", bb * elements, bk, gpu))
        if training.precision == "fp8":
            fb, fk, bb, bk = fp8_extra(_gemms(plan), sw)
            if fk or fb:
                fwd_extra.append(mem_chain("fp8_cast", fb, max(1, fk), gpu))
            if bk or bb:
                bwd_extra.append(mem_chain("fp8_cast_bwd", bb, max(1, bk), gpu))
        weights, tensors, experts = _plan_weights(plan)
        wf, wb = weight_passes(weights, tensors, sw, gpu, microbatches, grad_shard, experts, expert_shard)
        blocks[name] = (_add(fwd, fwd_extra + wf), _add(bwd, bwd_extra + wb))
    attn_fwd, attn_bwd = blocks["attn"]
    if par.cp > 1 and sw.cp_merge == "torch" and any(op.name == "attn_cp_merge" for op in attn_fwd.ops):
        local = training.micro_batch_size * training.seq_length / par.cp
        heads = model.num_attention_heads / par.tp
        kv_heads = heads if sw.kv_heads_expanded else max(model.num_key_value_heads, par.tp) / par.tp
        fb, bb, fk, bk = cp_merge_bytes(local * heads * model.v_dim, local * kv_heads * model.head_dim,
                                        par.cp, sw.compile)
        attn_fwd = _with_cp_merge(attn_fwd, "attn_cp_merge", fb, fk, gpu)
        attn_bwd = _with_cp_merge(attn_bwd, "attn_cp_merge_bwd", bb, bk, gpu)
    mlp_fwd, mlp_bwd = blocks["mlp"]
    full = cost.attn_recompute is cost.attn_fwd and cost.mlp_recompute is cost.mlp_fwd and cost.attn_fwd.ops
    if (training.recompute == "selective" and sw.selective_recompute != "attention_core"
            and not model.is_moe_layer(layer)):
        shares = recompute_shares(model, par.tp, sw.selective_recompute)
        ops = [_scaled(op, shares.get(op.name, 0.0 if op.flops else 1.0))
               for op in attn_fwd.ops + mlp_fwd.ops]
        return replace(cost, attn_fwd=attn_fwd, attn_bwd=attn_bwd, mlp_fwd=mlp_fwd, mlp_bwd=mlp_bwd,
                       attn_recompute=BlockCost(tuple(op for op in ops if op is not None)),
                       mlp_recompute=BlockCost())
    return replace(cost, attn_fwd=attn_fwd, attn_bwd=attn_bwd, mlp_fwd=mlp_fwd, mlp_bwd=mlp_bwd,
                   attn_recompute=attn_fwd if full else cost.attn_recompute,
                   mlp_recompute=mlp_fwd if full else cost.mlp_recompute)


def recompute_shares(model: ModelConfig, tp: int, policy: str) -> dict[str, float]:
    """Share of each forward GEMM a selective policy re-runs (elementwise ops re-run whole);
    ``attention_projections`` re-runs the attention core (its context is not saved) and the MLP's
    input projections (their outputs are not saved), every op of both at full share."""
    if policy == "attention_projections":
        return dict.fromkeys(RECOMPUTE_MODULE_OPS["core_attn"] + ("mlp_up",), 1.0)
    if policy != "every_second_matmul":
        return {}
    q = model.num_attention_heads * model.head_dim
    kv = max(model.num_key_value_heads, tp) * model.head_dim
    if model.mlp_matrices == 3:
        return {"qkv_proj": kv / (q + 2 * kv), "out_proj": 1.0, "mlp_up": 0.5}
    return {"qkv_proj": kv / (q + 2 * kv), "out_proj": 1.0, "mlp_down": 1.0}


def _scaled(op: Op, share: float) -> Op | None:
    if share <= 0:
        return None
    if share == 1.0:
        return op
    return Op(f"{op.name}_part", op.flops * share, op.bytes * share, op.time_s * share, op.kernels)


def head_with_software(head: tuple[BlockCost, BlockCost], gpu: GPUSpec, sw: Software, head_weights: float = 0.0,
                       microbatches: int = 1, grad_shard: int = 1) -> tuple[BlockCost, BlockCost]:
    """The final norm, unfused when the profile does not fuse norms, and the passes over the LM
    head's ``head_weights`` local weight elements (``weight_passes``; the embedding's gradient pass
    is ``compute.embedding_cost``'s)."""
    fwd, bwd = head
    wf, wb = weight_passes(head_weights, 1, sw, gpu, microbatches, grad_shard) if head_weights else ([], [])
    if not sw.fused_norm:
        elems = sum(op.bytes for op in fwd.ops if op.name == "final_norm") / (2 * ACT_BYTES)
        wf = [mem_chain("unfused_elementwise", NORM_EXTRA[0] * elems, NORM_EXTRA[1], gpu), *wf]
        wb = [mem_chain("unfused_elementwise_bwd", 2 * NORM_EXTRA[0] * elems, 2 * NORM_EXTRA[1], gpu), *wb]
    return _add(fwd, wf), _add(bwd, wb)


# bf16 Adam moments (training.optimizer_state_dtype): the fused Adam reads and writes m and v once
# each, 2 bytes each instead of 4 (Megatron-core precision-aware optimizer, TE FusedAdam).
BF16_MOMENTS_SAVED_BYTES = 4 * 2.0


def optimizer_block(num_params_local: float, num_params_buffer: float, gpu: GPUSpec, sw: Software,
                    moments: str = "fp32") -> BlockCost:
    """Clipping norm, Adam and gradient zeroing as memory-bound passes with the profile's bytes per
    parameter (shard for the first two, every local gradient for the zeroing); ``moments`` bf16
    moves ``BF16_MOMENTS_SAVED_BYTES`` fewer per parameter in Adam."""
    adam = sw.adam_bytes_per_param - (BF16_MOMENTS_SAVED_BYTES if moments == "bf16" else 0.0)
    ops = [
        ("grad_norm", sw.clip_bytes_per_param, num_params_local),
        ("adam", adam, num_params_local),
        ("zero_grad", sw.zero_grad_bytes_per_param, num_params_buffer),
    ]
    return BlockCost(tuple(mem_chain(name, per * n, 1, gpu) for name, per, n in ops if per > 0))
