"""A published run (a case of a runs file) as a scenario: what is read, and the documented defaults for
what a case does not state.

The case format is ``shared/validation/public-runs.yaml``. Only the description of the run is read
(model, hardware, layout); the ``measured`` and ``derived`` blocks are used for the error columns
only, so predictions are the same with them removed. Documented defaults for unknown fields:

- topology: ``dgx-a100`` for A100 GPUs, ``gb200-nvl72`` / ``gb300-nvl72`` for GB200 / GB300 (the
  case's ``gpus_per_node`` is then the job's NVLink domain inside the rack, e.g. the 64-GPU Slurm
  segment Megatron-Bridge uses), ``dgx-b200`` for B200, ``hgx-b300`` for B300, ``dgx-h100``
  otherwise, with the case's per-GPU NVLink and NIC rates as overrides; nodes = count / gpus_per_node (8 when not given); a run on fewer GPUs
  than a node uses one node of that many.
- hidden_act: the case's ``model.hidden_act`` when it states one (``gelu``, ``silu``, ...); else
  SwiGLU (silu) or GeLU, whichever makes the parameter count closer to ``params_b``;
  a GeLU model of transformers' GPT-2 class (a GPT-2 checkpoint, or a stated GPT2LMHeadModel)
  gelu_new, its config's activation; untied embeddings unless the case's model says ``tied: true``
  (the activation is then fitted to the tied parameter count: nanotron's tied 1.34B and 3.57B
  Llamas are SwiGLU models whose untied GeLU twin has the same count).
- position_embedding: the case's ``model.position_embedding`` (``learned``: GPT-2, GPT-3, OPT,
  Megatron-LM's default, llm-foundry's MPT; ``alibi``; ``none``); rotary (``rope``) when not stated.
- micro-batch size 1; zero_stage 1 (Megatron's distributed optimizer, the default of
  Megatron-core and NeMo recipes); precision mxfp8 or nvfp4 when the case names them, else fp8
  when it says fp8 (delayed, current or block scaling), else bf16; dp =
  count / (tp x pp x cp) when not given.
- interleave degree: 1 when ``framework_options.pp_schedule`` says 1F1B or GPipe; otherwise 1
  (plain 1F1B), unless that schedule's bubble (p-1)/(m+p-1) would exceed
  15%; then the smallest v that brings it to 15% or less and that Megatron can run (m a multiple
  of p, layers split over p x v virtual stages as below), else the largest such v. Nobody
  publishes throughput with a 30-50% bubble: runs with few micro-batches per pipeline stage
  (Llama 3 405B: 16 per DP rank on 16 stages) use the interleaved schedule (Narayanan et al.
  2021; Llama 3 paper Sec. 3.3.2), and a 15% bound leaves every calibration case at v = 1.
- recompute: the case's value (``full...`` / ``selective...``), none when unknown; with
  selective, the Megatron-core ``recompute_modules`` the case names (``framework_options.
  recompute_modules``, or module names in the recompute text: ``selective (layernorm, moe_act)``)
  become ``training.recompute_modules``; naming none keeps Megatron's default (core_attn); sequence
  parallelism as the case's ``parallelism.sequence_parallel`` states it, else when the recompute
  field says so, or when recompute is unknown and tp > 1 (the NeMo default), else off.
- hybrid sharding: the case's ``parallelism.dp_replicate`` (torchtitan
  ``data_parallel_replicate_degree``, MaxText ``dcn_data_parallelism`` with FSDP inside, Megatron-core
  ``num_distributed_optimizer_instances``), else 1 (ZeRO/FSDP over all of dp x cp).
- expert parallelism wider than dp x cp (Qwen3-235B: TP2, EP32 on 16 DP ranks): expert tensor
  parallelism 1, expert groups spanning TP ranks (Megatron-core MoE parallel folding), with
  sequence parallelism (Megatron-core requires it for MoE with TP).
- context-parallel exchange: ``all_gather`` when ``framework_options.context_parallel_rotate``
  says allgather (PyTorch's context_parallel), else the ring (``p2p``, Megatron-core).
- attention kernel: ``unfused`` (materialised scores, attention dropout) when the case's source
  names a year before 2023, as an arXiv id (``2104.04473`` is April 2021) or a 20xx year, else
  ``flash``: FlashAttention (Dao et al., May 2022) entered the Megatron-LM and DeepSpeed training
  recipes in 2023, and runs published before that trained with Megatron's fused softmax over
  materialised scores.
  ``framework_options.attention`` naming a kernel stepsim prices (fa2, sdpa, fa3, cudnn, flex:
  NeMo AutoModel's ``attn: flex`` backend is PyTorch FlexAttention; cudnn91: the cuDNN of
  Transformer Engine's early-2024 releases, simulator.workload.attention) runs that kernel instead,
  read from its first word, so a note may follow ("sdpa (F.scaled_dot_product_attention)"); a
  statement of eager attention ("eager", materialised scores) runs ``unfused``, and of
  FlashAttention (v1) ("FlashAttention-1", flash_attn 0.x or 1.x) runs ``fa1``, and of flash
  attention with no version the framework's fused kernel (``flash``), whatever the year; MaxText's
  ``cudnn_flash_te`` runs ``cudnn``. Any other statement is a one-line error (it used to fall back to
  the defaults below without a word).
- layers not divisible by pp x vp: the first and last stages get f layers each and the others the
  rest evenly, f the largest value <= ceil(layers / (pp x vp)) that makes this possible (how
  Megatron-DeepSpeed balanced BLOOM, whose first and last stages also carry the embedding). When
  no equal f exists (DeepSeek-V3's 61 layers on 16 stages), Megatron-core's separate
  ``decoder_first_pipeline_num_layers`` / ``decoder_last_pipeline_num_layers``: the other stages
  get the fewest layers m that leaves first + last <= 2m, the first stage the larger share
  (the last also carries the head and MTP), printed as an assumption. A case's
  ``parallelism.pipeline_layout`` written as a Megatron-core layout string (``Et*4|(t*4|)*14tmL``)
  sets the first and last stages' layers instead when its middle stages are equal and its stage
  and layer counts match (``megatron_layout``); any other layout string is named in a note and
  the rule above applies. Descriptions (DualPipe, AutoModel's layers_per_stage) are not layouts.
  A nanotron run with pp > 1 takes nanotron's own cost-balanced split (``nanotron_split``, as
  ``parallelism.pipeline_layers``) whether or not pp divides the layers, and no interleaving
  (nanotron's 1f1b and afab engines have none).
- framework: the case's ``framework:`` when a profile of that name ships (``simulator/data/frameworks/``);
  when the case has no such key (the stacks of the calibration runs), ``nemo`` if its source names
  NeMo (whose recipes run TE userbuffers' TP overlap), else ``megatron-core``; the generic profile,
  in a note, when it is null or names a stack without a profile (``framework_of``).
- framework_options (each absent key takes the profile's default): ``compile``, ``cuda_graphs``,
  ``fp8_recipe`` (delayed, tensorwise, rowwise, blockwise, mxfp8), ``cross_entropy``, ``selective_recompute``,
  ``replica_combine_bytes`` (hybrid sharding's combined cross-copy all-reduces) and ``grad_collective``
  (ZeRO-1/2's gradient collective) go to the scenario's
  ``framework_options`` (a ``cuda_graphs`` scope written out: "full iteration" is true, a list of
  captured modules in parentheses becomes ``cuda_graph_scope``, those of Megatron-core's modules it
  names); ``async_tp`` and the ``overlap:`` mapping (tp_comm, grad_reduce,
  param_gather, param_prefetch_depth, async_tp, cp_comm) to its ``overlap`` section;
  ``activation_checkpointing`` (none, selective, full) sets recompute in place of the
  parallelism block's recompute text; ``pp_schedule`` and ``context_parallel_rotate`` as below.
  ``fp8_dot_product_attention`` sets ``training.fp8_attention`` when the run's precision is FP8;
  ``optimizer_state_dtype`` (fp32, bf16) sets ``training.optimizer_state_dtype``;
  ``cpu_offloading_num_layers`` and ``fine_grained_activation_offloading`` (a list of Megatron-core's
  offload modules) set ``training.activation_offload_layers`` / ``activation_offload_modules``;
  ``pipeline_passes`` sets ``training.pipeline_passes`` (a gradient-accumulation loop that calls
  the pipeline schedule once per accumulation step: NeMo AutoModel's GA column with PP > 1).
  ``cutedsl_fused_grouped_mlp`` (Megatron-Bridge) or ``use_transformer_engine_op_fuser`` sets
  ``framework_options.te_op_fuser``; ``moe_router_fusion``, ``moe_permute_fusion`` and
  ``enable_experimental`` and ``nccl_ub`` (Megatron-core's names) go to the scenario's ``framework_options`` as they are. A MaxText case's ``remat_policy: custom`` with
  ``remat_tensors_on_device`` (the tensor names its run set to ``device``) becomes a selective
  recompute policy (``maxtext_selective_policy``); ``minimal_flash`` is the profile's own. ``cross_entropy`` (megatron, megatron-fused, te, torch,
  torch-compiled, triton, xla) is the run's loss implementation (absent: the profile's; the rows
  state what their recipe at its release tag set). Other keys (pp_p2p, fsdp_*, ...) describe the run but are not
  modelled and are ignored.
- DeepSpeed's gradient collective: a DeepSpeed run whose source is dated before 2024 and that
  states no ``grad_collective`` takes ``reduce_scatter``. DeepSpeed's bucket all-reduce (its
  profile's value) came in 0.12.4; before it, one reduce per destination partition moved a
  reduce-scatter's bytes.
- GPU names: a catalog entry or alias, or a family match (``simulator.parts.gpus``); the
  96 GB H100 of Meta's Grand Teton hosts is its own entry (2.4 TB/s HBM2e); PCIe, NVL and 94 GB
  parts are an error, never mapped to the SXM part.
- ``framework_options.pipeline_schedule`` (or ``pp_schedule``) naming one of stepsim's split-backward
  schedules (dualpipe, dualpipev, zb-h1, zb-h2, zb-v) runs that schedule, with the vp it needs (1 for
  dualpipe and zb-h1/h2, 2 for the V-shaped ones); a layout the schedule cannot run (dualpipe: even
  pp, an even number of micro-batches >= 2 pp) takes the default below, with a note. DualPipe also sets ``moe.overlap_a2a``: the
  schedule exists to hide the EP all-to-alls under the paired forward/backward chunk's compute
  (DeepSeek-V3 technical report, arXiv 2412.19437, Sec. 3.2.1: "both all-to-all and PP
  communication can be fully hidden during execution"; DualPipeV the same, deepseek-ai/DualPipe).
- vp given with pp 1 (no pipeline to interleave): ignored, with a note.
- dp that leaves out the expert ranks (``dp_convention: excludes_expert_ranks``, or tp x pp x dp
  x cp != the GPU count while tp x pp x cp divides it): dp = GPUs / (tp x pp x cp), with a note.
- MoE models: the architecture comes from the shipped catalog when the case's ``hf_id`` is in it
  (``model: org/name``), else from the case's fields (``head_dim``, ``moe_ffn_hidden``,
  ``shared_experts``, ``first_k_dense``, ``mla`` with ``q_lora_rank`` / ``kv_lora_rank`` /
  ``qk_rope_head_dim`` and per-head nope and value widths = head_dim, ``mtp_layers``); ``etp``
  when given. MoE options from ``framework_options``: ``moe_token_dispatcher`` flex / deepep /
  DeepEP-like -> flex (naming hybridep: flex with ``flex_backend: hybridep``), alltoall -> alltoall, otherwise alltoall (the Megatron-Bridge recipes');
  ``moe_expert_capacity_factor`` with ``moe_pad_expert_input_to_capacity`` or dropless false ->
  capacity_factor; ``moe_a2a_1f1b_overlap`` or Megatron-Bridge's ``moe_a2a_overlap`` (which sets
  Megatron-core's overlap_moe_expert_parallel_comm, scripts/performance/utils/overrides.py) -> overlap_a2a; "node-limited to N" -> max_nodes_per_token;
  a model whose router picks topk_group of n_group expert groups (DeepSeek-V3: 4 of 8) with EP
  spanning exactly n_group nodes is node-limited to topk_group nodes. Routing is taken as balanced
  (imbalance 1): published MoE benchmarks force-balance the router. Megatron-core cases on Hopper
  run their experts through Transformer Engine's GroupedLinear, which there launches one cuBLAS
  GEMM per expert on 4 streams (``moe.grouped_gemm_streams: 4``, simulator.workload.moe); the
  CUTLASS grouped kernel is opt-in (NVTE_USE_CUTLASS_GROUPED_GEMM) and BF16-only. Other
  frameworks and GPUs keep the one grouped kernel (not checked against their sources here).

"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

from simulator.workload.compute import param_counts
from simulator.parts.frameworks import CUDA_GRAPH_SCOPES, GENERIC, framework_names
from simulator.parts.topology import load_topology
from simulator.common.errors import ConfigError
from simulator.common.yamlfile import load_yaml_file
from simulator.scenario.load import scenario_from_dict
from simulator.common.schema import optional_whole, whole
from simulator.layout.grid import framework_counts
from simulator.layout.schedules import check_schedule_args
from simulator.parts.gpus import get_gpu
from simulator.parts.models import catalog_config, catalog_ids
from simulator.scenario.config import (HIDDEN_ACTS, POSITION_EMBEDDINGS, QUANTIZED_PRECISIONS, RECOMPUTE_MODULES,
                                       ModelConfig)
from simulator.workload.moe import TE_GEMM_STREAMS


def _moe_shape(model: dict) -> dict:
    """The case's expert width, shared experts, leading dense layers and MLA ranks as ModelConfig
    fields: the scenario's model (``_case_model``) and the parameter count the activation is
    fitted on (``_hidden_act``; Kimi K2's 1.04T needs its 2,048-wide experts and MLA to come out
    SwiGLU)."""
    out: dict = {}
    if model.get("experts"):
        if model.get("moe_ffn_hidden"):
            out["moe_intermediate_size"] = model["moe_ffn_hidden"]
        out["num_shared_experts"] = model.get("shared_experts") or 0
        out["first_k_dense_replace"] = model.get("first_k_dense") or 0
    if model.get("mla"):
        d = model.get("head_dim") or model["hidden"] // model["heads"]
        out.update(q_lora_rank=model.get("q_lora_rank"), kv_lora_rank=model.get("kv_lora_rank"),
                   qk_nope_head_dim=d, qk_rope_head_dim=model.get("qk_rope_head_dim") or 0, v_head_dim=d)
    return out


def _tied(model: dict) -> bool:
    """The case's ``tied`` (input embedding and LM head share one matrix); false when not stated."""
    tied = model.get("tied", False)
    if not isinstance(tied, bool):
        raise ConfigError("model.tied", tied, "must be true or false")
    return tied


