"""Ratchet and golden predictions of tests/data/nemo-2407-runs.yaml (tests/ratchets.py)."""

import pytest

from ratchets import check, check_golden, check_page, validate

NAME = "nemo-2407-runs"


@pytest.fixture(scope="module")
def result():
    return validate(NAME)


def test_mape_and_signed_mean_do_not_regress(result):
    check(NAME, result)


def test_every_prediction_equals_the_golden_figure(result):
    check_golden(NAME, result)


def test_the_validation_page_shows_these_figures(result):
    check_page(NAME, result)


def test_out_of_sample_nemo_24_07_fp8_runs_within_15pct(result):
    """NVIDIA's NeMo 24.07 FP8 table (GPT-3 5B to 175B, Llama 2 7B to 70B, Llama 3 8B and 70B
    with CP2; 8 to 512 H100)."""
    out = result
    assert out["summary"]["scored"] == 9
    assert out["summary"]["worst"] <= 0.15 and out["summary"]["mape"] <= 0.10
