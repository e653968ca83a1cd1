"""Ratchet and golden predictions of tests/data/blackwell-runs.yaml (tests/ratchets.py)."""

from ratchets import RatchetTests


class TestBlackwellRuns(RatchetTests):
    NAME = "blackwell-runs"
