"""`stepsim report`: the design memo of a 64-GPU scenario, held against `stepsim run --json` and
`stepsim memory --json`, rendered in headless Chromium; and its bad-input paths.

The memo runs ~14 simulations (what-if, fallback neighbours, batch sizes); the module builds it once
(slow: about a minute on 2 busy cores) with the global batch cut to 16 sequences."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.reports.memo import SECTION_IDS

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = str(ROOT / "scenarios" / "llama3-70b-64xh100.yaml")
SETS = ["--set", "training.global_batch_size=16"]
WORKSHEET_HEADINGS = ("Cluster topology", "Model assumptions", "Memory estimate", "Parallelism choice",
                      "Communication map", "Pipeline bubble and microbatching", "Checkpoint strategy",
                      "Prompts for final memo")
PROMPTS = ("Why is TP placed there?", "What is the hottest collective?", "How does global batch change?",
           "What is the first bottleneck you expect?", "What is the fallback design if communication dominates?")
UNITS = {"%": 0.01, "ms": 1e-3, "us": 1e-6, "s": 1.0, "min": 60.0, "h": 3600.0, "GiB": 1.0, "TB": 1e12,
         "GB": 1e9, "MB": 1e6, "kB": 1e3, "B": 1.0, "": 1.0}


class _Numbers(HTMLParser):
    """Collects (source, key, value, shown text) of every tagged number, and the headings."""

    def __init__(self):
        super().__init__()
        self.nums: list[list] = []
        self.h2: list[str] = []
        self.h3: list[str] = []
        self._open: list | None = None
        self._tag: str | None = None
        self.scripts = 0
        self.images: list[str] = []
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "span" and "data-source" in a:
            self._open = [a["data-source"], a["data-key"], float(a["data-value"]), ""]
        if tag in ("h2", "h3"):
            self._tag, self._text = tag, ""
        if tag == "script":
            self.scripts += 1
        if tag == "img":
            self.images.append(a.get("src", ""))
        if tag in ("a", "link") and a.get("href"):
            self.links.append(a["href"])

    def handle_data(self, data):
        if self._open is not None:
            self._open[3] += data
        if self._tag:
            self._text += data

    def handle_endtag(self, tag):
        if tag == "span" and self._open is not None:
            self.nums.append(self._open)
            self._open = None
        if tag == self._tag:
            getattr(self, tag).append(self._text)
            self._tag = None


def _get(d, key):
    for part in key.split("."):
        d = d[int(part)] if isinstance(d, list) else d[part]
    return d


@pytest.fixture(scope="module")
def memo(tmp_path_factory):
    out = tmp_path_factory.mktemp("memo")
    html_path, md_path = out / "memo.html", out / "memo.md"
    assert main(["report", SCENARIO, *SETS, "--out", str(html_path), "--md", str(md_path), "--workers", "2"]) == 0
    return {"html": html_path.read_text(), "md": md_path.read_text(), "dir": out, "html_path": html_path}


@pytest.fixture(scope="module")
def reports(memo):
    import contextlib
    import io

    out = {}
    for name in ("run", "memory"):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert main([name, SCENARIO, *SETS, "--json"]) == 0
        out[name] = json.loads(buf.getvalue())
    return out


def test_slow_memo_numbers_match_run_and_memory_json(memo, reports):
    parser = _Numbers()
    parser.feed(memo["html"])
    tagged = parser.nums
    keys = {(src, key) for src, key, _, _ in tagged}
    for must in [("run", "step_time_s"), ("run", "tokens_per_s"), ("run", "mfu"), ("run", "bubble_fraction"),
                 ("run", "num_microbatches"), ("run", "critical_path.by_category.compute"),
                 ("memory", "peak_gib"), ("memory", "stages.0.weights_gib"), ("memory", "stages.0.optimizer_gib"),
                 ("memory", "stages.0.activations_gib"), ("memory", "stages.0.other_gib"),
                 ("run", "comm_map.kinds.sp.exposed_s"), ("run", "comm_map.kinds.dp.calls")]:
        assert must in keys, must
    assert len(tagged) >= 40
    assert_numbers_match(tagged, reports)


def assert_numbers_match(tagged: list, reports: dict) -> None:
    """Every number the memo took from a report has the report's exact value, and its text is that
    value rounded to the digits shown."""
    for src, key, value, shown in tagged:
        expected = _get(reports[src], key)
        assert value == pytest.approx(expected, rel=1e-12, abs=1e-15), (src, key)
        m = re.fullmatch(r"([+-]?[\d,]*\.?\d+) ?(%|ms|us|s|min|h|GiB|TB|GB|MB|kB|B)?", shown.strip())
        assert m, (key, shown)
        number, unit = m.group(1).replace(",", ""), m.group(2) or ""
        decimals = len(number.split(".")[1]) if "." in number else 0
        scale = UNITS[unit]
        assert abs(float(number) * scale - expected) <= 0.5 * 10 ** -decimals * scale * 1.0001, (key, shown, expected)


def test_slow_memo_answers_every_worksheet_table_and_prompt(memo, reports):
    parser = _Numbers()
    parser.feed(memo["html"])
    assert [h for h in parser.h2 if h in WORKSHEET_HEADINGS] == list(WORKSHEET_HEADINGS)
    assert parser.h3 == list(PROMPTS)
    html = memo["html"]
    for sid in SECTION_IDS:
        assert f'<section id="{sid}">' in html
    for row in ("Parameter count", "Layers", "Hidden size", "Sequence length", "Microbatch size", "Target global batch",
                "Precision", "Parameters", "Gradients", "Optimizer states", "Activations", "Communication buffers",
                "FSDP/ZeRO", "SP/CP", "EP/MoE", "Nodes", "GPUs per node", "Intra-node GPU interconnect",
                "Inter-node network", "GPU/NIC affinity notes", "Number of pipeline stages", "Number of microbatches",
                "Expected bubble risk", "Stage imbalance risk", "Full or sharded checkpoint", "Save frequency",
                "Resume complexity", "Conversion needs"):
        assert f">{row}<" in html, row
    run = reports["run"]
    hot = run["comm_map"]["most_exposed"]
    answer = html.split('id="hottest-collective"')[1].split("</div>")[0]
    assert f'data-key="comm_map.kinds.{hot}.exposed_s"' in answer
    why_tp = html.split('id="why-tp"')[1].split("</div>")[0]
    assert "one node" in why_tp and "NVLink" in why_tp  # TP4 of 8 GPUs per node: consecutive ranks
    assert run["comm_map"]["kinds"]["sp"]["crosses"] == "nvlink"
    batch = html.split('id="global-batch"')[1].split("</div>")[0]
    assert "8 sequences" in batch and "16 sequences" in batch and "32 sequences" in batch
    assert "What is the fallback design" in html and "neighbourhood search" in html


def test_slow_memo_is_self_contained_and_has_markdown(memo):
    parser = _Numbers()
    parser.feed(memo["html"])
    assert parser.scripts == 0
    assert len(parser.images) == 3 and all(src.startswith("data:image/png;base64,") for src in parser.images)
    assert all(link.startswith("#") for link in parser.links)
    assert "http://" not in memo["html"] and "https://" not in memo["html"]
    md = memo["md"]
    for heading in WORKSHEET_HEADINGS:
        assert f"\n## {heading}\n" in md
    for prompt in PROMPTS:
        assert f"**{prompt}**" in md
    for name in ("timeline", "tornado", "memory"):
        assert f"(memo-{name}.png)" in md
        assert (memo["dir"] / f"memo-{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_slow_memo_renders_in_headless_chromium(memo):
    from browser import find_chromium, ink_fraction, inspect_page, require_browser

    if find_chromium() is None:
        if require_browser():
            pytest.fail("STEPSIM_REQUIRE_BROWSER=1 but no Chromium found (apt-get install chromium)")
        pytest.skip("Chromium is not installed (.ci/run installs it; apt-get install chromium)")
    page = inspect_page(memo["html_path"])
    assert page["errors"] == []
    dom = page["dom"]
    assert [sid for sid, _ in dom["sections"]] == list(SECTION_IDS)
    assert [title for _, title in dom["sections"]][:8] == list(WORKSHEET_HEADINGS)
    assert dom["answers"] == list(PROMPTS)
    assert dom["images"] == [True, True, True]
    assert dom["text"] > 3000
    assert ink_fraction(page["png"]) > 0.03


# --- bad input: one line, exit 2, before any simulation ------------------------------------------

@pytest.fixture
def no_simulation(monkeypatch):
    import simulator.studies.designdoc as designdoc

    def boom(*args, **kwargs):
        raise AssertionError("simulated before checking the output paths")

    monkeypatch.setattr(designdoc, "gather", boom)


@pytest.mark.parametrize("flag", ["--out", "--md"])
def test_report_unwritable_output_is_one_line_exit_2(tmp_path, capsys, no_simulation, flag):
    good = str(tmp_path / "memo.html")
    bad = str(tmp_path / "missing-folder" / ("memo.html" if flag == "--out" else "memo.md"))
    args = ["report", SCENARIO, "--out", bad if flag == "--out" else good]
    if flag == "--md":
        args += ["--md", bad]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"stepsim: error: {flag}:") and "does not exist" in err[0]


def test_report_html_output_that_is_a_folder_is_rejected(tmp_path, capsys, no_simulation):
    assert main(["report", SCENARIO, "--html", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("stepsim: error: --html:") and "is a directory" in err[0]


@pytest.mark.parametrize("argv, says", [
    ([], "--out: left out; give a folder"),
    (["--out", "memo.md"], "--out: got 'memo.md'; is a folder (for memo.html and the rest), not a .md file; give a "
                           "folder name, or --md FILE"),
    (["--out", "a.html", "--html", "b.html"], "--out: got 'a.html'; names the page and so does --html"),
])
def test_report_outputs_are_a_folder_or_named_files(tmp_path, capsys, no_simulation, monkeypatch, argv, says):
    """--out is a folder on report as on every command; the page and the Markdown have --html and
    --md; an --out ending in .html is the page (what worked before --html keeps working)."""
    monkeypatch.chdir(tmp_path)
    assert main(["report", SCENARIO, *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"stepsim: error: {says}"), err


def test_report_out_folder_holds_the_page_the_markdown_and_its_figures(tmp_path, capsys, monkeypatch):
    """The memo's data is stubbed (the slow tests above render real ones): what is checked is where
    each file goes for --out DIR, --out FILE.html and --html."""
    import simulator.reports.memo as memo
    import simulator.studies.designdoc as designdoc

    monkeypatch.setattr(designdoc, "gather", lambda *a, **k: {"figures": {"timeline": b"png"}})
    monkeypatch.setattr(memo, "memo_html", lambda data: "<html></html>")
    monkeypatch.setattr(memo, "memo_markdown", lambda data, paths: f"![]({paths['timeline']})")
    assert main(["report", SCENARIO, "--out", str(tmp_path / "memo"), "--quiet"]) == 0
    assert sorted(p.name for p in (tmp_path / "memo").iterdir()) == ["memo-timeline.png", "memo.html", "memo.md"]
    assert (tmp_path / "memo" / "memo.md").read_text() == "![](memo-timeline.png)"
    assert main(["report", SCENARIO, "--out", str(tmp_path / "old.html"), "--quiet"]) == 0
    assert main(["report", SCENARIO, "--html", str(tmp_path / "new.html"), "--quiet"]) == 0
    assert (tmp_path / "old.html").read_text() == (tmp_path / "new.html").read_text() == "<html></html>"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memo", "new.html", "old.html"]


def test_report_bad_factor_is_rejected_before_simulating(tmp_path, capsys, no_simulation):
    assert main(["report", SCENARIO, "--out", str(tmp_path / "m.html"), "--factor", "1"]) == 2
    assert capsys.readouterr().err.strip().startswith("stepsim: error: --factor: got 1.0")
