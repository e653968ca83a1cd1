"""Ratchet and golden predictions of tests/data/holdout4-runs.yaml (tests/ratchets.py): a fourth set of
published runs from sources no other file uses, committed before its first simulation and run once on
0.5.6 (out-of-sample)."""

from ratchets import RatchetTests


class TestHoldout4Runs(RatchetTests):
    NAME = "holdout4-runs"

    def test_no_run_is_refused_and_only_the_eight_set_aside_before_its_first_run_are_excluded(self, result):
        """Every run is simulated; the rows left out of the score are the six whose optimizer or offload
        stepsim does not model and the two an in-sample row already quotes, all set aside before the
        file was first simulated."""
        assert not [r["error"] for r in result["rows"] if isinstance(r.get("error"), str)]
        excluded = sorted(r["id"] for r in result["rows"] if r.get("excluded"))
        assert excluded == sorted([
            "torchtune-flags-llama3.2-3b-opt-in-bwd-a100x1", "torchtune-flags-llama3.2-3b-act-offload-a100x1",
            "torchtune-readme-llama3.1-70b-full-cpuoffload-a100x8", "mnanogpt-124m-soap-20241009",
            "mnanogpt-124m-shampoo-20241029", "mnanogpt-124m-soap-20241029",
            "mnanogpt-1p5b-muon-20241020-a", "mnanogpt-1p5b-muon-20241020-b"])
        assert result["summary"]["excluded"] == 8
