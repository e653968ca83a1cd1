"""Whether a scenario's layout can run at all: the divisibility rules of Megatron-LM and the
frameworks, checked before anything is simulated, and warnings for layouts that run on slow links."""

from __future__ import annotations

import math
from dataclasses import fields

from simulator.common import limits
from simulator.common.errors import ConfigError, yaml_text
from simulator.layout.grid import pipeline_counts, scenario_split
from simulator.layout.schedules import SPLIT_BACKWARD, check_schedule_args
from simulator.parts.frameworks import load_profile
from simulator.parts.gpus import get_gpu, peak
from simulator.parts.topology import load_topology, nvlink_GBps, nvlink_generation
from simulator.scenario.config import (DOCUMENT_MASKED_BACKENDS, MOE_OFFLOAD_MODULES, QUANTIZED_PRECISIONS, ModelConfig,
                                       MoEConfig, ParallelConfig, Scenario)
from simulator.scenario.load import explain_left_out, scenario_from_dict, scenario_to_dict


def validate_plan(s: Scenario) -> list[str]:
    """Raise ConfigError if the parallel plan cannot run; return warnings for slow layouts.

    Rules (Megatron-LM's), in root-cause order, so that the first error is the one to fix: GPU and
    topology known, precision supported; then the layout against the model: tp divides the
    attention heads, and divides the KV heads or is a multiple of them (Megatron replicates each KV
    head over tp / kv ranks when kv < tp); vp > 1 needs pp > 1; pp x vp divides the layers; ep
    divides the experts; etp divides tp; the FFN widths divide by tp and etp
    (``_check_tp_splits``); then against the cluster: world size = tp x pp x dp x cp; ep x etp
    divides tp x dp x cp (the expert-parallel group is carved out of a stage's ranks); then the
    batch: micro_batch_size x dp divides the global batch, giving at most ``limits.MICROBATCHES``;
    with cp > 1 the sequence splits into 2 x cp chunks (load-balanced causal attention); with
    sequence parallelism each TP rank holds seq / (cp x tp) tokens; the interleaved schedule's own
    rules ``schedules.check_schedule_args`` applies. Interleaved with vp 1 is plain 1F1B. A key the
    scenario left out is named as such with its default (``load.explain_left_out``).

    Warnings name the slower link a TP or EP group falls back to when it spans nodes (ranks are
    laid out TP fastest, then CP/DP with EP consecutive right after TP).
    """
    try:
        return _checked_plan(s)
    except ConfigError as err:
        raise explain_left_out(err, s) from None


