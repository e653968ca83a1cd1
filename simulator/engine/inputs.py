"""What the engine is given, built in one direction from the scenario: the cluster, the GPU, the
rank grid, the workload and every stage's program. Nothing here runs simpy."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from simulator.scenario.config import Scenario
from simulator.parts.calibration import COMMUNICATION
from simulator.network.faults import apply_link_faults
from simulator.parts.gpus import GPUSpec, gpu_of
from simulator.network.cluster import Cluster, build_cluster
from simulator.parts.topology import load_topology
from simulator.layout.grid import Plan
from simulator.program.builder import Op, build_program
from simulator.engine.records import SimOptions
from simulator.workload.workload import Workload, build_workload


@dataclass(frozen=True, eq=False)
class StepInputs:
    scenario: Scenario
    options: SimOptions
    gpu: GPUSpec
    cluster: Cluster
    plan: Plan
    workload: Workload
    programs: dict[int, tuple[Op, ...]]  # by pipeline stage


def step_inputs(s: Scenario, options: SimOptions = SimOptions(), cluster: Cluster | None = None) -> StepInputs:
    par = s.parallelism
    gpu = gpu_of(s.cluster, s.training.precision)
    if options.compute_scale != 1.0:
        gpu = scaled_gpu(gpu, options.compute_scale)
    work = build_workload(s, gpu)
    return StepInputs(
        scenario=s, options=options, gpu=gpu, cluster=cluster or scenario_cluster(s),
        plan=Plan.build(par.tp, par.pp, s.dp, par.cp, par.ep, par.expert_tp, par.dp_replicate), workload=work,
        programs={st: build_program(s, work, st, options.extras) for st in range(par.pp)})


def scenario_cluster(s: Scenario) -> Cluster:
    """The cluster a scenario runs on: its topology scaled to its nodes, with its link overrides,
    the NVLink rate times a calibrated ``communication`` factor (``parts.calibration``: a one-node
    profile measures NVLink collectives only, so the links between nodes keep their rates) and its
    link faults (``simulator.network.faults``). Cached by what it reads alone: the planner's
    layouts of one scenario share one cluster."""
    nvlink = s.calibration.factor(COMMUNICATION) if s.calibration is not None else None
    return _cluster(s.cluster, s.faults, nvlink or 1.0)


@functools.lru_cache(maxsize=64)
def _cluster(c, faults, nvlink_factor: float = 1.0) -> Cluster:
    cluster = build_cluster(load_topology(c.topology), c.num_nodes, gpus_per_node=c.gpus_per_node,
                            nvlink_bandwidth_GBps=c.nvlink_bandwidth_GBps,
                            network_bandwidth_Gbps=c.network_bandwidth_Gbps,
                            oversubscription=c.oversubscription, gpu=c.gpu)
    if nvlink_factor != 1.0:
        cluster = cluster.with_bandwidth_scaled({"nvlink": nvlink_factor})
    return apply_link_faults(cluster, faults)


def scaled_gpu(gpu: GPUSpec, factor: float) -> GPUSpec:
    """``gpu`` with every peak FLOP/s and the HBM bandwidth multiplied by ``factor`` (compute what-if)."""
    return replace(gpu, peak_flops={k: v * factor for k, v in gpu.peak_flops.items()},
                   hbm_bandwidth_Bps=gpu.hbm_bandwidth_Bps * factor)
