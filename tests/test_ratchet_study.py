"""Ratchet and golden predictions of tests/data/study-runs.yaml (tests/ratchets.py): the in-sample
runs the small-model, network and MoE/FP8 mechanisms of issue 47 are studied on."""

from ratchets import RatchetTests


class TestStudyRuns(RatchetTests):
    NAME = "study-runs"