def _checked_plan(s: Scenario) -> list[str]:
    s = scenario_from_dict(scenario_to_dict(s))
    m, c, t, p = s.model, s.cluster, s.training, s.parallelism
    gpu = get_gpu(c.gpu)
    peak(gpu, t.precision)
    check_offload(s)
    if t.fp8_attention and (t.precision not in QUANTIZED_PRECISIONS or t.attention not in ("flash", "cudnn")):
        raise ConfigError("training.fp8_attention", True,
                          "needs training.precision fp8, mxfp8 or nvfp4 and the fused cuDNN kernel (training.attention "
                          "flash or cudnn): Transformer Engine runs FP8 attention inside an FP8 recipe; valid: false")
    if t.document_tokens is not None and t.document_tokens > t.seq_length:
        raise ConfigError("training.document_tokens", t.document_tokens,
                          f"documents are packed into sequences of training.seq_length ({t.seq_length}) tokens: "
                          f"valid: 1 to {t.seq_length}, or null")
    scope = s.framework_options.cuda_graph_scope or ()
    if "moe" in scope and m.is_moe and s.moe.capacity_factor is None:
        raise ConfigError("framework_options.cuda_graph_scope", list(scope),
                          "moe captures drop-and-pad MoE layers only (Megatron-core CudaGraphModule.moe): set "
                          "moe.capacity_factor, or capture moe_router and moe_preprocess")
    if c.gpu_power_limit_W is not None:
        if gpu.tdp_w is None:
            raise ConfigError("cluster.gpu_power_limit_W", c.gpu_power_limit_W,
                              f"{gpu.name} has no catalogued TDP to scale from; valid: null")
        if not 0.25 * gpu.tdp_w <= c.gpu_power_limit_W <= gpu.tdp_w:
            raise ConfigError("cluster.gpu_power_limit_W", c.gpu_power_limit_W,
                              f"must be between {0.25 * gpu.tdp_w:g} and {gpu.tdp_w:g} W ({gpu.name}'s TDP; below a "
                              "quarter of it the clock-power law used is not credible)")
    spec = load_topology(c.topology)
    if c.gpus_per_node > spec.nics_per_node and c.gpus_per_node % spec.nics_per_node:
        raise ConfigError("cluster.gpus_per_node", c.gpus_per_node,
                          f"{spec.name} has {spec.nics_per_node} NICs per node, which must be shared evenly: "
                          f"use a multiple of {spec.nics_per_node} or at most {spec.nics_per_node}")

    # The layout against the model first, then against the cluster: a tp that cannot split the
    # heads is the cause to name, not the GPU count it then fails to divide.
    if m.num_attention_heads % p.tp:
        raise ConfigError("parallelism.tp", p.tp, f"must divide num_attention_heads ({m.num_attention_heads}); "
                          f"valid: {_listing(_divisors(m.num_attention_heads))}")
    kv = m.num_key_value_heads
    if kv % p.tp and p.tp % kv:
        raise ConfigError("parallelism.tp", p.tp, f"must divide num_key_value_heads ({kv}) or be a multiple "
                          "of it (Megatron then replicates each KV head)")
    layers = m.num_hidden_layers
    if p.vp > 1 and p.pp == 1:
        raise ConfigError("parallelism.vp", p.vp, "virtual pipeline stages need pp > 1: set vp to 1")
    check_zero_stage(s.framework, p.pp, p.zero_stage)
    uneven = p.first_pipeline_num_layers is not None or p.last_pipeline_num_layers is not None
    if p.pipeline_layers is not None and uneven:
        raise ConfigError("parallelism.pipeline_layers", list(p.pipeline_layers),
                          "give either pipeline_layers or first/last_pipeline_num_layers, not both")
    if uneven or pipeline_counts(s) is not None:  # stated, or the framework's own (profile pipeline.split)
        scenario_split(s)
    elif layers % p.pp:
        raise ConfigError("parallelism.pp", p.pp, f"must divide num_hidden_layers ({layers}); "
                          f"valid: {_listing(_divisors(layers))}, or set first/last_pipeline_num_layers or pipeline_layers")
    elif layers % (p.pp * p.vp):
        raise ConfigError("parallelism.vp", p.vp, f"pp x vp must divide num_hidden_layers ({layers}); "
                          f"valid vp with pp {p.pp}: {_listing(_divisors(layers // p.pp))}")
    if p.ep * (p.ep - 1) > limits.ALL_TO_ALL_PAIRS.maximum:
        raise ConfigError("parallelism.ep", p.ep, f"its token all-to-alls couple {p.ep * (p.ep - 1):,} pairs of ranks; "
                          f"{limits.ALL_TO_ALL_PAIRS.describe()}")
    if p.ep > 1 and not m.is_moe:
        raise ConfigError("parallelism.ep", p.ep, "must be 1 for a dense model (model.num_experts is 0)")
    if m.is_moe and m.num_experts % p.ep:
        raise ConfigError("parallelism.ep", p.ep, f"must divide num_experts ({m.num_experts}); "
                          f"valid: {_listing(_divisors(m.num_experts))}")
    etp = p.expert_tp
    if p.tp % etp:
        raise ConfigError("parallelism.etp", p.etp, f"must divide tp ({p.tp}); valid: {_listing(_divisors(p.tp))}")
    if etp < p.tp and m.is_moe and not p.sequence_parallel:
        raise ConfigError("parallelism.etp", p.etp, f"below tp ({p.tp}) needs sequence_parallel: true "
                          "(each expert-TP group takes its ranks' sequence shards)")
    _check_tp_splits(m, p)

    world = c.num_gpus
    base = p.tp * p.pp * p.cp
    if p.dp is None:
        if world % base:
            step = base // math.gcd(base, c.gpus_per_node)
            raise ConfigError("cluster.num_nodes", c.num_nodes,
                              f"{world} GPU{'s' if world != 1 else ''} ({_nodes(c.num_nodes)} x {c.gpus_per_node}) "
                              f"{'are' if world != 1 else 'is'} not divisible by "
                              f"tp x pp x cp = {base}: use a multiple of {step} nodes")
    elif base * p.dp != world:
        if world % base == 0:
            fix = f"set dp to {world // base} or null"
        elif (base * p.dp) % c.gpus_per_node == 0:
            fix = f"set cluster.num_nodes to {base * p.dp // c.gpus_per_node}"
        else:
            fix = f"tp x pp x cp = {base} does not divide the GPU count either"
        raise ConfigError("parallelism.dp", p.dp,
                          f"tp x pp x dp x cp = {base * p.dp} must equal the {world} GPUs "
                          f"({_nodes(c.num_nodes)} x {c.gpus_per_node}): {fix}")
    dp = s.dp

    if (p.tp * dp * p.cp) % (p.ep * etp):
        ranks = p.tp * dp * p.cp
        hint = (" (or set etp: 1 to let expert groups span TP ranks)" if p.etp is None and p.tp > 1
                and ranks % p.ep == 0 else "")
        raise ConfigError("parallelism.ep", p.ep, f"ep x etp ({p.ep} x {etp}) must divide tp x dp x cp = {ranks} "
                          f"(Megatron folds the expert groups out of a stage's ranks); valid ep with etp {etp}: "
                          f"{_listing(_divisors(math.gcd(ranks // etp, m.num_experts or 1)))}{hint}")
    if p.dp_replicate > 1:
        if dp % p.dp_replicate:
            raise ConfigError("parallelism.dp_replicate", p.dp_replicate,
                              f"must divide dp ({dp}): the shard groups are dp / dp_replicate consecutive DP ranks; "
                              f"valid: {_listing(_divisors(dp))}")
        if p.zero_stage == 0:
            raise ConfigError("parallelism.dp_replicate", p.dp_replicate,
                              "replicates a sharded state, so it needs zero_stage 1, 2 or 3 (with zero_stage 0 "
                              "every DP rank is already a full replica: use 1)")
        if m.is_moe:
            raise ConfigError("parallelism.dp_replicate", p.dp_replicate,
                              "hybrid sharding of expert weights is not modelled: use 1 for MoE models")
    unit = t.micro_batch_size * dp
    if t.global_batch_size % unit:
        below = t.global_batch_size // unit * unit
        near = f"{below} or {below + unit}" if below else f"{unit}"
        raise ConfigError("training.global_batch_size", t.global_batch_size,
                          f"must be a multiple of micro_batch_size x dp = {t.micro_batch_size} x {dp} = {unit}, "
                          f"e.g. {near}")
    if p.cp > 1 and t.seq_length % (2 * p.cp):
        raise ConfigError("training.seq_length", t.seq_length,
                          f"must be a multiple of 2 x cp = {2 * p.cp} (load-balanced causal context "
                          f"parallelism cuts the sequence into 2 x cp chunks)")
    if p.sequence_parallel and p.tp > 1 and t.seq_length % (p.cp * p.tp):
        raise ConfigError("training.seq_length", t.seq_length,
                          f"with sequence_parallel each TP rank holds seq_length / (cp x tp) tokens: "
                          f"must be a multiple of cp x tp = {p.cp * p.tp}")
    if s.num_microbatches > limits.MICROBATCHES.maximum:
        raise ConfigError("training.global_batch_size", t.global_batch_size,
                          f"gives {s.num_microbatches:,} micro-batches per pipeline; {limits.MICROBATCHES.describe()}: "
                          "raise micro_batch_size or dp")
    work = s.num_microbatches * m.num_hidden_layers
    if work > limits.STEP_WORK.maximum:
        raise ConfigError("training.global_batch_size", t.global_batch_size,
                          f"gives {s.num_microbatches:,} micro-batches per pipeline through {m.num_hidden_layers:,} "
                          f"layers, {work:,} passes to simulate; {limits.STEP_WORK.describe()}: raise "
                          "micro_batch_size or dp, or lower global_batch_size")
    if s.num_microbatches % t.pipeline_passes:
        raise ConfigError("training.pipeline_passes", t.pipeline_passes,
                          f"must divide the {s.num_microbatches} micro-batches per pipeline (each pass runs "
                          "the schedule over an equal share)")
    check_schedule_args(s.pipeline_schedule, p.pp, s.microbatches_per_pass, p.vp)

    nvlink = nvlink_GBps(spec, c.gpu, c.nvlink_bandwidth_GBps)
    network = c.network_bandwidth_Gbps or spec.network_bandwidth_Gbps
    slower = f"the {network:g} Gb/s network instead of {nvlink:g} GB/s NVLink"
    warnings = []
    if not m.is_moe:
        default = MoEConfig()
        unused = [(f"moe.{f.name}", getattr(s.moe, f.name)) for f in fields(MoEConfig)
                  if getattr(s.moe, f.name) != getattr(default, f.name)]
        unused += [("parallelism.etp", p.etp)] if p.etp is not None else []
        if unused:
            (key, value), names = unused[0], ", ".join(k for k, _ in unused)
            warnings.append(f"{key}: got {yaml_text(value)}; the model is dense (model.num_experts is 0), so "
                            f"{names} {'has' if len(unused) == 1 else 'have'} no effect")
    built_for = nvlink_generation(spec.gpu)  # 0: a GPU the catalog lacks
    if built_for and built_for != gpu.nvlink_generation:
        warnings.append(f"cluster.gpu: got {c.gpu}; topology {c.topology} is a node of {spec.gpu} (NVLink "
                        f"{built_for}), so its NVSwitch, NICs and PCIe are another generation's "
                        f"than this GPU's (NVLink {gpu.nvlink_generation}): simulated as that node with this "
                        f"GPU; a topology of this GPU's generation is the real machine")
    if c.gpus_per_node % p.tp:
        warnings.append(f"parallelism.tp: got {p.tp}; TP group spans nodes of {c.gpus_per_node} GPUs: "
                        f"its collectives cross {slower}")
    block = p.tp * p.cp  # a CP group's ranks sit tp apart inside the first tp x cp consecutive ranks
    if p.cp > 1 and c.gpus_per_node % block and block % c.gpus_per_node:
        warnings.append(f"parallelism.cp: got {p.cp}; tp x cp = {block} consecutive ranks do not divide the "
                        f"{c.gpus_per_node} GPUs of a node (NVLink domain), so some CP groups straddle two "
                        f"nodes and cross {slower}; Megatron places ranks the same way, recipes pick "
                        f"tp x cp dividing {c.gpus_per_node}")
    if p.ep > 1 and c.gpus_per_node % (p.ep * p.expert_tp):
        warnings.append(f"parallelism.ep: got {p.ep}; EP group spans nodes (ep x etp = {p.ep * p.expert_tp} consecutive "
                        f"ranks, {c.gpus_per_node} GPUs per node): its all-to-alls cross {slower}")
    # the kernel that runs: attention flash is the framework's fused kernel (``Software.attention_kernel``)
    kernel = load_profile(s.framework)["attention"]["kernel"] if t.attention == "flash" else t.attention
    if t.document_tokens is not None and kernel not in DOCUMENT_MASKED_BACKENDS:
        which = f"{kernel} (the {s.framework} profile's kernel for attention flash)" if kernel != t.attention else kernel
        warnings.append(f"training.document_tokens: got {t.document_tokens}; attention {which} computes every "
                        "pair of the sequence under a document mask, so it costs as one document per sequence "
                        f"(kernels that skip the masked pairs: {', '.join(DOCUMENT_MASKED_BACKENDS)})")
    return warnings


