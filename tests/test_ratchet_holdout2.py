"""Ratchet and golden predictions of tests/data/holdout2-runs.yaml (tests/ratchets.py): a second set of
published runs, collected after the first holdout had been consulted in aggregate, and simulated for the
first time only once the file was fixed (out-of-sample)."""

from ratchets import RatchetTests


class TestHoldout2Runs(RatchetTests):
    NAME = "holdout2-runs"

    def test_every_run_is_simulated_and_only_the_offloaded_ones_are_excluded(self, result):
        """No run is refused, and the runs left out of the score are exactly those whose optimizer step
        runs on the host (CPU optimizer offload), which stepsim does not model."""
        assert not [r["error"] for r in result["rows"] if isinstance(r.get("error"), str)]
        excluded = [r for r in result["rows"] if r.get("excluded")]
        assert excluded and all("CPU optimizer offload" in r["excluded"] for r in excluded)
        assert result["summary"]["excluded"] == len(excluded) == 29
