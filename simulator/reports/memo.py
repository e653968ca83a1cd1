"""The design memo: seed 000's 64-GPU worksheet filled with simulated numbers (``studies.designdoc``
gathers them). Pure: the gathered data in, a :class:`page.Page` (then HTML or Markdown) out.

Section headings are the worksheet's; every table of it is filled, and its five prompts are
answered from measurements: placement from the rank grid and routes, the hottest collective from
the comm map's exposed time, the first bottleneck from the what-if, the fallback from
``designdoc.fallback_design``, the global batch from simulations at half and double the batch.
"""

from __future__ import annotations

from simulator.reports.page import Answer, Facts, Figure, Num, Page, Section, Table, p, render_html, render_markdown

SECTION_IDS = ("cluster-topology", "model-assumptions", "memory-estimate", "parallelism-choice",
               "communication-map", "pipeline-bubble", "checkpoint-strategy", "prompts", "method")
LINK_NAMES = {"nvlink": "NVLink", "pcie": "PCIe", "nic": "NIC (inter-node network)", "leaf-spine": "leaf-spine",
              "spine-core": "spine-core", None: "no traffic"}
KIND_NAMES = {"tp": "TP collectives", "sp": "TP/SP all-gather + reduce-scatter", "pp": "PP send/recv",
              "dp": "DP gradient reduction", "fsdp": "FSDP all-gather / reduce-scatter", "ep": "MoE all-to-all",
              "cp": "CP ring exchange"}
PREFERRED = {"tp": "fast intra-node if possible", "sp": "fast intra-node if possible",
             "pp": "can cross nodes if balanced", "dp": "overlap-friendly fabric", "fsdp": "near compute if frequent",
             "ep": "topology-aware groups", "cp": "fast intra-node if possible"}


# --- formatting ------------------------------------------------------------------------------------

def secs(x: float) -> str:
    if abs(x) >= 3600:
        return f"{x / 3600:.2f} h"
    if abs(x) >= 120:
        return f"{x / 60:.1f} min"
    if abs(x) >= 1:
        return f"{x:.3f} s"
    if abs(x) >= 1e-3:
        return f"{x * 1e3:.2f} ms"
    return f"{x * 1e6:.1f} us"


def pct(x: float) -> str:
    return f"{x:.1%}"


def gib(x: float) -> str:
    return f"{x:.2f} GiB"