def _plain_model(m: dict) -> dict:
    """The scenario's model fields of a case's dense shape (no catalog id, no MoE)."""
    return {"hidden_size": m["hidden"], "num_hidden_layers": m["layers"], "num_attention_heads": m["heads"],
            "num_key_value_heads": m.get("kv_heads") or m["heads"], "intermediate_size": m["ffn_hidden"],
            "vocab_size": m["vocab"], "hidden_act": _hidden_act(m), "tie_word_embeddings": _tied(m),
            "position_embedding": _position_embedding(m)}


def _position_embedding(model: dict) -> str:
    """The case's ``position_embedding`` (rope, learned, alibi, none); rope when not stated."""
    stated = model.get("position_embedding", "rope")
    if stated not in POSITION_EMBEDDINGS:
        raise ConfigError("model.position_embedding", stated, f"valid: {', '.join(POSITION_EMBEDDINGS)}")
    return stated


def _hidden_act(model: dict) -> str:
    stated = model.get("hidden_act")
    if stated is not None:
        if stated not in HIDDEN_ACTS:
            raise ConfigError("model.hidden_act", stated, f"valid: {', '.join(HIDDEN_ACTS)}")
        return stated
    target = (model.get("params_b") or 0) * 1e9
    if not target:
        return "gelu" if model["ffn_hidden"] == 4 * model["hidden"] else "silu"
    best, best_err = "gelu", math.inf
    for act in ("gelu", "silu"):
        cfg = ModelConfig(hidden_size=model["hidden"], num_hidden_layers=model["layers"],
                          num_attention_heads=model["heads"], num_key_value_heads=model.get("kv_heads") or model["heads"],
                          intermediate_size=model["ffn_hidden"], vocab_size=model["vocab"], hidden_act=act,
                          tie_word_embeddings=_tied(model),
                          num_experts=model.get("experts") or 0, num_experts_per_tok=model.get("topk") or 0,
                          **_moe_shape(model))
        err = abs(param_counts(cfg)["total"] - target)
        if err < best_err:
            best, best_err = act, err
    return best


