"""Ratchet and golden predictions of tests/data/moe-runs.yaml (tests/ratchets.py)."""

from ratchets import RatchetTests


class TestMoeRuns(RatchetTests):
    NAME = "moe-runs"
