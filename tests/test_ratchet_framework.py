"""Ratchet and golden predictions of tests/data/framework-runs.yaml (tests/ratchets.py)."""

from ratchets import RatchetTests


class TestFrameworkRuns(RatchetTests):
    NAME = "framework-runs"