def _gpt2_class(case: dict) -> bool:
    """Whether the case's model is transformers' GPT-2 class: a GPT-2 checkpoint
    (openai-community/gpt2*) or a stated GPT2LMHeadModel. Its config's activation_function is
    gelu_new (GPT2Config's default, and every openai-community/gpt2* config.json)."""
    hf_id = str(case["model"].get("hf_id") or "").lower()
    return hf_id.split("/")[-1].startswith("gpt2") or "GPT2LMHeadModel" in str(case.get("framework_options") or "")


def _uneven(layers: int, n: int) -> tuple[int, int] | None:
    """(first, last) layers for Megatron-core's uneven split when no equal first/last split exists."""
    if n < 3:
        return None
    for m in range(1, layers + 1):
        rest = layers - m * (n - 2)
        if rest < 0:
            return None
        if rest <= 2 * m:
            last = rest // 2
            return rest - last, last
    return None


def _ends(layers: int, n: int) -> int | None:
    """Layers on the first and last virtual stage when ``n`` does not divide ``layers``."""
    if layers % n == 0 or n < 3:
        return None
    for f in range(math.ceil(layers / n), -1, -1):
        if 2 * f <= layers and (layers - 2 * f) % (n - 2) == 0:
            return f
    return None


# The characters of a Megatron-core layout string (anything else is a description of the run)
LAYOUT_TEXT = re.compile(r"[EtmL|()*0-9]+")


def megatron_layout(text: str, stages: int) -> tuple[int, int, int, int] | None:
    """(first, middle, last, total) decoder layers of a Megatron-core ``pipeline_model_parallel_layout`` string
    (``E`` embedding, ``t`` a decoder layer, ``m`` the MTP block, ``L`` the loss, ``|`` between
    virtual stages, ``X*n`` and ``(X)*n`` repetitions; megatron/core/transformer/pipeline_parallel_layer_layout.py)
    when it has ``stages`` stages whose middle ones all hold the same number of layers, the form
    stepsim's first/last split can run (embedding on the first stage, MTP and loss on the last);
    None for any other string."""
    s = text.replace(" ", "")
    if not LAYOUT_TEXT.fullmatch(s):
        return None
    for _ in range(8):  # expand repetitions, innermost first
        new = re.sub(r"\(([^()]*)\)\*(\d+)", lambda g: g.group(1) * int(g.group(2)), s)
        new = re.sub(r"([EtmL])\*(\d+)", lambda g: g.group(1) * int(g.group(2)), new)
        if new == s:
            break
        s = new
    if re.search(r"[()*0-9]", s):
        return None
    parts = s.rstrip("|").split("|")
    if len(parts) != stages or stages < 3 or not parts[0].startswith("E") or not parts[-1].endswith("L"):
        return None
    if any(ch in part for part in parts[1:-1] for ch in "EmL") or "m" in parts[0] or "E" in parts[-1]:
        return None
    middle = {part.count("t") for part in parts[1:-1]}
    if len(middle) != 1:
        return None
    first, last, each = parts[0].count("t"), parts[-1].count("t"), middle.pop()
    return first, each, last, first + last + each * (stages - 2)


