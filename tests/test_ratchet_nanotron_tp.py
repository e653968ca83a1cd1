"""Ratchet and golden predictions of tests/data/nanotron-tp-runs.yaml (tests/ratchets.py): nanotron's
own tensor-parallel scaling measurements (TP 2-32, no DP or PP), in-sample."""

import yaml
from ratchets import FILES, RatchetTests

from simulator.studies.cases import case_to_scenario_dict


class TestNanotronTpRuns(RatchetTests):
    NAME = "nanotron-tp-runs"

    def test_the_tied_model_is_the_swiglu_llama(self, result):
        """The cases say ``tied: true``: fitted to the tied parameter count, the activation is
        nanotron's SwiGLU, not the GeLU model an untied count of 3.57B would give."""
        for case in yaml.safe_load(FILES[self.NAME].read_text())["cases"]:
            model = case_to_scenario_dict(case)["model"]
            assert (model["hidden_act"], model["tie_word_embeddings"]) == ("silu", True), case["id"]
        assert result["summary"]["scored"] == 5