def check_zero_stage(framework: str | None, pp: int, zero_stage: int) -> None:
    """The framework's highest ZeRO stage (profile ``data_parallel.max_zero_stage``: nanotron's
    optimizer is ZeRO-1 whatever stage is asked) and its highest under pipeline parallelism
    (``pipeline.max_zero_stage``: DeepSpeed's pipeline engine asserts stage 0 or 1); a one-line
    error above either."""
    profile = load_profile(framework)
    caps = [(profile["data_parallel"]["max_zero_stage"], "", "")]
    if pp > 1:
        caps.append((profile["pipeline"]["max_zero_stage"], f" under pipeline parallelism (pp {pp})", ", or pp 1"))
    for highest, where, otherwise in caps:
        if zero_stage > highest:
            raise ConfigError("parallelism.zero_stage", zero_stage,
                              f"{framework or 'the generic profile'} runs ZeRO stage {highest} at most{where}: valid: "
                              f"{', '.join(map(str, range(highest + 1)))}{otherwise}")


def _check_tp_splits(m: ModelConfig, p: ParallelConfig) -> None:
    """The FFN widths split over tensor-parallel ranks, as Megatron-core's column- and row-parallel
    linears require (``tensor_parallel.utils.divide`` asserts exact division): the dense MLP's
    ``intermediate_size`` by tp, each routed expert's width by the expert TP size etp, the
    shared experts' combined width by tp. The vocabulary need not divide: Megatron pads it to a
    multiple of 128 x tp (``_vocab_size_with_padding``). Heads are checked by the caller."""
    if any(not m.is_moe_layer(layer) for layer in range(m.num_hidden_layers)) and m.intermediate_size % p.tp:
        raise ConfigError("parallelism.tp", p.tp, f"must divide model.intermediate_size ({m.intermediate_size}): "
                          f"Megatron splits the MLP over tp ranks; valid: {_listing(_common_divisors(m))}")
    if not m.is_moe:
        return
    width = m.expert_intermediate_size
    if width % p.expert_tp:
        field, value = ("parallelism.etp", p.etp) if p.etp is not None else ("parallelism.tp", p.tp)
        raise ConfigError(field, value, f"expert TP size must divide the expert width ({width}): "
                          f"valid: {_listing(_divisors(width))}")
    shared = m.num_shared_experts * width
    if shared % p.tp:
        raise ConfigError("parallelism.tp", p.tp, f"must divide the shared experts' width "
                          f"({m.num_shared_experts} x {width} = {shared}); valid: {_listing(_divisors(shared))}")