def _stated_layout(text, layers: int, stages: int, notes: list[str]) -> tuple[int, int] | None:
    """(first, last) from the case's ``parallelism.pipeline_layout`` when it is a Megatron-core
    layout string stepsim's first/last split can run, with a note either way; None otherwise (no
    layout, or a description such as "DualPipe" or AutoModel's layers_per_stage)."""
    layout = str(text or "").replace(" ", "")
    if not LAYOUT_TEXT.fullmatch(layout):
        return None
    stated = megatron_layout(layout, stages)
    if stated is None or stated[3] != layers:
        notes.append(f"pipeline_layout {layout} is not a first/equal-middle/last split of {layers} layers "
                     f"on {stages} stages: stepsim's split instead")
        return None
    notes.append(f"{layers} layers on {stages} virtual stages as the case's pipeline_layout: "
                 f"first {stated[0]}, last {stated[2]}, {stated[1]} on each other")
    return stated[0], stated[2]


BUBBLE_BOUND = 0.15


def pipeline_ends(layers: int, n: int) -> tuple[int | None, int | None]:
    """(first, last) layers of the first and last of ``n`` virtual stages when ``n`` does not
    divide ``layers``: equal ends when some exist (``_ends``), else Megatron-core's unequal split
    (``_uneven``); (None, None) when ``n`` divides the layers or neither exists."""
    if layers % n == 0:
        return None, None
    ends = _ends(layers, n)
    if ends is not None:
        return ends, ends
    return _uneven(layers, n) or (None, None)


def nanotron_split(model: dict, pp: int) -> tuple[int, ...]:
    """Decoder layers per pipeline stage as nanotron places them: its profile's own split
    (``grid.framework_counts``, profile ``pipeline.split: parameters``) of the case's model."""
    return framework_counts(ModelConfig(**_plain_model(model)), "nanotron", pp, 1, None, None)


def _splits(layers: int, n: int) -> bool:
    return layers % n == 0 or _ends(layers, n) is not None


def default_vp(layers: int, pp: int, m: int) -> int:
    """Interleave degree for a case that does not give one (see the module docstring)."""
    if pp < 2 or m % pp or (pp - 1) / (m + pp - 1) <= BUBBLE_BOUND:
        return 1
    runnable = [v for v in range(2, math.ceil(layers / pp) + 2) if _splits(layers, pp * v)]
    for v in runnable:
        if (pp - 1) / (v * m + pp - 1) <= BUBBLE_BOUND:
            return v
    return runnable[-1] if runnable else 1


def _stated_vp(case: dict) -> int | None:
    """1 when the case says it ran a non-interleaved pipeline schedule (``framework_options.
    pp_schedule``: 1F1B or GPipe, as torchtitan's tables do), else None (the default applies)."""
    stated = str((case.get("framework_options") or {}).get("pp_schedule") or "").lower().replace("-", "")
    return 1 if stated in ("1f1b", "gpipe") else None


SPLIT_SCHEDULES = {"dualpipe": 1, "dualpipev": 2, "zb-h1": 1, "zb-h2": 1, "zb-v": 2}


def _stated_schedule(case: dict) -> str | None:
    """The split-backward schedule the case names (``SPLIT_SCHEDULES``), else None."""
    opts = case.get("framework_options") or {}
    stated = str(opts.get("pipeline_schedule") or opts.get("pp_schedule") or "").lower().replace("_", "-")
    return stated if stated in SPLIT_SCHEDULES else None


STATED_ATTENTION = ("fa2", "sdpa", "fa3", "cudnn", "cudnn91", "flex")


# llm-foundry's ``attn_config.attn_impl`` (Composer runs): "flash" is the flash_attn package that
# simulator/data/frameworks/composer.yaml prices (its profile kernel), "torch" the unfused softmax(Q K^T) V of
# llmfoundry/models/layers/attention.py (scaled_multihead_dot_product_attention), "triton"
# llm-foundry's own Triton FlashAttention (llmfoundry/models/layers/flash_attn_triton.py), priced
# by ``attention``'s ``triton`` kernel: FA2's curve over 1.4 forward and over 2 backward, as the
# FlashAttention-2 paper measured FlashAttention in Triton (Sec. 4.1).
ATTN_IMPL = {"flash": "flash", "torch": "unfused", "triton": "triton"}


def _attn_impl(case: dict) -> str:
    """The case's ``framework_options.attn_impl``: its first word, lower case ("" when absent;
    a note may follow it, e.g. "triton (submit_benchmarks default at the time)")."""
    words = str((case.get("framework_options") or {}).get("attn_impl") or "").split()
    return words[0].lower() if words else ""


# A stated FlashAttention (v1): its name or a flash_attn release before 2.0
_FA1 = re.compile(r"flashattention-1|flash-attention 1\b|flash_attn (?:0|1)\.")


def stated_attention(stated: str) -> str | None:
    """The kernel a case's ``framework_options.attention`` statement names (module docstring), or
    None when it names none stepsim prices."""
    stated = stated.lower().strip()
    first = re.split(r"[\s(;,]", stated, maxsplit=1)[0]
    if first in STATED_ATTENTION:
        return first
    if first == "cudnn_flash_te":  # MaxText's name for Transformer Engine's cuDNN fused attention
        return "cudnn"
    if first == "eager" or "materialised scores" in stated or "materialized scores" in stated:
        return "unfused"
    if _FA1.search(stated):
        return "fa1"
    if first in ("flash", "flash-attn", "flashattention", "flash_attn"):
        return "flash"
    return None


STATED_ATTENTION_HELP = ("must start with fa2, sdpa, fa3, cudnn, cudnn91, flex, flash, eager (materialised scores) "
                         "or FlashAttention-1 / flash_attn 1.x; the source's own words may follow, or go in another key")


def _attention_of(case: dict) -> str:
    """The scenario's ``training.attention`` for a case (module docstring, ``ATTN_IMPL``); a
    statement that names no kernel stepsim prices is a one-line error, not the default."""
    stated = (case.get("framework_options") or {}).get("attention")
    named = stated_attention(str(stated or ""))
    if stated and not named:
        raise ConfigError("framework_options.attention", stated, STATED_ATTENTION_HELP)
    if named:
        return named
    impl = _attn_impl(case)
    if impl in ATTN_IMPL:
        return ATTN_IMPL[impl]
    return "unfused" if (source_year(case) or 9999) < 2023 else "flash"


