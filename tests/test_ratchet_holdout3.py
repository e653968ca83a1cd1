"""Ratchet and golden predictions of tests/data/holdout3-runs.yaml (tests/ratchets.py): a third set of
published runs from sources no other file uses, simulated for the first time only once the file was
fixed (out-of-sample)."""

from ratchets import RatchetTests


class TestHoldout3Runs(RatchetTests):
    NAME = "holdout3-runs"

    def test_no_run_is_refused_and_only_the_six_set_aside_before_its_first_run_are_excluded(self, result):
        """Every run is simulated, whatever its stack (the Pax, OPT and KempnerForge rows run the generic
        profile); the rows left out of the score are the four reprinted FlashAttention cells and the
        two toy config-validation runs, excluded before the file was first simulated."""
        assert not [r["error"] for r in result["rows"] if isinstance(r.get("error"), str)]
        excluded = sorted(r["id"] for r in result["rows"] if r.get("excluded"))
        assert excluded == sorted(["fa2paper-gpt3-1.3b-2k-nofa-a100x8", "fa2paper-gpt3-1.3b-2k-fa1-a100x8",
                                   "fa2paper-gpt3-2.7b-2k-nofa-a100x8", "fa2paper-gpt3-2.7b-2k-fa1-a100x8",
                                   "kforge-cfgval-debug-h200x4", "kforge-cfgval-hf-wikitext-h200x4"])
        assert result["summary"]["excluded"] == 6
