"""The design memo: the design worksheet of seed 000 filled with simulated numbers for any scenario,
from one GPU to a hundred thousand (``studies.designdoc`` gathers them). Pure: the gathered data in,
a :class:`page.Page` (then HTML or Markdown) out.

Section headings and row names are the worksheet's; every table of it is filled, and its five
prompts are answered from measurements: placement from the rank grid and routes, the hottest
collective from the comm map's exposed time, the first bottleneck from the what-if, the fallback
from ``designdoc.fallback_design``, the global batch from simulations at half and double the batch.
Every sentence is built for the layout it describes: an axis of degree 1, a single stage, a single
node or a single GPU is said to be absent rather than described with the words of a larger layout.
"""

from __future__ import annotations

from simulator.reports.memory import headroom_note
from simulator.reports.page import Answer, Facts, Figure, Num, Page, Section, Table, p, render_html, render_markdown

SECTION_IDS = ("cluster-topology", "model-assumptions", "memory-estimate", "parallelism-choice",
               "communication-map", "pipeline-bubble", "checkpoint-strategy", "prompts", "method")
LINK_NAMES = {"nvlink": "NVLink", "pcie": "PCIe", "nic": "NIC (inter-node network)", "leaf-spine": "leaf-spine",
              "spine-core": "spine-core", "compute": "compute", None: "no traffic"}
KIND_NAMES = {"tp": "TP collectives", "sp": "TP/SP all-gather + reduce-scatter", "pp": "PP send/recv",
              "dp": "DP gradient reduction", "fsdp": "FSDP all-gather / reduce-scatter", "ep": "MoE all-to-all",
              "cp": "CP ring exchange"}
KINDS = ("tp", "sp", "pp", "dp", "fsdp", "ep", "cp")
PREFERRED = {"tp": "fast intra-node if possible", "sp": "fast intra-node if possible",
             "pp": "can cross nodes if balanced", "dp": "overlap-friendly fabric", "fsdp": "near compute if frequent",
             "ep": "topology-aware groups", "cp": "fast intra-node if possible"}
# schedules whose bubble has the closed form (p - 1) / (v m + p - 1) (Narayanan et al. 2021)
CLOSED_FORM_SCHEDULES = ("gpipe", "1f1b", "interleaved")


# --- formatting ------------------------------------------------------------------------------------

def secs(x: float) -> str:
    if abs(x) >= 360000:
        return f"{x / 3600:,.0f} h"
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
    return f"{x:.2f} GiB" if abs(x) >= 0.1 or x == 0 else f"{x:.2g} GiB"