def attention_note(case: dict) -> str | None:
    """What the validation assumed of a stated attention kernel it has no curve for, else None."""
    impl = _attn_impl(case)
    if not impl or impl in ATTN_IMPL:
        return None
    return (f"attn_impl {impl} (no measured curve) priced as the framework's fused kernel: "
            f"fast by as much as that kernel is slower")


def source_year(case: dict) -> int | None:
    text = str(case.get("source", ""))
    arxiv = re.search(r"arXiv[: ]*(\d{2})(\d{2})\.\d{4,5}", text)
    if arxiv:
        return 2000 + int(arxiv.group(1))
    year = re.search(r"\b(20\d{2})\b", text)
    return int(year.group(1)) if year else None


OVERLAP_OPTIONS = ("tp_comm", "grad_reduce", "param_gather", "param_prefetch_depth", "async_tp", "cp_comm")
FRAMEWORK_OPTIONS = ("compile", "cuda_graphs", "fp8_recipe", "replica_combine_bytes", "te_op_fuser", "cross_entropy",
                     "selective_recompute", "moe_router_fusion", "moe_permute_fusion", "enable_experimental",
                     "grad_collective", "nccl_ub")
# DeepSpeed's ZeRO-1/2 all-reduce each gradient bucket since its multi-rank bucket all-reduce
# (deepspeedai/DeepSpeed #4695, merged 2023-11-21, released in 0.12.4); before it, one reduce per
# destination partition moved the bytes of a reduce-scatter
DEEPSPEED_BUCKET_ALL_REDUCE_YEAR = 2024


def _fp8_attention(case: dict) -> bool:
    """``framework_options.fp8_dot_product_attention`` (Megatron-core / TE) in a run with an FP8 precision."""
    opts = case.get("framework_options") or {}
    return bool(opts.get("fp8_dot_product_attention")) and precision_of(case) in QUANTIZED_PRECISIONS


def _training_options(case: dict) -> dict:
    """The scenario's ``training`` keys a case states in ``framework_options``:
    ``optimizer_state_dtype`` (bf16: Megatron-core's precision-aware optimizer with bf16 Adam
    moments, as the DeepSeek-V3 report and NVIDIA's GB200 guide ran; absent, fp32 moments) and
    ``pipeline_passes`` (absent, one run of the pipeline schedule per step); CPU activation
    offloading as Megatron-core names it: ``cpu_offloading_num_layers`` (Megatron-Bridge's
    performance recipes) becomes ``activation_offload_layers`` and ``fine_grained_activation_offloading``
    (the ``--offload-modules`` list) ``activation_offload_modules``."""
    opts = case.get("framework_options") or {}
    out = {key: opts[key] for key in ("optimizer_state_dtype", "pipeline_passes") if opts.get(key) is not None}
    if opts.get("cpu_offloading_num_layers") is not None:
        out["activation_offload_layers"] = opts["cpu_offloading_num_layers"]
    if opts.get("fine_grained_activation_offloading") is not None:
        out["activation_offload_modules"] = opts["fine_grained_activation_offloading"]
    return out


def framework_of(case: dict, notes: list[str]) -> str:
    """The case's profile: its ``framework:`` when stepsim ships one of that name; when the case has
    no such key (the format's convention: the calibration runs of shared/validation are Megatron-LM
    and NeMo, and predate the key), ``nemo`` if its source names NeMo (NVIDIA's NeMo performance
    tables and recipes, dgxc-benchmarking's ``nemo_megatron``, Megatron-Bridge: they run TE
    userbuffers' TP overlap, e.g. dgxc-benchmarking 35a9aec ``nemo_megatron/gpt3_175b_hydra.yaml``
    ``ub_tp_comm_overlap: true``), else ``megatron-core``; the generic profile, noted, when the case
    says null or names a stack stepsim has no profile for."""
    if "framework" not in case:
        return "nemo" if "nemo" in str(case.get("source", "")).lower() else "megatron-core"
    name = case["framework"]
    if name is None:
        notes.append("framework not stated: the generic profile")
        return GENERIC
    if not isinstance(name, str) or name not in framework_names():
        notes.append(f"framework {name}: no shipped profile, the generic profile assumed")
        return GENERIC
    return name


def _framework_keys(case: dict) -> dict:
    """The scenario's framework, overlap and framework_options keys from the case (module docstring)."""
    opts = case.get("framework_options") or {}
    if not isinstance(opts, dict):
        raise ConfigError(f"{case.get('id')}: framework_options", opts, "must be a mapping")
    overlap = {k: v for k, v in (opts.get("overlap") or {}).items() if k in OVERLAP_OPTIONS}
    if "async_tp" in opts:
        overlap["async_tp"] = opts["async_tp"]
    options = {k: opts[k] for k in FRAMEWORK_OPTIONS if k in opts}
    if opts.get("cutedsl_fused_grouped_mlp") or opts.get("use_transformer_engine_op_fuser"):
        options["te_op_fuser"] = True  # Megatron-Bridge's name for Megatron-core's TE op-fuser experts
    graphs = options.get("cuda_graphs")
    if isinstance(graphs, str):  # tables describe the capture scope: a whole iteration, or some modules
        if "full" in graphs.lower():
            options["cuda_graphs"] = True
        else:
            del options["cuda_graphs"]
            named = re.findall(r"[a-z_]+", graphs.partition("(")[2].lower())
            scope = [m for m in named if m in CUDA_GRAPH_SCOPES]
            if scope:  # "transformer_engine (attn, moe_router, moe_preprocess)"
                options["cuda_graph_scope"] = scope
    out = {"framework": "megatron-core", "framework_options": options}
    if overlap:
        out["overlap"] = overlap
    return out


def _case_model(m: dict) -> tuple[dict | str, list[str]]:
    """The scenario's model section for a case: its HF id when the catalog has it, else its fields."""
    hf_id = m.get("hf_id")
    if hf_id and hf_id in catalog_ids():
        stated = m.get("mtp_layers")
        if stated is not None and stated != scenario_from_dict({"model": hf_id}).model.num_nextn_predict_layers:
            # the run's own MTP depth (DeepSeek-V3 "w/o MTP" rows) over the config's
            return {"hf_id": hf_id, "num_nextn_predict_layers": stated}, []
        return hf_id, []
    model = _plain_model(m)
    if m.get("head_dim") and m["head_dim"] * m["heads"] != m["hidden"]:
        model["kv_channels"] = m["head_dim"]
    if m.get("experts"):
        model.update(num_experts=m["experts"], num_experts_per_tok=m.get("topk") or 1)
    model.update(_moe_shape(m))
    if m.get("mla"):
        model.pop("kv_channels", None)
    if m.get("mtp_layers"):
        model["num_nextn_predict_layers"] = m["mtp_layers"]
    notes = [f"{hf_id} not in the catalog: model from the case's fields"] if hf_id else []
    return model, notes


