"""The launches a program marks (``Launch.stamp``): exactly those some wait on several handles
reads, so the engine records when each of them ends (``engine._stamp``) and no other."""
import pytest

from simulator.scenario.load import load_scenario
from simulator.engine.inputs import step_inputs
from simulator.program.builder import Launch, Wait, build_program

LAYOUTS = {
    "zero1-interleaved-cp": ("scenarios/llama3-70b-64xh100.yaml", []),
    "zero3-pipeline": ("scenarios/llama3-70b-64xh100.yaml",
                       ["parallelism.tp=2", "parallelism.pp=8", "parallelism.vp=10", "parallelism.dp=4",
                        "parallelism.cp=1", "parallelism.zero_stage=3"]),
    "moe-ep": ("scenarios/qwen3-30b-a3b-16xh100.yaml", []),
    "tiny-zero3-cp": ("scenarios/tiny.yaml", ["cluster.num_nodes=4", "training.global_batch_size=32",
                                              "parallelism.pp=2", "parallelism.dp=4", "parallelism.cp=2",
                                              "parallelism.zero_stage=3"]),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_exactly_the_launches_a_multi_handle_wait_reads_are_stamped(name):
    path, overrides = LAYOUTS[name]
    s = load_scenario(path, overrides)
    work = step_inputs(s).workload
    multi_waits = 0
    for stage in range(s.parallelism.pp):
        ops = build_program(s, work, stage)
        read = {h for op in ops if isinstance(op, Wait) and len(op.handles) > 1 for h in op.handles}
        multi_waits += len(read)
        launches = [op for op in ops if isinstance(op, Launch)]
        assert len({op.handle for op in launches}) == len(launches)  # a handle names one launch
        assert {op.handle for op in launches if op.stamp} == {op.handle for op in launches} & read
    assert multi_waits > 0  # each layout has such waits, so the check is not empty
