"""The parallel plan: the rank grid as one numpy array, and process groups as slices of it.

Megatron-LM orders ranks TP fastest, then CP, then DP, then PP (``initialize_model_parallel``),
so ``grid[pp, dp, cp, tp]`` is the global rank and, with 8 GPUs per node and tp <= 8, a TP group
stays inside a node. Rank r runs on GPU r (nodes hold consecutive GPUs). Expert layers fold the
tp x cp x dp ranks of a stage differently (Megatron-core "MoE parallel folding"): in stage rank
order, expert-TP groups of ``etp`` consecutive ranks, then EP groups of ``ep`` such blocks, then
the expert-DP groups of ranks holding the same experts. With etp = tp (the default) the EP groups
are carved out of DP x CP at equal TP position; with etp = 1 an EP group can span TP ranks too.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from simulator.common.errors import ConfigError
from simulator.parts.frameworks import load_profile


@dataclass(frozen=True, eq=False)
class Plan:
    """Degrees and the rank grid ``grid[pp, dp, cp, tp]``."""

    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    grid: np.ndarray
    etp: int = 0  # expert tensor parallel size; build() sets it (default tp)
    dp_replicate: int = 1  # hybrid sharding: copies of the ZeRO/FSDP-sharded state

    @classmethod
    def build(cls, tp: int, pp: int, dp: int, cp: int = 1, ep: int = 1, etp: int | None = None,
              dp_replicate: int = 1) -> "Plan":
        grid = np.arange(tp * pp * dp * cp).reshape(pp, dp, cp, tp)
        grid.setflags(write=False)
        return cls(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, grid=grid, etp=etp or tp, dp_replicate=dp_replicate)

    @property
    def dp_shard(self) -> int:
        """DP ranks of one shard group (consecutive, as torchtitan's dp_shard mesh dimension is
        inner to dp_replicate and MaxText's ici_fsdp is inner to dcn_data)."""
        return self.dp // self.dp_replicate

    @property
    def world(self) -> int:
        return self.grid.size

    def coords(self, rank: int) -> tuple[int, int, int, int]:
        """(pp, dp, cp, tp) of a global rank."""
        p, d, c, t = np.unravel_index(rank, self.grid.shape)
        return int(p), int(d), int(c), int(t)

    def stage_of(self, rank: int) -> int:
        return rank // (self.dp * self.cp * self.tp)

    def tp_group(self, rank: int) -> tuple[int, ...]:
        p, d, c, _ = self.coords(rank)
        return tuple(int(x) for x in self.grid[p, d, c, :])

    def cp_group(self, rank: int) -> tuple[int, ...]:
        p, d, _, t = self.coords(rank)
        return tuple(int(x) for x in self.grid[p, d, :, t])

    def dp_group(self, rank: int) -> tuple[int, ...]:
        p, _, c, t = self.coords(rank)
        return tuple(int(x) for x in self.grid[p, :, c, t])

    def dp_cp_group(self, rank: int) -> tuple[int, ...]:
        """The group Megatron's distributed optimizer and FSDP shard over: DP x CP, or with hybrid
        sharding the dp / dp_replicate consecutive DP ranks (x CP) of this rank's copy."""
        p, d, _, t = self.coords(rank)
        lo = d // self.dp_shard * self.dp_shard
        return tuple(self.grid[p, lo:lo + self.dp_shard, :, t].ravel().tolist())

    def dp_replicate_group(self, rank: int) -> tuple[int, ...]:
        """Hybrid sharding: the ranks holding the same shard in each copy (one per copy)."""
        p, d, c, t = self.coords(rank)
        return tuple(int(x) for x in self.grid[p, d % self.dp_shard::self.dp_shard, c, t])

    def _expert_view(self, rank: int) -> tuple[np.ndarray, tuple[int, int, int]]:
        """The stage's ranks as ``view[edp, ep, etp]`` and this rank's index in it."""
        per_stage = self.dp * self.cp * self.tp
        view = self.grid[self.stage_of(rank)].reshape(per_stage // (self.ep * self.etp), self.ep, self.etp)
        i = rank % per_stage
        return view, (i // (self.ep * self.etp), (i // self.etp) % self.ep, i % self.etp)

    def ep_group(self, rank: int) -> tuple[int, ...]:
        view, (d, _, t) = self._expert_view(rank)
        return tuple(int(x) for x in view[d, :, t])

    def expert_dp_group(self, rank: int) -> tuple[int, ...]:
        view, (_, e, t) = self._expert_view(rank)
        return tuple(int(x) for x in view[:, e, t])

    def expert_tp_group(self, rank: int) -> tuple[int, ...]:
        view, (d, e, _) = self._expert_view(rank)
        return tuple(int(x) for x in view[d, e, :])

    def group_of(self, rank: int, kind: str) -> tuple[int, ...]:
        """The ``kind`` group (tp, cp, dpcp, dprep, ep, edp, etp) ``rank`` belongs to."""
        return {"tp": self.tp_group, "cp": self.cp_group, "dpcp": self.dp_cp_group, "dprep": self.dp_replicate_group,
                "ep": self.ep_group, "edp": self.expert_dp_group, "etp": self.expert_tp_group}[kind](rank)

    @functools.lru_cache(maxsize=256)
    def pp_pairs(self, rank: int, stage: int, fold: bool) -> tuple[tuple[int, int], ...]:
        """(source, destination) of the pipeline transfers ``rank`` starts towards ``stage``: its
        own, or folded, those of every rank of its stage."""
        if not fold:
            return ((rank, self.pp_peer(rank, stage)),)
        # the stage's ranks in grid order, and the same (dp, cp, tp) positions on ``stage``
        sources, peers = self.stage_ranks(self.stage_of(rank)), self.grid[stage % self.pp].ravel()
        return tuple(zip(sources.tolist(), peers.tolist()))

    def pp_peer(self, rank: int, stage: int) -> int:
        """The rank holding the same (dp, cp, tp) position on another pipeline stage."""
        _, d, c, t = self.coords(rank)
        return int(self.grid[stage % self.pp, d, c, t])

    def stage_ranks(self, stage: int) -> np.ndarray:
        return self.grid[stage].ravel()

    def groups_on_stage(self, stage: int, kind: str) -> tuple[tuple[int, ...], ...]:
        """Every distinct group of one kind among the ranks of a pipeline stage, in rank order."""
        g = self.grid[stage]  # [dp, cp, tp]
        per_stage = self.dp * self.cp * self.tp
        view = g.reshape(per_stage // (self.ep * self.etp), self.ep, self.etp)  # [edp, ep, etp]
        copies = g.reshape(self.dp_replicate, self.dp_shard, self.cp, self.tp)  # [copy, shard dp, cp, tp]
        # each group's members in grid order; groups ordered by their first rank (slices, not a scan)
        rows = {"tp": lambda: g.reshape(-1, self.tp),
                "cp": lambda: g.transpose(0, 2, 1).reshape(-1, self.cp),
                "dp": lambda: g.transpose(1, 2, 0).reshape(-1, self.dp),
                "dpcp": lambda: copies.transpose(0, 3, 1, 2).reshape(self.dp_replicate * self.tp, -1),
                "dprep": lambda: copies.transpose(1, 2, 3, 0).reshape(-1, self.dp_replicate),
                "ep": lambda: view.transpose(0, 2, 1).reshape(-1, self.ep),
                "edp": lambda: view.transpose(1, 2, 0).reshape(-1, view.shape[0]),
                "etp": lambda: view.reshape(-1, self.etp)}[kind]()
        return tuple(tuple(int(x) for x in row) for row in rows.tolist())


@functools.lru_cache(maxsize=1024)
def vstage_layers(num_layers: int, pp: int, vp: int = 1, first: int | None = None,
                  last: int | None = None, counts: tuple[int, ...] | None = None) -> tuple[range, ...]:
    """Layers of each virtual stage (chunk c of stage s is virtual stage c * pp + s, Megatron-LM).

    Even split by default. Like Megatron-core's ``decoder_first_pipeline_num_layers`` and
    ``decoder_last_pipeline_num_layers``, ``first`` / ``last`` fix the layer count of the first and
    last virtual stage (for example fewer layers where the embedding and the LM head sit, as BLOOM
    and Llama 3 did); the other virtual stages share the rest evenly. ``counts``
    (``parallelism.pipeline_layers``) gives every virtual stage's count instead, for any split a
    framework makes. Cached: the memory model asks for the same split once per stage, and the
    planner for thousands of layouts.
    """
    n = pp * vp
    if counts is not None:
        if len(counts) != n or sum(counts) != num_layers:
            raise ConfigError("parallelism.pipeline_layers", list(counts),
                              f"give pp x vp = {n} counts adding up to num_hidden_layers ({num_layers}); "
                              f"got {len(counts)} adding up to {sum(counts)}")
        starts = [0]
        for k in counts:
            starts.append(starts[-1] + k)
        return tuple(range(a, b) for a, b in zip(starts, starts[1:]))
    fixed = {i: k for i, k in ((0, first), (n - 1, last)) if k is not None}
    if n == 1:
        fixed = {}
    free = n - len(fixed)
    rest = num_layers - sum(fixed.values())
    if any(k < 0 for k in fixed.values()) or rest < 0 or (free and rest % free) or (not free and rest):
        field = "parallelism.pp" if not fixed and vp == 1 else ("parallelism.vp" if not fixed else
                                                                 "parallelism.first_pipeline_num_layers")
        value = {"parallelism.pp": pp, "parallelism.vp": vp}.get(field, first)
        if fixed:
            need = f"the layers left after first/last ({rest}) must split evenly over the other {free} virtual stages"
        else:
            need = (f"pp x vp ({n}) must divide num_hidden_layers ({num_layers}), or set first/last_pipeline_num_layers "
                    "or pipeline_layers")
        raise ConfigError(field, value, need)
    each = rest // free if free else 0
    out, start = [], 0
    for i in range(n):
        k = fixed.get(i, each)
        out.append(range(start, start + k))
        start += k
    return tuple(out)


def cost_balanced_split(layer_cost: float, head_cost: float, layers: int, pp: int) -> tuple[int, ...]:
    """Decoder layers per pipeline stage as nanotron places them (huggingface/nanotron
    src/nanotron/models/base.py ``build_model``): its pipeline blocks in forward order (embedding,
    the decoder layers, final norm, LM head, cast, loss) weighted by ``get_block_compute_costs``
    (a decoder layer ``layer_cost``, the LM head ``head_cost``, the others nothing), each block
    given to the current rank, which moves on once the cumulative cost passes its share
    total x (rank + 1) / pp. The LM head's weight leaves the last stages fewer layers; a stage may
    get none."""
    costs = [0.0] + [layer_cost] * layers + [0.0, head_cost, 0.0, 0.0]
    total = sum(costs)
    counts, rank, cumulative = [0] * pp, 0, 0.0
    for i, cost in enumerate(costs):
        cumulative += cost
        if 1 <= i <= layers:
            counts[rank] += 1
        if cumulative > total * (rank + 1) / pp:
            rank += 1
    return tuple(counts)


def framework_counts(model, framework: str | None, pp: int, vp: int, first: int | None,
                     last: int | None) -> tuple[int, ...] | None:
    """The framework's own layer split (profile ``pipeline.split: parameters``, nanotron's
    ``cost_balanced_split`` on ``get_block_compute_costs``: 4 h^2 of attention and 3 or 2 h x ffn
    of MLP per layer, vocab x h for the LM head) when the layout leaves it to the framework: pp > 1,
    no interleaving, no first/last counts. None: the even split (or the layout's own)."""
    if pp < 2 or vp > 1 or first is not None or last is not None:
        return None
    if load_profile(framework)["pipeline"]["split"] != "parameters":
        return None
    h = model.hidden_size
    return cost_balanced_split(4 * h * h + model.mlp_matrices * model.intermediate_size * h, model.vocab_size * h,
                               model.num_hidden_layers, pp)


def pipeline_counts(s) -> tuple[int, ...] | None:
    """The scenario's layer counts per virtual stage: ``parallelism.pipeline_layers`` when given,
    else the framework's own split (``framework_counts``), else None (even or first/last)."""
    par = s.parallelism
    if par.pipeline_layers is not None:
        return par.pipeline_layers
    return framework_counts(s.model, s.framework, par.pp, par.vp, par.first_pipeline_num_layers,
                            par.last_pipeline_num_layers)


def scenario_split(s) -> tuple[range, ...]:
    """The layers of each virtual stage of a scenario (``vstage_layers`` with ``pipeline_counts``)."""
    par = s.parallelism
    return vstage_layers(s.model.num_hidden_layers, par.pp, par.vp, par.first_pipeline_num_layers,
                         par.last_pipeline_num_layers, pipeline_counts(s))