def size(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def count(x: float) -> str:
    return f"{x:,.0f}"


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 node``, ``2 nodes``, ``1,024 GPUs``."""
    return f"{n:,} {word if n == 1 else many or word + 's'}"


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


def _clauses(*parts: tuple, sep: str = "; ") -> tuple:
    """Clauses (each a tuple of inlines; empty ones dropped) joined by ``sep``: the one place that
    puts punctuation between pieces of a sentence, so no piece carries a separator of its own."""
    out: tuple = ()
    for part in (x for x in parts if x):
        out += ((sep,) if out else ()) + part
    return out


def _schedule(d: dict) -> str:
    lay = d["run"]["layout"]
    return lay.get("pipeline_schedule") or lay["schedule"]


def _layout_text(d: dict) -> str:
    """TP, PP and DP always; CP, EP and VP when used."""
    lay = d["run"]["layout"]
    parts = [f"TP{lay['tp']:,}", f"PP{lay['pp']:,}", f"DP{lay['dp']:,}"]
    parts += [f"{k.upper()}{lay[k]:,}" for k in ("cp", "ep", "vp") if lay[k] > 1]
    return " ".join(parts)


# --- sections --------------------------------------------------------------------------------------

def _cluster(d: dict) -> Section:
    c = d["cluster"]
    nodes, per_node = c["num_nodes"], c["gpus_per_node"]
    if per_node == 1:
        intra = ("one GPU per node: no GPU peers inside a node",)
    else:
        intra = (f"NVLink through NVSwitch, {c['nvlink_GBps']:g} GB/s per GPU per direction",)
    nics = plural(c["nics_per_node"], "NIC")
    if nodes == 1:
        inter = (f"none in use: one node, so no traffic leaves it (it has {nics} of {c['network_Gbps']:g} Gb/s)",)
        affinity = ("one node: which NIC serves which GPU does not matter to this job.",)
    else:
        inter = (f"{nics} x {c['network_Gbps']:g} Gb/s per node, fat tree (oversubscription "
                 f"{c['oversubscription']:g}:1); link classes: " + ", ".join(c["link_classes"]),)
        share = per_node // max(c["nics_per_node"], 1)
        nic = "one NIC per GPU" if share <= 1 else f"{share} GPUs share each NIC"
        rails = ("rail-optimized: GPU k of every node hangs off leaf k, so same-position GPUs of different nodes "
                 "are one switch apart; transfers to another rail cross NVLink first (NCCL PXN)"
                 if c["rail_optimized"] else "not rail-optimized: every NIC of a node reaches the same leaf")
        affinity = (f"{nic} over PCIe; {rails}.",)
    return Section("cluster-topology", "Cluster topology", (Facts((
        ("Nodes", (_n(nodes, count), f" ({c['topology']})")),
        ("GPUs per node", (_n(per_node, count), f" x {c['gpu']} ({c['hbm_gib']:.0f} GiB HBM); "
                                                f"{plural(c['num_gpus'], 'GPU')} in all")),
        ("Intra-node GPU interconnect", intra),
        ("Inter-node network", inter),
        ("GPU/NIC affinity notes", affinity),
    )),), lead="From the scenario's topology file; the simulator routes every transfer over this graph.")


def _model(d: dict, n: _Nums) -> Section:
    s = d["scenario"]
    m, t = s["model"], s["training"]
    params = d["params"]
    count_cell = (_n(params["total"] / 1e9, lambda v: f"{v:.2f} B"),)
    if m["num_experts"]:
        count_cell += (" total, ", _n(params["active"] / 1e9, lambda v: f"{v:.2f} B"),
                       f" active per token ({m['num_experts']:,} experts, top-{m['num_experts_per_tok']})")
    mbs = d["run"]["num_microbatches"]
    rows = (
        ("Parameter count", count_cell),
        ("Layers", _n(m["num_hidden_layers"], count)),
        ("Hidden size", (_n(m["hidden_size"], count), f" ({m['num_attention_heads']} heads, "
                         f"{m['num_key_value_heads']} KV heads, FFN {m['intermediate_size']:,}, vocab {m['vocab_size']:,})")),
        ("Sequence length", _n(t["seq_length"], count)),
        ("Microbatch size", _n(t["micro_batch_size"], count)),
        ("Target global batch", (_n(t["global_batch_size"], count),
                                 " sequence = " if t["global_batch_size"] == 1 else " sequences = ",
                                 n.run("tokens_per_step", count), " tokens per step; ",
                                 n.run("num_microbatches", count),
                                 " micro-batch per pipeline" if mbs == 1 else " micro-batches per pipeline")),
        ("Precision", (f"{t['precision']} compute, recompute {t['recompute']}, {t['attention']} attention",)),
    )
    return Section("model-assumptions", "Model assumptions", (Table(("Field", "Value"), rows),))


def _memory(d: dict, n: _Nums) -> Section:
    mem = d["memory"]
    a = mem["assumptions"]
    stages = mem["stages"]
    k = max(range(len(stages)), key=lambda i: (stages[i]["total_gib"], -i))
    st = f"stages.{k}."
    z = a["zero_stage"]
    shard = a["dense_shard_group"]
    pp = len(stages)
    in_flight = a["microbatches_in_flight"][k]
    chunks = d["scenario"]["parallelism"]["vp"] > 1 or _schedule(d) not in CLOSED_FORM_SCHEDULES
    held = plural(in_flight, "micro-batch chunk" if chunks else "micro-batch",
                  "micro-batch chunks" if chunks else "micro-batches")
    where = (f"{held} in flight on this stage ({_schedule(d)} schedule)" if pp > 1 else
             f"{held} in flight (no pipeline: one micro-batch's forward and backward at a time)")
    tp = d["scenario"]["parallelism"]["tp"]
    weights_note = ("16-bit weights of " + ("this stage's layers" if pp > 1 else "every layer")
                    + (", matrices split by TP" if tp > 1 else "")
                    + (f"; ZeRO-3 shards them over {shard:,}" if z >= 3 else ""))
    sharded = f", sharded over DP x CP = {shard:,} (ZeRO-{z})" if shard > 1 else ", one copy: a shard group of one"
    total_where = (f"stage {k} of {pp}" if pp > 1 else "the only stage")
    cap = stages[k]["capacity_gib"]
    verdict = "fits" if mem["fits"] else "does NOT fit"
    note = headroom_note(mem)
    rows = (
        ("Parameters", n.mem(st + "weights_gib", gib), weights_note),
        ("Gradients", n.mem(st + "gradients_gib", gib),
         "16-bit" + (sharded if z >= 2 else ", one full copy per GPU")),
        ("Optimizer states", n.mem(st + "optimizer_gib", gib),
         "fp32 master weights + Adam m and v, 12 bytes per parameter"
         + (sharded if z >= 1 else ", not sharded")),
        ("Activations", n.mem(st + "activations_gib", gib),
         f"Korthikanti et al. 2022 per layer; {where}; recompute {a['recompute']}"),
        ("Communication buffers", n.mem(st + "other_gib", gib),
         f"{a['comm_buffers']}, with the runtime: CUDA context {a['cuda_context_gib']:g} GiB, NCCL "
         f"{a['nccl_buffers_gib']:g} GiB and {a['allocator_fragmentation']:.0%} allocator fragmentation"),
        ("Total (peak stage)", n.mem(st + "total_gib", gib),
         f"{total_where}; capacity {cap:.0f} GiB: {verdict}" + (f"; headroom warning: {note}" if note else "")),
    )
    return Section("memory-estimate", "Memory estimate", (
        Table(("Component", "Estimate per GPU", "Notes"), rows, numeric=(1,),
              caption=("Per GPU on the pipeline stage with the highest total" if pp > 1 else "Per GPU")
              + "; the same figures as `stepsim memory --json`."),
        Figure("memory", d["figures"]["memory"], "Memory per GPU on every pipeline stage, by component, against "
               "the GPU's capacity." if pp > 1 else "Memory per GPU by component, against the GPU's capacity."),
    ))


def _placement_text(row: dict) -> str:
    if row["degree"] <= 1:
        return "-"
    where = "inside one node" if row["intra_node"] else f"across {row['nodes_per_group']:,} nodes"
    links = " + ".join(LINK_NAMES.get(c, c) for c in row["link_classes"]) or "no links"
    return f"{where}: {links}"


def _exposed(d: dict, n: _Nums, kinds) -> tuple:
    """One clause per kind the run used: exposed time, share of the step, calls."""
    cm = d["run"]["comm_map"]["kinds"]
    step = d["run"]["step_time_s"]
    out: tuple = ()
    for kind in kinds:
        if kind in cm:
            calls = cm[kind]["calls"]
            out = _clauses(out, (f"{kind} exposed ", n.run(f"comm_map.kinds.{kind}.exposed_s", secs),
                                 f" ({cm[kind]['exposed_s'] / step:.1%} of the step) in ",
                                 n.run(f"comm_map.kinds.{kind}.calls", count), " call" if calls == 1 else " calls"))
    return out


def _parallelism(d: dict, n: _Nums) -> Section:
    s, pl = d["scenario"], d["placement"]
    par = s["parallelism"]
    run = d["run"]
    lay = run["layout"]
    mem = d["memory"]
    z = par["zero_stage"]
    pp, vp, dp = lay["pp"], par["vp"], lay["dp"]
    layers = s["model"]["num_hidden_layers"]
    m = run["num_microbatches"]
    if par["tp"] > 1:
        tp_reason = _clauses(_exposed(d, n, ("tp", "sp")), ("layer-internal, on the critical path of every layer",))
    else:
        tp_reason = ("no TP: every layer's matrices stay whole on one GPU",)
    if pp > 1:
        pp_reason = _clauses(("bubble ", n.run("bubble_fraction", pct), f" with {plural(m, 'micro-batch', 'micro-batches')}"
                              + (f" and {vp} model chunks per GPU" if vp > 1 else "")),
                             _exposed(d, n, ("pp",)),
                             ("activations cross stage boundaries once per micro-batch"
                              + (" and chunk" if vp > 1 else ""),))
    else:
        pp_reason = (f"no pipeline: {'the GPU holds' if run['num_gpus'] == 1 else 'every GPU holds'} all "
                     f"{plural(layers, 'layer')}",)
    if dp > 1:
        dp_reason = _clauses(_exposed(d, n, ("dp",)), ("gradient reduction overlapped with the last backward",))
    else:
        dp_reason = ("no data parallelism: one model replica, no gradient reduction",)
    shard = mem["assumptions"]["dense_shard_group"]
    if z and shard > 1:
        what = {1: "optimizer states", 2: "optimizer states and gradients"}.get(z, "all model states")
        zero_reason = _clauses((f"shards {what} over DP x CP = {shard:,}: optimizer ",
                                n.mem("stages.0.optimizer_gib", gib), " per GPU" + (" on stage 0" if pp > 1 else "")),
                               _exposed(d, n, ("fsdp",)))
    elif z:
        zero_reason = (f"ZeRO-{z} over a group of one: nothing to shard",)
    else:
        zero_reason = (("off: every DP rank keeps full optimizer states",) if dp > 1 else
                       ("off: one replica holds every model state",))
    if par["cp"] > 1:
        cp_reason = _clauses(_exposed(d, n, ("cp",)), (f"the sequence split over {par['cp']} GPUs",))
    elif par["sequence_parallel"]:
        cp_reason = ("sequence split over the TP group for norms and dropout",)
    else:
        cp_reason = ("no sequence splitting",)
    if s["model"]["num_experts"]:
        edp = pl["edp"]
        ep_reason = _clauses(_exposed(d, n, ("ep",)),
                             (f"{s['model']['num_experts']:,} experts over EP {par['ep']}; expert-DP {edp['degree']:,}"
                              + (f" ({_placement_text(edp)})" if edp["degree"] > 1 else " (each expert on one rank)"),))
    else:
        ep_reason = ("dense model: no experts",)
    rows = [
        ("TP", _n(par["tp"], count), _placement_text(pl["tp"]), tp_reason),
        ("PP", _n(pp, count), _placement_text(pl["pp"]), pp_reason),
        ("DP", _n(dp, count), _placement_text(pl["dp"]), dp_reason),
        ("FSDP/ZeRO", _n(z, lambda v: f"ZeRO-{v:.0f}"), _placement_text(pl["zero"]) if z and shard > 1 else "-",
         zero_reason),
        ("SP/CP", _n(par["cp"], lambda v: f"SP {'on' if par['sequence_parallel'] else 'off'}, CP {v:.0f}"),
         _placement_text(pl["cp"]) if par["cp"] > 1 else ("with TP" if par["sequence_parallel"] else "-"), cp_reason),
        ("EP/MoE", _n(par["ep"], count), _placement_text(pl["ep"]), ep_reason),
    ]
    lead = (f"Layout: {plural(run['num_gpus'], 'GPU')} = TP{par['tp']:,} x PP{pp:,} x DP{dp:,} x CP{par['cp']:,}"
            + (f", EP{par['ep']:,} inside DP x CP" if par["ep"] > 1 else "")
            + (f", {_schedule(d)} pipeline schedule." if pp > 1 else ", no pipeline."))
    return Section("parallelism-choice", "Parallelism choice", (
        Table(("Axis", "Degree", "Placement", "Reason (measured)"), tuple(rows), numeric=(1,),
              caption="Placement: which link classes the axis's groups cross, read from the rank grid (TP fastest, "
                      "then CP, DP, PP) and the cluster's routes. Exposed time: the compute stream waiting."),
    ), lead=lead)


def _comm(d: dict, n: _Nums) -> Section:
    cm = d["run"]["comm_map"]["kinds"]
    step = d["run"]["step_time_s"]
    rows = []
    for kind in KINDS:
        if kind not in cm:
            continue
        r = cm[kind]
        share = r["exposed_s"] / step
        hidden = max(0.0, r["hidden_fraction"])
        risk = (f"hot: {share:.1%} of the step exposed" if share >= 0.05 else
                f"{hidden:.0%} hidden under compute" if r["time_s"] > 0 else "no time")
        base = f"comm_map.kinds.{kind}."
        rows.append((f"{KIND_NAMES[kind]} ({', '.join(r['ops'])})", (n.run(base + "calls", count), " per step"),
                     PREFERRED[kind], LINK_NAMES.get(r["crosses"], r["crosses"]),
                     n.run(base + "bytes_per_call", size), n.run(base + "time_s", secs),
                     n.run(base + "exposed_s", secs), risk))
    if not rows:
        gpus = d["run"]["num_gpus"]
        return Section("communication-map", "Communication map", (
            p("This layout moves no data between GPUs" + (" (one GPU)" if gpus == 1 else "")
              + ": there is no collective to place or to hide."),
        ))
    unused = [KIND_NAMES[k] for k in KINDS if k not in cm and k != "sp"]
    return Section("communication-map", "Communication map", (
        Table(("Communication", "Frequency", "Preferred link", "Link used (simulated)", "Per call", "In flight",
               "Exposed", "Risk"), tuple(rows), numeric=(4, 5, 6),
              caption="Per GPU and step. In flight: launch to completion, summed over calls, overlapped or not; "
                      "exposed: the part the compute stream waited for. Link used: the outermost link class the "
                      "kind's recorded flows crossed."
                      + (f" Not used by this layout: {', '.join(unused)}." if unused else "")),
    ))


def _bubble(d: dict, n: _Nums) -> Section:
    run = d["run"]
    par = d["scenario"]["parallelism"]
    stages = run["stages"]
    m, pp, vp = run["num_microbatches"], par["pp"], par["vp"]
    schedule = _schedule(d)
    window = d.get("timeline", {}).get("window_s")
    shown = ("A steady-state window of the simulated step (a few micro-batches around its middle), "
             f"{secs(window[0])} to {secs(window[1])} of {secs(run['step_time_s'])}, with the whole step above it "
             "as an overview" if window else "The whole simulated step")
    if pp > 1:
        hi = max(range(len(stages)), key=lambda i: (stages[i]["compute_s"], -i))
        lo = min(range(len(stages)), key=lambda i: (stages[i]["compute_s"], i))
        imbalance = stages[hi]["compute_s"] / stages[lo]["compute_s"] - 1 if stages[lo]["compute_s"] else 0.0
        per_stage: tuple = ()
        for i in range(len(stages)):
            per_stage += (", " if i else "", n.run(f"bubble_fraction_per_stage.{i}", pct))
        if schedule in CLOSED_FORM_SCHEDULES:
            closed = (pp - 1) / (vp * m + pp - 1)
            closed_text = ("; the closed form (p-1)/(v m+p-1) gives ", _n(closed, pct),
                           ": the difference is stage imbalance and pipeline communication.")
        else:
            closed_text = (f"; {schedule} has no closed form of the (p-1)/(v m+p-1) kind to compare with.",)
        facts = Facts((
            ("Number of pipeline stages", (_n(pp, count), f" ({vp} model chunks per GPU, {schedule} schedule)"
                                           if vp > 1 else f" ({schedule} schedule)")),
            ("Number of microbatches", (n.run("num_microbatches", count),
                                        " per pipeline per step" if m != 1 else " per pipeline per step (one)")),
            ("Expected bubble risk", ("simulated bubble ", n.run("bubble_fraction", pct), " of the step (per stage: ")
             + per_stage + (")",) + closed_text),
            ("Stage imbalance risk", (f"stage {hi} computes ", n.run(f"stages.{hi}.compute_s", secs),
                                      f", stage {lo} ", n.run(f"stages.{lo}.compute_s", secs), " (",
                                      _n(imbalance, lambda v: f"{v:+.1%}"),
                                      "); the first stage also runs the embedding, the last the LM head and the loss.")),
        ))
        caption = (f"{shown}; one row per pipeline stage (its first rank): forward, backward, waiting on "
                   "communication by axis, and idle time.")
    else:
        facts = Facts((
            ("Number of pipeline stages", ("1: no pipeline, every GPU runs all layers",)),
            ("Number of microbatches", (n.run("num_microbatches", count),
                                        " per step" + (", run one after another, their gradients accumulated"
                                                       if m > 1 else ""))),
            ("Expected bubble risk", ("none: a bubble needs stages to wait for each other; the GPU is idle ",
                                      n.run("bubble_fraction", pct), " of the step.")),
            ("Stage imbalance risk", ("none with one stage; it computes ", n.run("stages.0.compute_s", secs),
                                      " per step.")),
        ))
        caption = f"{shown}: forward, backward, waiting on communication by axis, and idle time."
    if pp > 1:
        header = ("Global batch", "Micro-batches per pipeline", "Step time", "Tokens/s", "Bubble (simulated)",
                  "Bubble (closed form)")
        closed_ok = schedule in CLOSED_FORM_SCHEDULES
        rows = tuple((_n(r["global_batch_size"], count) if not r["baseline"] else
                      (_n(r["global_batch_size"], count), " (this plan)"),
                      _n(r["microbatches"], count), _n(r["step_time_s"], secs), _n(r["tokens_per_s"], count),
                      _n(r["bubble_fraction"], pct), _n(r["bubble_closed_form"], pct) if closed_ok else "-")
                     for r in d["batch"])
        numeric = (0, 1, 2, 3, 4, 5)
    else:
        header = ("Global batch", "Micro-batches per GPU", "Step time", "Tokens/s")
        rows = tuple((_n(r["global_batch_size"], count) if not r["baseline"] else
                      (_n(r["global_batch_size"], count), " (this plan)"),
                      _n(r["microbatches"], count), _n(r["step_time_s"], secs), _n(r["tokens_per_s"], count))
                     for r in d["batch"])
        numeric = (0, 1, 2, 3)
    return Section("pipeline-bubble", "Pipeline bubble and microbatching", (
        facts,
        Figure("timeline", d["figures"]["timeline"], caption, wide=True),
        Table(header, rows, numeric=numeric, caption=_batch_caption(d)),
    ))


def _batch_caption(d: dict) -> str:
    base = next(r for r in d["batch"] if r["baseline"])["global_batch_size"]
    others = sorted(r["global_batch_size"] for r in d["batch"] if not r["baseline"])
    words = {base // 2: "half", base * 2: "double"}
    done = [words.get(g, f"{g:,}") for g in others]
    missing = [w for g, w in sorted(words.items()) if g not in others]
    text = ("The same layout simulated at " + " and ".join(done) + " the global batch" if done else
            "No other global batch could be simulated with this layout")
    if missing:
        text += f"; {' and '.join(missing)} the batch is not a valid batch for it"
    return text + "."


def _checkpoint(d: dict) -> Section:
    c = d["checkpoint"]
    run = d["run"]
    lay = run["layout"]
    nodes = d["cluster"]["num_nodes"]
    gpus = run["num_gpus"]
    bw = (f"{c['storage_bandwidth_GBps_per_node']:.3g} GB/s per node"
          + (" (default: Llama 3's file system, 2 TB/s over 2,048 nodes; set cluster.storage_bandwidth_GBps)"
             if c["storage_default"] else " (cluster.storage_bandwidth_GBps)"))
    same = nodes == 1
    if gpus == 1:
        choice = ("full (one GPU holds everything): the ", _n(c["checkpoint_bytes"], size), " checkpoint takes ",
                  _n(c["full_write_s"], secs), f" at {bw}.")
    elif same:
        choice = ("either: on one node a sharded save (each of the ", _n(gpus, count), " GPUs writes its ",
                  _n(c["shard_bytes_per_gpu"], size), " shard) and a full save both write the ",
                  _n(c["checkpoint_bytes"], size), " checkpoint through the same node, in ",
                  _n(c["sharded_write_s"], secs), f" at {bw}; a full checkpoint resumes on any layout.")
    else:
        choice = ("sharded: every GPU writes its own ", _n(c["shard_bytes_per_gpu"], size), " shard, so the ",
                  _n(c["checkpoint_bytes"], size), " checkpoint takes ", _n(c["sharded_write_s"], secs),
                  f" with the {nodes:,} nodes writing at once, instead of ", _n(c["full_write_s"], secs),
                  f" for a full checkpoint through one node at {bw}.")
    written = "full write time" if gpus == 1 or same else "sharded write time"
    sharded_axes = [f"{k.upper()}" for k in ("tp", "pp", "ep") if lay[k] > 1]
    if gpus == 1:
        resume = ("one GPU writes one file set; it resumes on any layout of the same model without resharding.",)
    else:
        per = (f"per ({', '.join(sharded_axes)}) rank, replicated tensors spread over the data-parallel ranks"
               if sharded_axes else f"by all {gpus:,} data-parallel ranks, each its slice")
        resume = (f"a sharded checkpoint is written {per}; "
                  "resuming on the same layout reads each shard back in parallel; resuming on another layout needs a "
                  "resharding loader (Megatron dist-checkpointing, PyTorch DCP).",)
    pieces = [f"{lay['tp']:,} TP" if lay["tp"] > 1 else "", f"{lay['pp']:,} PP" if lay["pp"] > 1 else "",
              f"{lay['ep']:,} expert" if lay["ep"] > 1 else ""]
    pieces = [x for x in pieces if x]
    if pieces:
        convert = ("export to a single-file format (Hugging Face) gathers " + " x ".join(pieces)
                   + " shards: the full write time above, once, off the training job.",)
    else:
        convert = ("every GPU holds whole layers (no TP, PP or EP split): the export to a single-file format "
                   "(Hugging Face) converts one copy of the weights, the full write time above, once, off the job.",)
    facts = Facts((
        ("Full or sharded checkpoint", choice),
        ("Save frequency", ("every ", _n(c["young_interval_steps"], count),
                            " step (" if c["young_interval_steps"] == 1 else " steps (",
                            _n(c["young_interval_s"], secs),
                            f"): Young's interval sqrt(2 x {written} x MTBF), with a job MTBF of ",
                            _n(c["mtbf_s"], secs),
                            f" for {plural(gpus, 'GPU')}, scaled from Llama 3's 419 interruptions in 54 days on "
                            "16,384 GPUs.")),
        ("Resume complexity", resume),
        ("Conversion needs", convert),
    ))
    if same or gpus == 1:
        rows = tuple((f"every {e['steps']:,} steps", _n(e["full_overhead"], pct)) for e in c["every"])
        table = Table(("Blocking save", "Time lost"), rows, numeric=(1,),
                      caption=f"Write time / (N x step time), step time {secs(run['step_time_s'])}; sharded and full "
                              "saves take the same time on one node. Checkpoint = 2-byte weights + 12-byte optimizer "
                              "state per parameter, gradients not saved.")
    else:
        rows = tuple((f"every {e['steps']:,} steps", _n(e["sharded_overhead"], pct), _n(e["full_overhead"], pct))
                     for e in c["every"])
        table = Table(("Blocking save", "Sharded: time lost", "Full: time lost"), rows, numeric=(1, 2),
                      caption=f"Write time / (N x step time), step time {secs(run['step_time_s'])}; checkpoint = "
                              "2-byte weights + 12-byte optimizer state per parameter, gradients not saved.")
    return Section("checkpoint-strategy", "Checkpoint strategy", (facts, table))


def _why_tp(d: dict, n: _Nums, rows: dict, f: float) -> tuple:
    cm = d["run"]["comm_map"]
    tp = d["placement"]["tp"]
    if tp["degree"] <= 1:
        return ("There is no TP (degree 1): every layer's matrices stay whole on one GPU.",)
    out: tuple = (f"TP{tp['degree']} groups are {tp['degree']} consecutive ranks "
                  + ("on one node" if tp["intra_node"] else f"spread over {tp['nodes_per_group']:,} nodes")
                  + f", so their traffic crosses {' + '.join(LINK_NAMES.get(c, c) for c in tp['link_classes'])}.",)
    for k in (k for k in ("tp", "sp") if k in cm["kinds"]):
        out += (f" {KIND_NAMES[k]} run ", n.run(f"comm_map.kinds.{k}.calls", count), " times per step and leave ",
                n.run(f"comm_map.kinds.{k}.exposed_s", secs), " exposed.")
    if "nvlink" in rows:
        out += (f" NVLink {f:g}x slower would lengthen the step by ", _n(rows["nvlink"]["slower_change"], pct),
                ": layer-internal collectives stall every layer, so they belong on the fastest link"
                + (" (they are there)." if tp["intra_node"] else "; move TP inside a node."),)
    return out


def _hottest(d: dict, n: _Nums) -> tuple:
    cm = d["run"]["comm_map"]
    step = d["run"]["step_time_s"]
    hot, busiest = cm["most_exposed"], cm["hottest"]
    if hot is None:
        return ("No collective at all: " + ("one GPU moves no data to another." if d["run"]["num_gpus"] == 1 else
                            "the step moves no data between GPUs."),)
    r = cm["kinds"][hot]
    out: tuple = (f"{KIND_NAMES[hot]} ({', '.join(r['ops'])}): ", n.run(f"comm_map.kinds.{hot}.exposed_s", secs),
                  " exposed per step (", _n(r["exposed_s"] / step, pct), " of the step), ",
                  n.run(f"comm_map.kinds.{hot}.calls", count), " call of " if r["calls"] == 1 else " calls of ",
                  n.run(f"comm_map.kinds.{hot}.bytes_per_call", size),
                  f" over {LINK_NAMES.get(r['crosses'], r['crosses'])}; ", _n(max(0.0, r["hidden_fraction"]), pct),
                  " of its time in flight is hidden under compute.")
    if busiest != hot:
        out += (f" The longest in flight is {KIND_NAMES[busiest]} (", n.run(f"comm_map.kinds.{busiest}.time_s", secs),
                "), but it is ", _n(max(0.0, cm["kinds"][busiest]["hidden_fraction"]), pct), " hidden.")
    return out


def _global_batch(d: dict) -> tuple:
    b = d["batch"]
    lay = d["run"]["layout"]
    base = next(r for r in b if r["baseline"])
    mbs = d["scenario"]["training"]["micro_batch_size"]
    pp = lay["pp"]
    out: tuple = (f"Global batch = micro-batch x DP x micro-batches = {mbs:,} x {lay['dp']:,} x "
                  f"{base['microbatches']:,} = {plural(base['global_batch_size'], 'sequence')}. Simulated: ",)
    for i, r in enumerate(b):
        out += ("; " if i else "", f"{plural(r['global_batch_size'], 'sequence')}: ", _n(r["step_time_s"], secs),
                *((", bubble ", _n(r["bubble_fraction"], pct)) if pp > 1 else ()),
                ", ", _n(r["tokens_per_s"], count), " tokens/s")
    out += (". Tokens per step grow with the batch"
            + (", and the bubble shrinks as micro-batches are added." if pp > 1 else
               "; with one stage there is no bubble to shrink, each GPU runs its micro-batches one after another."),)
    half = next((r for r in b if r["global_batch_size"] * 2 == base["global_batch_size"]), None)
    if half is not None:
        gpus = d["run"]["num_gpus"]
        out += (f" Doubling DP to {2 * lay['dp']:,} ({2 * gpus:,} GPUs) at the same global batch halves the micro-batches "
                f"per pipeline to {half['microbatches']:,}: ",)
        out += (("the bubble becomes that of the half-batch row, ", _n(half["bubble_fraction"], pct),
                 "; keeping the micro-batches instead doubles the global batch.") if pp > 1 else
                ("each GPU then does the work of the half-batch row, ", _n(half["step_time_s"], secs),
                 " per step, plus the gradient reduction across twice the replicas; keeping the micro-batches instead "
                 "doubles the global batch."))
    return out


def _bottleneck(d: dict, n: _Nums, rows: dict, f: float) -> tuple:
    bn = d["bottleneck"]
    name = LINK_NAMES.get(bn["target"], bn["target"])
    change = -bn["faster_change"]
    out: tuple = ((f"{name}: {f:g}x faster shortens the step by ", _n(change, pct), " (", n.run("step_time_s", secs),
                   " to ", _n(bn["faster_step_time_s"], secs), ").") if change > 0 else
                  (f"none stands out: no resource {f:g}x faster shortens the step (", n.run("step_time_s", secs), ")."))
    links = sorted((r for r in rows.values() if r["target"] != "compute"), key=lambda r: (r["faster_change"], r["target"]))
    if links:
        out += (f" Of the links, {f:g}x faster: ",)
        for i, r in enumerate(links):
            out += (", " if i else "", f"{LINK_NAMES.get(r['target'], r['target'])} ",
                    _n(r["faster_change"], lambda v: f"{v:+.1%}"))
        out += (". Critical path: compute ", n.run("critical_path.by_category.compute", secs), " of ",
                n.run("critical_path.total_s", secs), ".")
    else:
        out += (" No link carried traffic, so compute is the only resource to speed up.",)
    return out


def _fallback(d: dict) -> tuple:
    fb = d["fallback"]
    best = fb["best"]
    if best is None:
        return ("No neighbouring layout is valid and fits in memory.",)
    out: tuple = (f"{best['label']} ({', '.join(best['overrides'])}): step ", _n(best["step_time_s"], secs), " (",
                  _n(best["change"], lambda v: f"{v:+.1%}"), "), MFU ", _n(best["mfu"], pct), ", ",
                  _n(best["peak_memory_gib"], gib),
                  " per GPU." if best["change"] < 0 else " per GPU; no neighbour beats the plan, this one comes closest.")
    if not d["run"]["comm_map"]["kinds"]:
        return out + (" This layout has no communication, so none can dominate.",)
    valid = [c for c in fb["candidates"] if c["dropped"] is None]
    least = min(valid, key=lambda c: (c["exposed_comm_s"], c["label"]))
    return out + (f" If communication dominates, the neighbour with the least exposed communication is "
                  f"{least['label']} (", _n(least["exposed_comm_s"], secs), " exposed, step ",
                  _n(least["step_time_s"], secs), ").")


def _prompts(d: dict, n: _Nums) -> Section:
    wi = d["whatif"]
    rows = {r["target"]: r for r in wi["rows"] if r["present"]}
    f = wi["factor"]
    fb = d["fallback"]
    cand_rows = tuple((c["label"], ", ".join(c["overrides"]),
                       _n(c["step_time_s"], secs) if c["step_time_s"] else "-",
                       _n(c["change"], lambda v: f"{v:+.1%}") if c["change"] is not None else "-",
                       _n(c["peak_memory_gib"], gib) if c["peak_memory_gib"] else "-",
                       c["dropped"] or "valid") for c in fb["candidates"])
    links = [t for t in rows if t != "compute"]
    return Section("prompts", "Prompts for final memo", (
        Answer("why-tp", "Why is TP placed there?", _why_tp(d, n, rows, f)),
        Answer("hottest-collective", "What is the hottest collective?", _hottest(d, n)),
        Answer("global-batch", "How does global batch change?", _global_batch(d)),
        Answer("first-bottleneck", "What is the first bottleneck you expect?", _bottleneck(d, n, rows, f)),
        Figure("tornado", d["figures"]["tornado"], f"Step time with each resource {f:g}x faster or slower ("
               + ("the link classes that carried traffic, and compute)." if links else "compute: no link carried traffic).")),
        Answer("fallback-design", "What is the fallback design if communication dominates?", _fallback(d)),
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
    run = d["run"]
    lay = run["layout"]
    c = d["cluster"]
    where = (f"one {c['gpu']} GPU" if run["num_gpus"] == 1 else
             f"{run['num_gpus']:,} {c['gpu']} GPUs in {plural(c['num_nodes'], 'node')}")
    plan = f"{_layout_text(d)}, ZeRO-{lay['zero_stage']}" + (f", {_schedule(d)} pipeline schedule"
                                                            if lay["pp"] > 1 else ", no pipeline")
    subtitle = f"{where}; {plan}: the design worksheet answered by simulation."
    cards = (
        ("Step time", n.run("step_time_s", secs)),
        ("Tokens/s", n.run("tokens_per_s", count)),
        ("MFU", n.run("mfu", pct)),
        ("Bubble" if lay["pp"] > 1 else "Idle", n.run("bubble_fraction", pct)),
        ("Memory peak", n.mem("peak_gib", gib)),
    )
    sections = (_cluster(d), _model(d, n), _memory(d, n), _parallelism(d, n), _comm(d, n), _bubble(d, n),
                _checkpoint(d), _prompts(d, n), _method(d))
    footer = "Generated by stepsim report from simulations; the same scenario gives the same page."
    if run.get("warnings"):
        footer += " Warnings: " + "; ".join(w.rstrip(".") for w in run["warnings"]) + "."
    return Page(f"Design memo: {run['name']}", subtitle, cards, sections, footer=footer)


def memo_html(d: dict) -> str:
    return render_html(build_memo(d))


def memo_markdown(d: dict, figure_paths: dict | None = None) -> str:
    return render_markdown(build_memo(d), figure_paths)