def _common_divisors(m: ModelConfig) -> list[int]:
    return _divisors(math.gcd(m.num_attention_heads, m.intermediate_size))


def _nodes(n: int) -> str:
    return f"{n} node" if n == 1 else f"{n} nodes"


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _listing(values: list[int], limit: int = 16) -> str:
    shown = ", ".join(str(v) for v in values[:limit])
    return shown if len(values) <= limit else f"{shown}, ..."


def check_offload(s: Scenario) -> None:
    """Raise ConfigError for an offload setting the framework would refuse (Megatron-core's rules)."""
    t, par, m = s.training, s.parallelism, s.model
    n = t.activation_offload_layers
    if n:
        if n >= m.num_hidden_layers:
            raise ConfigError("training.activation_offload_layers", n,
                              f"must be below the model's {m.num_hidden_layers} layers (Megatron-core's rule)")
        if par.pp > 1:
            raise ConfigError("training.activation_offload_layers", n,
                              f"layer offloading runs without pipeline parallelism only (Megatron-core), got pp "
                              f"{par.pp}: use pp 1, or training.activation_offload_modules")
        if t.recompute != "none":
            raise ConfigError("training.activation_offload_layers", n,
                              f"layer offloading runs without recompute only (Megatron-core), got recompute "
                              f"{t.recompute}: use recompute none, or training.activation_offload_modules")
        if t.activation_offload_modules:
            raise ConfigError("training.activation_offload_modules", list(t.activation_offload_modules),
                              "set either layer offloading (activation_offload_layers) or module offloading, not both")
    mods = t.activation_offload_modules or ()
    if mods:
        if t.recompute == "full":
            raise ConfigError("training.activation_offload_modules", list(mods),
                              "module offloading works with recompute none or selective (full recompute keeps only "
                              "each layer's input)")
        if "attn_proj" in mods and "core_attn" not in mods:
            raise ConfigError("training.activation_offload_modules", list(mods),
                              "attn_proj is offloaded together with core_attn (Megatron-core): add core_attn")
        moe_only = [x for x in mods if x in MOE_OFFLOAD_MODULES]
        if moe_only and not m.is_moe:
            raise ConfigError("training.activation_offload_modules", list(mods),
                              f"{', '.join(moe_only)} offload MoE expert tensors and the model has no experts")
    if (n or mods) and s.pipeline_schedule in SPLIT_BACKWARD:
        field = "training.activation_offload_layers" if n else "training.activation_offload_modules"
        raise ConfigError(field, n or list(mods),
                          f"offloading is modelled with schedules whose backward is not split; got {s.schedule}: "
                          "use 1f1b, interleaved or gpipe")
