"""Ratchet and golden predictions of tests/data/study-runs.yaml (tests/ratchets.py): the in-sample
runs the small-model, network and MoE/FP8 mechanisms of issue 47 are studied on."""

import pytest

from ratchets import check, check_golden, check_page, validate

NAME = "study-runs"


@pytest.fixture(scope="module")
def result():
    return validate(NAME)


def test_mape_and_signed_mean_do_not_regress(result):
    check(NAME, result)


def test_every_prediction_equals_the_golden_figure(result):
    check_golden(NAME, result)


def test_the_validation_page_shows_these_figures(result):
    check_page(NAME, result)
