"""Ratchet and golden predictions of tests/data/nemo-2407-runs.yaml (tests/ratchets.py)."""

from ratchets import RatchetTests


class TestNemo2407Runs(RatchetTests):
    NAME = "nemo-2407-runs"

    def test_out_of_sample_nemo_24_07_fp8_runs_within_15pct(self, result):
        """NVIDIA's NeMo 24.07 FP8 table (GPT-3 5B to 175B, Llama 2 7B to 70B, Llama 3 8B and 70B
        with CP2; 8 to 512 H100)."""
        out = result
        assert out["summary"]["scored"] == 9
        assert out["summary"]["worst"] <= 0.15 and out["summary"]["mape"] <= 0.10
