"""Ratchet and golden predictions of tests/data/holdout-runs.yaml (tests/ratchets.py): published
runs collected before the model changes of issue 47 and never used to make one (out-of-sample)."""

from ratchets import RatchetTests


class TestHoldoutRuns(RatchetTests):
    NAME = "holdout-runs"

    def test_every_run_is_simulated_whatever_its_framework(self, result):
        """Issue 47: no run is refused for its framework (null or an unshipped stack runs the generic
        profile); the one refusal left is a layout stepsim cannot split (pp 32 over the model's layers)."""
        refused = [r["error"] for r in result["rows"] if isinstance(r.get("error"), str)]
        assert not any("framework" in e for e in refused), refused
        assert len(refused) <= 1
