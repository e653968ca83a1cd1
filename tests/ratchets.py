"""The ratchet on every file of published runs: its MAPE and its signed mean error pinned just above
today's figures, the rows it scores never fewer, and each row's prediction equal to the golden figures.

Tighten a pin when the model improves; never loosen one to let a regression through. One case moves
a signed-mean pin outward: a change that lowers the file's MAPE and moves every row it moves by more
than a point toward zero (the commit says how many), so that the signed mean grows only because
errors that had offset each other shrank. Its MAPE pin tightens in the same commit. One case moves
an in-sample file's pins outward: a mechanism read from a framework's own source code (not fitted)
that lowers the MAPE and the signed mean of the out-of-sample files pooled; the commit names the
in-sample rows it moves away from zero and why they were off before (0.5.7: the 16-bit LM head
under FP8, megatron-bridge-runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.studies.validate import validate_file
from simulator.studies.validation_page import section, summary_row

HERE = Path(__file__).resolve().parent
FILES = {
    "public-runs": HERE.parents[1] / "shared" / "validation" / "public-runs.yaml",
    **{p.stem: p for p in sorted((HERE / "data").glob("*-runs.yaml"))},
}
# file: (MAPE at most, |signed mean| at most, rows scored at least); today's figures + 0.5 points.
RATCHETS = {
    "public-runs": (0.0430, 0.0102, 29),
    "blackwell-runs": (0.1349, 0.0192, 30),
    "framework-runs": (0.1055, 0.0295, 47),
    "megatron-bridge-runs": (0.0704, 0.0223, 7),
    "moe-runs": (0.1065, 0.0204, 27),
    "nemo-2407-runs": (0.0386, 0.0178, 9),
    "study-runs": (0.0810, 0.0520, 160),
    "nanotron-tp-runs": (0.1907, 0.1907, 5),
    "holdout-runs": (0.1292, 0.0438, 108),
    "holdout2-runs": (0.0960, 0.0356, 108),
    "holdout3-runs": (0.1378, 0.0254, 86),
    "holdout4-runs": (0.1102, 0.0807, 45),
    "holdout5-runs": (0.0712, 0.0172, 132),
}
GOLDEN = json.loads((HERE / "golden" / "steps.json").read_text())


def validate(name: str) -> dict:
    return validate_file(str(FILES[name]), workers=2, progress=None)


def check(name: str, result: dict) -> None:
    mape, signed, scored = RATCHETS[name]
    s = result["summary"]
    assert s["scored"] >= scored, f"{name}: {s['scored']} rows scored, fewer than {scored}"
    assert s["mape"] <= mape, f"{name}: MAPE {s['mape']:.2%} above its ratchet {mape:.2%}"
    assert abs(s["signed_mean"]) <= signed, f"{name}: signed mean {s['signed_mean']:+.2%} beyond +-{signed:.2%}"


def shown_path(name: str) -> str:
    """The file's path as docs/validation.md names it (relative to the repository root)."""
    path = FILES[name]
    return "../shared/validation/public-runs.yaml" if name == "public-runs" else f"tests/data/{path.name}"


def check_page(name: str, result: dict) -> None:
    """docs/validation.md shows this file's summary row and section as the code gives them today
    (regenerate the page with the command in its header)."""
    page = (HERE.parent / "docs" / "validation.md").read_text()
    assert summary_row(name, result) in page, f"docs/validation.md: the summary of {name} is stale"
    assert section(name, result, shown_path(name)) in page, f"docs/validation.md: the section of {name} is stale"


def check_golden(name: str, result: dict) -> None:
    """Every row predicts exactly the golden step time (``python tests/golden.py --write`` after a
    change meant to move them)."""
    got = {r["id"]: (r["predicted"]["step_time_s"] if isinstance(r.get("predicted"), dict) else None)
           for r in result["rows"]}
    assert got == GOLDEN["validation"][name]


class RatchetTests:
    """The checks every runs file has: a module ``tests/test_ratchet_<file>.py`` subclasses this with
    ``NAME`` set (and adds the file's own tests as methods that take ``result``). One module per file
    keeps each file's validation on its own xdist worker (``--dist loadfile``)."""

    NAME = ""

    @pytest.fixture(scope="class")
    @classmethod
    def result(cls) -> dict:
        return validate(cls.NAME)

    def test_mape_and_signed_mean_do_not_regress(self, result):
        check(self.NAME, result)

    def test_every_prediction_equals_the_golden_figure(self, result):
        check_golden(self.NAME, result)

    def test_the_validation_page_shows_these_figures(self, result):
        check_page(self.NAME, result)