def _moe_options(case: dict, m: dict, model, ep: int, etp: int, gpn: int) -> tuple[dict, list[str]]:
    opts = case.get("framework_options") or {}
    out, notes = {}, []
    dispatcher = str(opts.get("moe_token_dispatcher") or "").lower()
    out["token_dispatcher"] = "flex" if ("flex" in dispatcher or "deepep" in dispatcher
                                         or "hybridep" in dispatcher) else "alltoall"
    if "hybridep" in dispatcher:
        out["flex_backend"] = "hybridep"
    dropless = opts.get("moe_token_dropless")
    if opts.get("moe_expert_capacity_factor") is not None and (opts.get("moe_pad_expert_input_to_capacity")
                                                                or dropless is False):
        out["capacity_factor"] = float(opts["moe_expert_capacity_factor"])
    if opts.get("moe_a2a_1f1b_overlap") or opts.get("moe_a2a_overlap"):
        out["overlap_a2a"] = True
    limit = re.search(r"node-limited to (\d+)", dispatcher + " " + str(opts.get("moe_routing") or ""))
    nodes = -(-ep * etp // gpn)
    if limit:
        out["max_nodes_per_token"] = int(limit.group(1))
    elif isinstance(model, str):
        hf = catalog_config(model)
        if hf.get("n_group") and hf.get("topk_group") and nodes == hf["n_group"] and hf["topk_group"] < nodes:
            out["max_nodes_per_token"] = hf["topk_group"]
            notes.append(f"group-limited routing ({hf['topk_group']} of {hf['n_group']} groups) on EP over "
                         f"{nodes} nodes: max_nodes_per_token {hf['topk_group']}")
    return out, notes


def _recompute_modules(case: dict) -> list[str] | None:
    """The Megatron-core recompute modules a selective-recompute case names, else None."""
    stated = (case.get("framework_options") or {}).get("recompute_modules")
    if isinstance(stated, (list, tuple)):
        words = [str(w).lower() for w in stated]
    else:
        words = re.findall(r"[a-z_]+", str((case.get("parallelism") or {}).get("recompute") or "").lower())
    found = [w for w in dict.fromkeys(words) if w in RECOMPUTE_MODULES]
    return found or None


def case_to_scenario_dict(case: dict, notes: list[str] | None = None) -> dict:
    """A scenario (as a dict) from the description of one published run; what it had to assume
    beyond the module docstring's defaults is appended to ``notes``."""
    notes = [] if notes is None else notes
    m, hw, par = case["model"], case["hardware"], case["parallelism"]
    gpu = hw["gpu"]
    gpn = gpus_per_domain(hw, notes)
    checkpointing = (case.get("framework_options") or {}).get("activation_checkpointing")
    if checkpointing and not str(checkpointing).lower().startswith(("none", "selective", "full")):
        raise ConfigError("framework_options.activation_checkpointing", checkpointing,
                          "must start with none, selective or full (a statement of the source may follow, or go "
                          "in another key)")
    recompute_text = str(checkpointing or par.get("recompute") or "").lower()
    sp_text = str(par.get("recompute") or "").lower()
    if recompute_text.startswith("full"):
        recompute = "full"
    elif recompute_text.startswith("selective"):
        recompute = "selective"
    else:
        recompute = "none"
    sp = "sequence-parallel" in sp_text or (not sp_text and par["tp"] > 1)
    if par.get("sequence_parallel") is not None:
        if not isinstance(par["sequence_parallel"], bool):
            raise ConfigError("parallelism.sequence_parallel", par["sequence_parallel"], "must be true or false")
        sp = par["sequence_parallel"]
    pp, cp = par["pp"], par.get("cp") or 1
    base = par["tp"] * pp * cp
    dp = par.get("dp") or hw["count"] // base
    if hw["count"] % base == 0 and (base * dp != hw["count"] or par.get("dp_convention") == "excludes_expert_ranks"):
        if base * dp != hw["count"]:
            notes.append(f"dp {dp} leaves out expert ranks: dp = {hw['count']} GPUs / (tp x pp x cp = {base}) "
                         f"= {hw['count'] // base}")
        dp = hw["count"] // base
    mbs = par.get("mbs") or 1
    split_schedule = _stated_schedule(case) if pp > 1 else None
    if split_schedule:
        try:
            check_schedule_args(split_schedule, pp, par["gbs"] // max(1, dp * mbs), SPLIT_SCHEDULES[split_schedule])
        except ConfigError as err:
            notes.append(f"{split_schedule} cannot run this layout ({err}): the default schedule instead")
            split_schedule = None
    if split_schedule:
        vp = SPLIT_SCHEDULES[split_schedule]
    else:
        vp = par.get("vp") or _stated_vp(case) or default_vp(m["layers"], pp, par["gbs"] // max(1, dp * mbs))
    if vp > 1 and pp == 1:
        notes.append(f"vp {vp} ignored at pp 1")
        vp = 1
    split = None
    if pp > 1 and framework_of(case, []) == "nanotron":
        if vp > 1:
            notes.append(f"vp {vp} ignored: nanotron's pipeline engines (1f1b, afab) do not interleave")
            vp = 1
        split = nanotron_split(m, pp)
    first, last = pipeline_ends(m["layers"], pp * vp) if split is None else (None, None)
    stated = _stated_layout(par.get("pipeline_layout"), m["layers"], pp * vp, notes) if split is None else None
    if split is not None:
        notes.append(f"nanotron's cost-balanced split of {m['layers']} layers: {', '.join(map(str, split))}")
    elif stated is not None:
        first, last = stated
    elif first != last:  # the unequal split (equal ends need no note)
        notes.append(f"{m['layers']} layers on {pp * vp} virtual stages: first {first}, last {last}, "
                     f"{(m['layers'] - first - last) // (pp * vp - 2)} on each other")
    parallelism = {"tp": par["tp"], "pp": pp, "dp": dp, "cp": cp,
                   "ep": par.get("ep") or 1, "vp": vp, "sequence_parallel": bool(sp),
                   "zero_stage": 1 if par.get("zero_stage") is None else par["zero_stage"]}
    ep = parallelism["ep"]
    if par.get("etp") is not None and ep > 1:
        parallelism["etp"] = par["etp"]
        if par["etp"] < par["tp"]:
            parallelism["sequence_parallel"] = True
    elif ep > 1 and (dp * cp) % ep and (par["tp"] * dp * cp) % ep == 0:
        parallelism.update(etp=1, sequence_parallel=True)  # expert groups span TP ranks (MoE parallel folding)
    if (par.get("dp_replicate") or 1) > 1:
        parallelism["dp_replicate"] = par["dp_replicate"]
    if first is not None:
        parallelism.update(first_pipeline_num_layers=first, last_pipeline_num_layers=last)
    if split is not None:
        parallelism["pipeline_layers"] = list(split)
    rotate = str((case.get("framework_options") or {}).get("context_parallel_rotate") or "").lower()
    if cp > 1 and rotate.replace("-", "_") in ("allgather", "all_gather"):
        parallelism["cp_comm_type"] = "all_gather"
    if m.get("experts") or m.get("hf_id"):
        model, model_notes = _case_model(m)
        notes.extend(model_notes)
    else:
        model = _plain_model(m)
    if isinstance(model, dict) and model.get("hidden_act") == "gelu" and _gpt2_class(case):
        model["hidden_act"] = "gelu_new"
    moe = {}
    if m.get("experts"):
        moe, moe_notes = _moe_options(case, m, model, ep, parallelism.get("etp") or par["tp"], gpn)
        notes.extend(moe_notes)
    out = {
        "name": case["id"],
        "model": model,
        "cluster": {"topology": topology_for(gpu),
                    "num_nodes": max(1, hw["count"] // gpn), "gpus_per_node": min(gpn, hw["count"]),
                    "gpu": gpu, "nvlink_bandwidth_GBps": hw.get("intra_node_bw_GBps"),
                    "network_bandwidth_Gbps": hw.get("inter_node_bw_Gbps_per_gpu")},
        "training": {"seq_length": m["seq_len"], "micro_batch_size": mbs,
                     "global_batch_size": par["gbs"],
                     "precision": precision_of(case),
                     "recompute": recompute,
                     "attention": _attention_of(case),
                     **({"fp8_attention": True} if _fp8_attention(case) else {}),
                     **_training_options(case)},
        "parallelism": parallelism,
        "schedule": split_schedule or ("interleaved" if vp > 1 else "1f1b"),
        **_framework_keys(case),
        "framework": framework_of(case, notes),
    }
    if m.get("experts") and out["framework"] == "megatron-core" and _hopper(gpu):
        moe["grouped_gemm_streams"] = TE_GEMM_STREAMS  # TE GroupedLinear on Hopper (module docstring)
    if split_schedule in ("dualpipe", "dualpipev") and m.get("experts"):
        moe["overlap_a2a"] = True  # DualPipe's chunk pairing hides the all-to-alls (module docstring)
    if moe:
        out["moe"] = moe
    if (out["framework"] == "deepspeed" and "grad_collective" not in out["framework_options"]
            and (source_year(case) or 9999) < DEEPSPEED_BUCKET_ALL_REDUCE_YEAR):
        out["framework_options"]["grad_collective"] = "reduce_scatter"
        notes.append("DeepSpeed before its bucket all-reduce (0.12.4): ZeRO-1/2 gradients reduced per partition, "
                     "as a reduce-scatter")
    note = attention_note(case)
    if note:
        notes.append(note)
    modules = _recompute_modules(case) if recompute == "selective" else None
    if modules:
        out["training"]["recompute_modules"] = modules
    policy = maxtext_selective_policy(case) if recompute == "selective" else None
    if policy:
        out["framework_options"]["selective_recompute"] = policy
        notes.append(f"MaxText remat_policy {case['framework_options']['remat_policy']}: selective recompute "
                     f"{policy}")
    return out


# MaxText's remat tensor names (src/maxtext/configs/types.py RematAndOffload; base.yml): what its
# custom policy saves when set to "device" (``remat_tensors_on_device`` in a case, MaxText's
# cfg.tensors_on_device). decoder_layer_input is "device" by default; mlpwo's output is not a
# residual of the backward, so saving it changes nothing.
_ATTENTION_PROJECTIONS = {"query_proj", "key_proj", "value_proj", "out_proj"}
_MLP_INPUTS = {"mlpwi", "mlpwi_0", "mlpwi_1"}


def maxtext_selective_policy(case: dict) -> str | None:
    """The selective-recompute policy (``frameworks.SELECTIVE_POLICIES``) a MaxText case's
    ``framework_options.remat_policy`` is, when it is not the profile's (``minimal_flash``):
    ``custom`` with Q, K, V and the output projection on device and neither the context nor the MLP
    inputs is ``attention_projections``; with all of them it is ``elementwise``. Any other custom set
    is a one-line error naming what stepsim models."""
    opts = case.get("framework_options") or {}
    if case.get("framework") != "maxtext" or str(opts.get("remat_policy") or "") != "custom":
        return None
    saved = opts.get("remat_tensors_on_device")
    if not isinstance(saved, list) or not all(isinstance(n, str) for n in saved):
        raise ConfigError(f"{case.get('id')}: framework_options.remat_tensors_on_device", saved,
                          "remat_policy custom needs the list of MaxText tensor names set to device")
    names = set(saved)
    if _ATTENTION_PROJECTIONS <= names and "context" not in names and not names & _MLP_INPUTS:
        return "attention_projections"
    if _ATTENTION_PROJECTIONS | {"context"} <= names and ({"mlpwi"} <= names or {"mlpwi_0", "mlpwi_1"} <= names):
        return "elementwise"
    raise ConfigError(f"{case.get('id')}: framework_options.remat_tensors_on_device", sorted(names),
                      "stepsim models query_proj, key_proj, value_proj and out_proj saved with neither context nor "
                      "mlpwi* (attention_projections), or with both (elementwise)")


def _hopper(gpu: str) -> bool:
    try:
        return get_gpu(gpu).nvlink_generation == 4
    except ConfigError:
        return False


# A GB200 / GB300 NVL72 rack is 18 compute trays of 4 GPUs (NVIDIA GB200 NVL72 datasheet: 36 Grace
# CPUs and 72 Blackwell GPUs, two superchips per tray); a job takes whole trays of a rack.
NVL72_TRAY_GPUS = 4


def gpus_per_domain(hw: dict, notes: list[str]) -> int:
    """The case's GPUs per NVLink domain: its ``gpus_per_node``, else 8 (a DGX/HGX node), or on an
    NVL72 rack the whole rack. A count that is not a whole number of such domains on NVL72 racks
    runs on the largest whole number of trays per rack that divides it (256 GPUs: 4 racks of 64,
    16 of the 18 trays, the block Megatron-Bridge's Slurm recipes use), in a note."""
    rack = load_topology(topology_for(hw["gpu"])).gpus_per_node
    given = hw.get("gpus_per_node")
    gpn = given or (rack if rack > 8 else 8)
    count = hw["count"]
    if rack > 8 and count > gpn and count % gpn:
        fits = [g for g in range(NVL72_TRAY_GPUS, min(gpn, rack) + 1, NVL72_TRAY_GPUS) if count % g == 0]
        if fits:
            notes.append(f"{count} GPUs on {rack}-GPU racks: {count // fits[-1]} racks of {fits[-1]} GPUs "
                         f"({fits[-1] // NVL72_TRAY_GPUS} of {rack // NVL72_TRAY_GPUS} trays)")
            return fits[-1]
    return gpn


def topology_for(gpu: str) -> str:
    """The shipped topology a case on ``gpu`` runs on (see the module docstring)."""
    name = str(gpu).upper().replace("NVIDIA", "").strip()
    for prefix, topology in (("A100", "dgx-a100"), ("GB200", "gb200-nvl72"), ("GB300", "gb300-nvl72"),
                             ("B200", "dgx-b200"), ("B300", "hgx-b300")):
        if name.startswith(prefix):
            return topology
    return "dgx-h100"


def precision_of(case: dict) -> str:
    text = str(case.get("precision", "")).lower()
    for name in ("mxfp8", "nvfp4", "fp8"):
        if name in text:
            return name
    return "bf16"


def measured_step(case: dict, flops_per_gpu: float | None = None, peak_flops: float | None = None
                  ) -> tuple[float | None, str | None]:
    """(measured step time, what it came from). In order: ``measured.step_time_s``,
    ``derived.step_time_s``, tokens per second per GPU (global batch x sequence / (rate x GPUs),
    convention-free), then TFLOP/s per GPU or MFU converted with stepsim's model FLOPs per step
    (``flops_per_gpu``, in the convention the case's ``measured.flops_convention`` states: the
    caller, ``studies.validate.predict``, counts them so; noted as the basis)."""
    meas = case.get("measured") or {}
    if meas.get("step_time_s"):
        return meas["step_time_s"], "step_time"
    if (case.get("derived") or {}).get("step_time_s"):
        return case["derived"]["step_time_s"], "derived_step_time"
    hw, par, model = case.get("hardware") or {}, case.get("parallelism") or {}, case.get("model") or {}
    rate = meas.get("tokens_per_s_per_gpu")
    if rate and hw.get("count") and par.get("gbs") and model.get("seq_len"):
        return par["gbs"] * model["seq_len"] / (rate * hw["count"]), "tokens_per_s"
    if flops_per_gpu and meas.get("tflops_per_gpu"):
        return flops_per_gpu / (meas["tflops_per_gpu"] * 1e12), "tflops_model_flops"
    if flops_per_gpu and peak_flops and meas.get("mfu"):
        return flops_per_gpu / (meas["mfu"] * peak_flops), "mfu_model_flops"
    return None, None


def groups_of(case: dict, scenario_dict: dict) -> dict[str, str]:
    par = scenario_dict["parallelism"]
    axes = "+".join(a for a in ("tp", "pp", "dp", "cp", "ep") if (par.get(a) or 1) > 1) or "single"
    return {"gpu": scenario_dict["cluster"]["gpu"], "precision": scenario_dict["training"]["precision"],
            "kind": "moe" if (case.get("model") or {}).get("experts") else "dense", "axes": axes}


_CASE_SECTIONS = {"model": (), "hardware": ("gpu", "count"), "parallelism": ("tp", "pp", "gbs")}  # model: below
# Counts a case may leave out (null), but which the layout is computed from when it gives them.
_CASE_OPTIONAL_COUNTS = {"hardware": ("gpus_per_node",),
                         "parallelism": ("dp", "cp", "ep", "etp", "vp", "mbs", "dp_replicate", "zero_stage")}
# A case's model: its sequence length and layer count (the pipeline split), and the rest of its
# shape unless ``hf_id`` names a catalog model.
_CASE_MODEL_KEYS = ("seq_len", "layers", "hidden", "heads", "ffn_hidden", "vocab")


def load_cases(path: str | Path) -> list[dict]:
    """The cases of a public-runs file, each checked for the fields every case needs (a unique
    ``id``; ``hardware.gpu`` and ``count``; ``parallelism.tp``, ``pp`` and ``gbs``; ``model.seq_len``
    and ``layers`` and, unless ``model.hf_id`` is a catalog model, the model's shape), or a one-line ConfigError
    naming the first case and field that is wrong. Anything else a case gets wrong is that case's
    row error (``predict``), the rest of the file still runs."""
    p = Path(path)
    if not os.path.lexists(p) or os.path.isdir(p):
        what = "is a folder" if os.path.isdir(p) else "no such file"
        raise ConfigError("runs", str(path), f"{what}: give a public-runs YAML file (see shared/validation/public-runs.yaml)")
    data = load_yaml_file(p, "runs")
    cases = data.get("cases") if isinstance(data, dict) else None
    if not isinstance(cases, list):
        raise ConfigError("runs", str(path), "must be a mapping with a 'cases' list")
    if not cases:
        raise ConfigError("runs", str(path), "has no cases: its 'cases' list is empty")
    seen: set = set()
    for i, case in enumerate(cases):
        if not isinstance(case, dict) or not isinstance(case.get("id"), (str, int)) or isinstance(case.get("id"), bool):
            raise ConfigError(f"cases[{i}]", case if not isinstance(case, dict) else case.get("id"),
                              "each case must be a mapping with an id (a name) and model, hardware, parallelism")
        cid = case["id"]
        if cid in seen:
            raise ConfigError(f"cases[{i}].id", cid, "already used by an earlier case; give each case its own id")
        seen.add(cid)
        for section, keys in _CASE_SECTIONS.items():
            value = case.get(section)
            if section == "model":  # a catalog model brings its own shape
                in_catalog = isinstance(value, dict) and value.get("hf_id") in catalog_ids()
                keys = _CASE_MODEL_KEYS[:2] if in_catalog else _CASE_MODEL_KEYS
            if not isinstance(value, dict):
                raise ConfigError(f"cases[{cid}].{section}", value, f"must be a mapping with {', '.join(keys)}")
            for key in keys:
                field, v = f"cases[{cid}].{section}.{key}", value.get(key)
                if key != "gpu":
                    whole(field, v, 1)
                elif not (isinstance(v, str) and v.strip()):
                    raise ConfigError(field, v, "must be a GPU name, e.g. H100")
            for key in _CASE_OPTIONAL_COUNTS.get(section, ()):
                optional_whole(f"cases[{cid}].{section}.{key}", value.get(key), 0 if key == "zero_stage" else 1)
    return cases