def size(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def count(x: float) -> str:
    return f"{x:,.0f}"


def _get(d: dict, key: str):
    for part in key.split("."):
        d = d[int(part)] if isinstance(d, list) else d[part]
    return d


class _Nums:
    """Makes :class:`Num` values that point into the run or memory report."""

    def __init__(self, data: dict):
        self.data = data

    def run(self, key: str, fmt) -> Num:
        v = _get(self.data["run"], key)
        return Num(v, fmt(v), "run", key)

    def mem(self, key: str, fmt) -> Num:
        v = _get(self.data["memory"], key)
        return Num(v, fmt(v), "memory", key)


def _n(v: float, fmt) -> Num:
    return Num(v, fmt(v))


# --- sections --------------------------------------------------------------------------------------

def _cluster(d: dict) -> Section:
    c = d["cluster"]
    share = c["gpus_per_node"] // c["nics_per_node"]
    nic = ("one NIC per GPU" if share <= 1 else f"{share} GPUs share each NIC")
    rails = ("rail-optimized: GPU k of every node hangs off leaf k, so same-position GPUs of different nodes "
             "are one switch apart; transfers to another rail cross NVLink first (NCCL PXN)"
             if c["rail_optimized"] else "not rail-optimized: every NIC of a node reaches the same leaf")
    return Section("cluster-topology", "Cluster topology", (Facts((
        ("Nodes", (_n(c["num_nodes"], count), f" ({c['topology']})")),
        ("GPUs per node", (_n(c["gpus_per_node"], count), f" x {c['gpu']} ({c['hbm_gib']:.0f} GiB HBM)")),
        ("Intra-node GPU interconnect", (f"NVLink through NVSwitch, {c['nvlink_GBps']:g} GB/s per GPU per direction",)),
        ("Inter-node network", (f"{c['nics_per_node']} NICs x {c['network_Gbps']:g} Gb/s per node, fat tree "
                                f"(oversubscription {c['oversubscription']:g}:1); link classes: "
                                + ", ".join(c["link_classes"]),)),
        ("GPU/NIC affinity notes", (f"{nic} over PCIe; {rails}.",)),
    )),), lead="From the scenario's topology file; the simulator routes every transfer over this graph.")


def _model(d: dict, n: _Nums) -> Section:
    s = d["scenario"]
    m, t = s["model"], s["training"]
    params = d["params"]
    count_cell = (_n(params["total"] / 1e9, lambda v: f"{v:.2f} B"),)
    if m["num_experts"]:
        count_cell += (" total, ", _n(params["active"] / 1e9, lambda v: f"{v:.2f} B"),
                       f" active ({m['num_experts']} experts, top-{m['num_experts_per_tok']})")
    rows = (
        ("Parameter count", count_cell),
        ("Layers", _n(m["num_hidden_layers"], count)),
        ("Hidden size", (_n(m["hidden_size"], count), f" ({m['num_attention_heads']} heads, "
                         f"{m['num_key_value_heads']} KV heads, FFN {m['intermediate_size']:,}, vocab {m['vocab_size']:,})")),
        ("Sequence length", _n(t["seq_length"], count)),
        ("Microbatch size", _n(t["micro_batch_size"], count)),
        ("Target global batch", (_n(t["global_batch_size"], count), " sequences = ",
                                 n.run("tokens_per_step", count), " tokens per step; ",
                                 n.run("num_microbatches", count), " micro-batches per pipeline")),
        ("Precision", (f"{t['precision']} compute, recompute {t['recompute']}, {t['attention']} attention",)),
    )
    return Section("model-assumptions", "Model assumptions", (Table(("Field", "Value"), rows),))


def _memory(d: dict, n: _Nums) -> Section:
    mem = d["memory"]
    a = mem["assumptions"]
    k = max(range(len(mem["stages"])), key=lambda i: (mem["stages"][i]["total_gib"], -i))
    st = f"stages.{k}."
    z = a["zero_stage"]
    shard = a["dense_shard_group"]
    rows = (
        ("Parameters", n.mem(st + "weights_gib", gib),
         "16-bit weights of this stage's layers, matrices split by TP" + (f"; ZeRO-3 shards them over {shard}" if z >= 3 else "")),
        ("Gradients", n.mem(st + "gradients_gib", gib),
         "16-bit" + (f", sharded over DP x CP = {shard} (ZeRO-{z})" if z >= 2 else ", one full copy per GPU")),
        ("Optimizer states", n.mem(st + "optimizer_gib", gib),
         "fp32 master weights + Adam m and v, 12 bytes per parameter"
         + (f", sharded over DP x CP = {shard} (ZeRO-{z})" if z >= 1 else ", not sharded")),
        ("Activations", n.mem(st + "activations_gib", gib),
         f"Korthikanti et al. 2022 per layer; {a['microbatches_in_flight'][k]} micro-batch chunks in flight on this "
         f"stage ({a['schedule']}), recompute {a['recompute']}"),
        ("Communication buffers", n.mem(st + "other_gib", gib),
         f"{a['comm_buffers']}, plus CUDA context {a['cuda_context_gib']:g} GiB, NCCL {a['nccl_buffers_gib']:g} GiB "
         f"and {a['allocator_fragmentation']:.0%} allocator fragmentation"),
        ("Total (peak stage)", n.mem(st + "total_gib", gib),
         (f"stage {k} (of {len(mem['stages'])} stages); capacity {mem['stages'][k]['capacity_gib']:.0f} GiB: "
          + ("fits" if mem["fits"] else "does NOT fit"))),
    )
    return Section("memory-estimate", "Memory estimate", (
        Table(("Component", "Estimate per GPU", "Notes"), rows, numeric=(1,),
              caption="Per GPU on the pipeline stage with the highest total; the same figures as `stepsim memory --json`."),
        Figure("memory", d["figures"]["memory"], "Memory per GPU on every pipeline stage, by component."),
    ))


def _placement_text(row: dict) -> str:
    if row["degree"] <= 1:
        return "-"
    where = "inside one node" if row["intra_node"] else f"across {row['nodes_per_group']} nodes"
    links = " + ".join(LINK_NAMES.get(c, c) for c in row["link_classes"]) or "no links"
    return f"{where}: {links}"


def _exposed(d: dict, n: _Nums, kinds) -> tuple:
    cm = d["run"]["comm_map"]["kinds"]
    step = d["run"]["step_time_s"]
    out: tuple = ()
    for kind in kinds:
        if kind in cm:
            out += (f"{kind} exposed ", n.run(f"comm_map.kinds.{kind}.exposed_s", secs),
                    f" ({cm[kind]['exposed_s'] / step:.1%} of the step), ",
                    n.run(f"comm_map.kinds.{kind}.calls", count), " calls; ")
    return out


def _parallelism(d: dict, n: _Nums) -> Section:
    s, pl = d["scenario"], d["placement"]
    par = s["parallelism"]
    run = d["run"]
    mem = d["memory"]
    z = par["zero_stage"]
    rows = [
        ("TP", _n(par["tp"], count), _placement_text(pl["tp"]),
         _exposed(d, n, ("tp", "sp")) + ("layer-internal, on the critical path of every layer",)),
        ("PP", _n(par["pp"], count), _placement_text(pl["pp"]),
         ("bubble ", n.run("bubble_fraction", pct), f" with {run['num_microbatches']} micro-batches"
          + (f" and {par['vp']} virtual stages; " if par["vp"] > 1 else "; ")) + _exposed(d, n, ("pp",))
         + ("activations cross stage boundaries once per micro-batch and chunk",)),
        ("DP", _n(run["layout"]["dp"], count), _placement_text(pl["dp"]),
         _exposed(d, n, ("dp",)) + ("gradient reduction overlapped with the last backward",)),
        ("FSDP/ZeRO", _n(z, lambda v: f"ZeRO-{v:.0f}"), _placement_text(pl["zero"]) if z else "-",
         (f"shards {'optimizer states' if z == 1 else 'optimizer states and gradients' if z == 2 else 'all model states'}"
          f" over DP x CP = {mem['assumptions']['dense_shard_group']}: optimizer ",
          n.mem("stages.0.optimizer_gib", gib), " per GPU on stage 0") + _exposed(d, n, ("fsdp",)) if z else
         ("off: every DP rank keeps full optimizer states",)),
        ("SP/CP", _n(par["cp"], lambda v: f"SP {'on' if par['sequence_parallel'] else 'off'}, CP {v:.0f}"),
         _placement_text(pl["cp"]) if par["cp"] > 1 else ("with TP" if par["sequence_parallel"] else "-"),
         _exposed(d, n, ("cp",)) + ("sequence split over the TP group for norms and dropout"
                                    if par["sequence_parallel"] else "no sequence splitting",)),
        ("EP/MoE", _n(par["ep"], count), _placement_text(pl["ep"]),
         _exposed(d, n, ("ep",)) + ((f"{s['model']['num_experts']} experts over EP {par['ep']}; expert-DP "
                                    f"{pl['edp']['degree']}" + (f" ({_placement_text(pl['edp'])})" if pl["edp"]["degree"] > 1
                                                             else " (each expert on one rank)"),)
                                   if s["model"]["num_experts"] else ("dense model: no experts",))),
    ]
    return Section("parallelism-choice", "Parallelism choice", (
        Table(("Axis", "Degree", "Placement", "Reason (measured)"), tuple(rows), numeric=(1,),
              caption="Placement: which link classes the axis's groups cross, read from the rank grid (TP fastest, "
                      "then CP, DP, PP) and the cluster's routes. Reasons: exposed time = the compute stream waiting."),
    ), lead=f"Layout {run['num_gpus']} GPUs = TP{par['tp']} x PP{par['pp']} x DP{run['layout']['dp']} x CP{par['cp']}"
             + (f", EP{par['ep']} inside DP x CP" if par["ep"] > 1 else "") + f", {s['schedule']} schedule.")


def _comm(d: dict, n: _Nums) -> Section:
    cm = d["run"]["comm_map"]["kinds"]
    step = d["run"]["step_time_s"]
    rows = []
    for kind in ("tp", "sp", "pp", "dp", "fsdp", "ep", "cp"):
        if kind not in cm:
            continue
        r = cm[kind]
        share = r["exposed_s"] / step
        risk = (f"hot: {share:.1%} of the step exposed" if share >= 0.05 else
                f"{r['hidden_fraction']:.0%} hidden under compute" if r["time_s"] > 0 else "no time")
        base = f"comm_map.kinds.{kind}."
        rows.append((f"{KIND_NAMES[kind]} ({', '.join(r['ops'])})", (n.run(base + "calls", count), " per step"),
                     PREFERRED[kind], LINK_NAMES.get(r["crosses"], r["crosses"]),
                     n.run(base + "bytes_per_call", size), n.run(base + "time_s", secs),
                     n.run(base + "exposed_s", secs), risk))
    absent = [k for k in ("fsdp", "ep") if k not in cm]
    for kind in absent:
        rows.append((KIND_NAMES[kind], "-", PREFERRED[kind], "not used by this layout", "-", "-", "-", "-"))
    return Section("communication-map", "Communication map", (
        Table(("Communication", "Frequency", "Preferred link", "Link used (simulated)", "Per call", "In flight",
               "Exposed", "Risk"), tuple(rows), numeric=(4, 5, 6),
              caption="Per GPU and step. In flight: launch to completion, summed over calls, overlapped or not; "
                      "exposed: the part the compute stream waited for. Link used: the outermost link class the "
                      "kind's recorded flows crossed."),
    ))


def _bubble(d: dict, n: _Nums) -> Section:
    run = d["run"]
    par = d["scenario"]["parallelism"]
    stages = run["stages"]
    hi = max(range(len(stages)), key=lambda i: (stages[i]["compute_s"], -i))
    lo = min(range(len(stages)), key=lambda i: (stages[i]["compute_s"], i))
    imbalance = stages[hi]["compute_s"] / stages[lo]["compute_s"] - 1 if stages[lo]["compute_s"] else 0.0
    m, pp, vp = run["num_microbatches"], par["pp"], par["vp"]
    closed = (pp - 1) / (vp * m + pp - 1)
    per_stage = ()
    for i in range(len(stages)):
        per_stage += (", " if i else "", n.run(f"bubble_fraction_per_stage.{i}", pct))
    facts = Facts((
        ("Number of pipeline stages", (_n(pp, count), f" ({vp} virtual stages each, {run['layout']['schedule']})"
                                       if vp > 1 else f" ({run['layout']['schedule']})")),
        ("Number of microbatches", (n.run("num_microbatches", count), " per pipeline per step")),
        ("Expected bubble risk", ("simulated bubble ", n.run("bubble_fraction", pct), " of the step (per stage: ")
         + per_stage + ("); the closed form (p-1)/(v m+p-1) gives ", _n(closed, pct),
                        ": the difference is stage imbalance and pipeline communication.")),
        ("Stage imbalance risk", (f"stage {hi} computes ", n.run(f"stages.{hi}.compute_s", secs),
                                  f", stage {lo} ", n.run(f"stages.{lo}.compute_s", secs), " (",
                                  _n(imbalance, lambda v: f"{v:+.1%}"),
                                  "); the first stage also runs the embedding, the last the LM head and the loss.")
         if len(stages) > 1 else ("one stage: no imbalance; it computes ", n.run("stages.0.compute_s", secs),
                                  " per step.")),
    ))
    rows = tuple((_n(r["global_batch_size"], count) if not r["baseline"] else (_n(r["global_batch_size"], count), " (this plan)"),
                  _n(r["microbatches"], count), _n(r["step_time_s"], secs), _n(r["tokens_per_s"], count),
                  _n(r["bubble_fraction"], pct), _n(r["bubble_closed_form"], pct)) for r in d["batch"])
    return Section("pipeline-bubble", "Pipeline bubble and microbatching", (
        facts,
        Figure("timeline", d["figures"]["timeline"], "The simulated step, one row per pipeline stage (its first rank): "
               "forward, backward, exposed communication by axis and idle time.", wide=True),
        Table(("Global batch", "Micro-batches per pipeline", "Step time", "Tokens/s", "Bubble (simulated)",
               "Bubble (closed form)"), rows, numeric=(0, 1, 2, 3, 4, 5),
              caption="The same layout simulated at half and double the global batch."),
    ))


def _checkpoint(d: dict) -> Section:
    c = d["checkpoint"]
    run = d["run"]
    nodes = d["cluster"]["num_nodes"]
    bw = (f"{c['storage_bandwidth_GBps_per_node']:.3g} GB/s per node"
          + (" (default: Llama 3's file system, 2 TB/s over 2,048 nodes; set cluster.storage_bandwidth_GBps)"
             if c["storage_default"] else " (cluster.storage_bandwidth_GBps)"))
    sharded_better = c["sharded_write_s"] < c["full_write_s"]
    facts = Facts((
        ("Full or sharded checkpoint", ("sharded" if sharded_better else "full", ": every GPU writes its own ",
                                        _n(c["shard_bytes_per_gpu"], size), " shard, so the ",
                                        _n(c["checkpoint_bytes"], size), " checkpoint takes ",
                                        _n(c["sharded_write_s"], secs), f" on {nodes} nodes in parallel instead of ",
                                        _n(c["full_write_s"], secs), f" through one node at {bw}.")),
        ("Save frequency", ("every ", _n(c["young_interval_steps"], count), " steps (",
                            _n(c["young_interval_s"] / 3600, lambda v: f"{v:.1f} h"),
                            "): Young's interval sqrt(2 x write time x MTBF), with a job MTBF of ",
                            _n(c["mtbf_s"] / 3600, lambda v: f"{v:.0f} h"),
                            " from Llama 3's 419 interruptions in 54 days on 16,384 GPUs.")),
        ("Resume complexity", (f"a sharded checkpoint is written per (TP, PP{', EP' if run['layout']['ep'] > 1 else ''})"
                               " rank; resuming on the same layout reads each shard back in parallel; resuming on "
                               "another layout needs a resharding loader (Megatron dist-checkpointing, PyTorch DCP).",)),
        ("Conversion needs", (f"export to a single-file format (Hugging Face) gathers {run['layout']['tp']} TP x "
                              f"{run['layout']['pp']} PP shards"
                              + (f" and {run['layout']['ep']} expert shards" if run["layout"]["ep"] > 1 else "")
                              + ": the full write time above, once, off the training job.",)),
    ))
    rows = tuple((f"every {e['steps']} steps", _n(e["sharded_overhead"], pct), _n(e["full_overhead"], pct))
                 for e in c["every"])
    return Section("checkpoint-strategy", "Checkpoint strategy", (
        facts,
        Table(("Blocking save", "Sharded: time lost", "Full: time lost"), rows, numeric=(1, 2),
              caption=f"Write time / (N x step time), step time {secs(run['step_time_s'])}; checkpoint = 2-byte weights + "
                      "12-byte optimizer state per parameter, gradients not saved."),
    ))


def _prompts(d: dict, n: _Nums) -> Section:
    run, pl, wi = d["run"], d["placement"], d["whatif"]
    cm = run["comm_map"]
    step = run["step_time_s"]
    rows = {r["target"]: r for r in wi["rows"] if r["present"]}
    f = wi["factor"]
    # 1. TP placement
    tp = pl["tp"]
    tp_kinds = [k for k in ("tp", "sp") if k in cm["kinds"]]
    if tp["degree"] <= 1:
        a1: tuple = ("There is no TP (degree 1): every layer's matrices stay whole on one GPU.",)
    else:
        a1 = (f"TP{tp['degree']} groups are {tp['degree']} consecutive ranks "
              + ("on one node" if tp["intra_node"] else f"spread over {tp['nodes_per_group']} nodes")
              + f", so their traffic crosses {' + '.join(LINK_NAMES[c] for c in tp['link_classes'])}. ",)
        for k in tp_kinds:
            a1 += (f"{KIND_NAMES[k]} run ", n.run(f"comm_map.kinds.{k}.calls", count), " times per step and leave ",
                   n.run(f"comm_map.kinds.{k}.exposed_s", secs), " exposed. ")
        if "nvlink" in rows:
            a1 += (f"NVLink {f:g}x slower would lengthen the step by ", _n(rows["nvlink"]["slower_change"], pct),
                   f": layer-internal collectives stall every layer, so they belong on the fastest link"
                   + (" (they are there)." if tp["intra_node"] else "; move TP inside a node."),)
    # 2. hottest
    hot = cm["most_exposed"]
    busiest = cm["hottest"]
    if hot is None:
        a2: tuple = ("The step has no communication.",)
    else:
        r = cm["kinds"][hot]
        a2 = (f"{KIND_NAMES[hot]} ({', '.join(r['ops'])}): ", n.run(f"comm_map.kinds.{hot}.exposed_s", secs),
              " exposed per step (", _n(r["exposed_s"] / step, pct), " of the step), ",
              n.run(f"comm_map.kinds.{hot}.calls", count), " calls of ", n.run(f"comm_map.kinds.{hot}.bytes_per_call", size),
              f" over {LINK_NAMES.get(r['crosses'], r['crosses'])}; ", _n(r["hidden_fraction"], pct),
              " of its time in flight is hidden under compute.")
        if busiest != hot:
            a2 += (f" The longest in flight is {KIND_NAMES[busiest]} (", n.run(f"comm_map.kinds.{busiest}.time_s", secs),
                   "), but it is ", _n(cm["kinds"][busiest]["hidden_fraction"], pct), " hidden.")
    # 3. global batch
    b = d["batch"]
    lay = run["layout"]
    base = next(r for r in b if r["baseline"])
    a3: tuple = (f"Global batch = micro-batch x DP x micro-batches = {d['scenario']['training']['micro_batch_size']} x "
                 f"{lay['dp']} x {base['microbatches']} = {base['global_batch_size']} sequences. Simulated: ",)
    for i, r in enumerate(b):
        a3 += ("; " if i else "", f"{r['global_batch_size']} sequences: ", _n(r["step_time_s"], secs), ", bubble ",
               _n(r["bubble_fraction"], pct), ", ", _n(r["tokens_per_s"], count), " tokens/s")
    half = next((r for r in b if r["global_batch_size"] * 2 == base["global_batch_size"]), None)
    a3 += (". Tokens per step grow with the batch" + (" and the bubble shrinks as micro-batches are added. "
                                                       if lay["pp"] > 1 else "; with one pipeline stage there is no bubble. "),)
    if half is not None:
        a3 += (f"Doubling DP to {2 * lay['dp']} (twice the GPUs) at the same global batch halves the micro-batches "
               f"per pipeline to {half['microbatches']}: the bubble becomes that of the half-batch row, ",
               _n(half["bubble_fraction"], pct), "; keeping the micro-batches instead doubles the global batch.")
    # 4. bottleneck
    bn = d["bottleneck"]
    links = sorted((r for r in rows.values() if r["target"] != "compute"), key=lambda r: (r["faster_change"], r["target"]))
    a4: tuple = (f"{bn['target']}: {f:g}x faster shortens the step by ", _n(-bn["faster_change"], pct), " (",
                 n.run("step_time_s", secs), " to ", _n(bn["faster_step_time_s"], secs), "). ")
    if links:
        a4 += (f"Of the links, {f:g}x faster: ",)
        for i, r in enumerate(links):
            a4 += (", " if i else "", f"{r['target']} ", _n(r["faster_change"], lambda v: f"{v:+.1%}"))
        a4 += (". Critical path: compute ", n.run("critical_path.by_category.compute", secs), " of ",
               n.run("critical_path.total_s", secs), ".")
    # 5. fallback
    fb = d["fallback"]
    best = fb["best"]
    if best is None:
        a5: tuple = ("No neighbouring layout is valid and fits in memory.",)
    else:
        least = min((c for c in fb["candidates"] if c["dropped"] is None), key=lambda c: (c["exposed_comm_s"], c["label"]))
        a5 = (f"{best['label']} ({', '.join(best['overrides'])}): step ", _n(best["step_time_s"], secs), " (",
              _n(best["change"], lambda v: f"{v:+.1%}"), "), MFU ", _n(best["mfu"], pct), ", ",
              _n(best["peak_memory_gib"], gib), " per GPU" + ("" if best["change"] < 0 else
                                                             "; no neighbour beats the plan, this is the least slower one") + ". ")
        a5 += (f"If communication dominates, the neighbour with the least exposed communication is {least['label']} (",
               _n(least["exposed_comm_s"], secs), " exposed, step ", _n(least["step_time_s"], secs), ").")
    cand_rows = tuple((c["label"], ", ".join(c["overrides"]),
                       _n(c["step_time_s"], secs) if c["step_time_s"] else "-",
                       _n(c["change"], lambda v: f"{v:+.1%}") if c["change"] is not None else "-",
                       _n(c["peak_memory_gib"], gib) if c["peak_memory_gib"] else "-",
                       c["dropped"] or "valid") for c in fb["candidates"])
    return Section("prompts", "Prompts for final memo", (
        Answer("why-tp", "Why is TP placed there?", a1),
        Answer("hottest-collective", "What is the hottest collective?", a2),
        Answer("global-batch", "How does global batch change?", a3),
        Answer("first-bottleneck", "What is the first bottleneck you expect?", a4),
        Figure("tornado", d["figures"]["tornado"], f"Step time with each resource {f:g}x faster or slower "
               "(link classes that carried traffic, and compute)."),
        Answer("fallback-design", "What is the fallback design if communication dominates?", a5),
        Table(("Candidate", "Overrides", "Step time", "vs plan", "Memory per GPU", "Status"), cand_rows, numeric=(2, 3, 4),
              caption=f"Fallback search: {fb['source']}; same global batch, so a shorter step is more tokens/s."),
    ))


def _method(d: dict) -> Section:
    return Section("method", "How these numbers were made", (
        p("Every number on this page comes from stepsim simulations of this scenario: one step as a "
          "discrete-event simulation of every pipeline stage, with flows sharing links max-min fairly. The "
          "headline, memory, communication and bubble figures are those of `stepsim run --json` and "
          "`stepsim memory --json` for the same file; what-if, fallback and batch rows are further simulations "
          "of the same scenario with one change each.", kind="note"),
        p("MFU uses model FLOPs, 6N + 12 L h s per token (attention not halved for causal masking), over the "
          "dense peak at the run's precision. Memory follows ZeRO (2 + 2 + 12 bytes per parameter) and "
          "Korthikanti et al. 2022 activations. Checkpoint figures assume Megatron-style contents (weights and "
          "optimizer state, no gradients) and the storage bandwidth stated above.", kind="note"),
    ))


def build_memo(d: dict) -> Page:
    n = _Nums(d)
    run, par = d["run"], d["scenario"]["parallelism"]
    lay = run["layout"]
    extra = (f" EP{lay['ep']}" if lay["ep"] > 1 else "") + (f" VP{par['vp']}" if par["vp"] > 1 else "")
    subtitle = (f"{run['num_gpus']} x {d['cluster']['gpu']}, TP{lay['tp']} PP{lay['pp']} DP{lay['dp']} CP{lay['cp']}"
                f"{extra}, ZeRO-{lay['zero_stage']}, {lay['schedule']}: the 64-GPU design worksheet, answered by "
                "simulation.")
    cards = (
        ("Step time", n.run("step_time_s", secs)),
        ("Tokens/s", n.run("tokens_per_s", count)),
        ("MFU", n.run("mfu", pct)),
        ("Bubble", n.run("bubble_fraction", pct)),
        ("Memory peak", n.mem("peak_gib", gib)),
    )
    sections = (_cluster(d), _model(d, n), _memory(d, n), _parallelism(d, n), _comm(d, n), _bubble(d, n),
                _checkpoint(d), _prompts(d, n), _method(d))
    warn = ("Warnings: " + "; ".join(run["warnings"])) if run.get("warnings") else ""
    return Page(f"Design memo: {run['name']}", subtitle, cards, sections,
                footer="Generated by stepsim report from simulations; the same scenario gives the same page. " + warn)


def memo_html(d: dict) -> str:
    return render_html(build_memo(d))


def memo_markdown(d: dict, figure_paths: dict | None = None) -> str:
    return render_markdown(build_memo(d), figure_paths)
