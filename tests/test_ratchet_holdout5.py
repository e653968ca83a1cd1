"""Ratchet and golden predictions of tests/data/holdout5-runs.yaml (tests/ratchets.py): a fifth set of
published runs from documents no other file uses, committed before its first simulation and run once on
0.5.6 (out-of-sample)."""

from ratchets import FILES, RatchetTests

from simulator.scenario.load import scenario_from_dict
from simulator.studies.cases import case_to_scenario_dict, load_cases


class TestHoldout5Runs(RatchetTests):
    NAME = "holdout5-runs"

    def test_every_run_is_simulated_and_scored(self, result):
        """No run is refused (the Pax rows name no framework and run on the generic profile) and none
        was set aside: all 132 count."""
        assert not [r["error"] for r in result["rows"] if isinstance(r.get("error"), str)]
        assert not [r["id"] for r in result["rows"] if r.get("excluded")]
        assert result["summary"]["scored"] == len(result["rows"]) == 132

    def test_small_models_stay_within_a_fifth(self, result):
        """Issue 47's bar for models under 3B parameters (the nine TinyLlama 1.1B runs): each within 20%."""
        cases = {c["id"]: c for c in load_cases(FILES[self.NAME])}
        small = [r for r in result["rows"] if cases[r["id"]]["model"]["params_b"] < 3]
        assert len(small) == 9
        assert all(abs(r["error"]) <= 0.20 for r in small), [(r["id"], r["error"]) for r in small]

    def test_gb200_jobs_use_64_gpus_of_each_rack(self):
        """The GB200 rows ran 64 of each NVL72 rack's 72 GPUs: the case reader gives them 64-GPU NVLink
        domains, so 256 GPUs are 4 racks, not a refusal for 256 not being a multiple of 72."""
        gb200 = [c for c in load_cases(FILES[self.NAME]) if c["hardware"]["gpu"] == "GB200"]
        assert len(gb200) == 7
        for c in gb200:
            s = scenario_from_dict(case_to_scenario_dict(c, []))
            assert s.cluster.topology == "gb200-nvl72" and s.cluster.gpus_per_node == 64
            assert s.cluster.num_gpus == c["hardware"]["count"]
