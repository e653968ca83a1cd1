"""The design memo says what it was asked for any scenario: one GPU, FSDP without a pipeline, an MoE
model with expert parallelism on an interleaved pipeline, and 16,384 GPUs. Each memo is rendered
in headless Chromium; its text has no template seams, no contradiction with the layout it
describes, and every number taken from a report equals `stepsim run --json` / `stepsim memory --json`.

Slow: four memos (about 60 simulations) and their run reports; the batches are cut so that each
memo takes seconds."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from cli_json import cli_json
from simulator.cli import main
from test_memo import PROMPTS, WORKSHEET_HEADINGS, _Numbers, assert_numbers_match

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "scenarios" / "tiny.yaml")
MIXTRAL = str(ROOT / "scenarios" / "mixtral-8x7b-64xh100.yaml")

CASES = {
    # the toy model on a single GPU: no axis at all
    "one-gpu": (TINY, ["cluster.gpus_per_node=1", "parallelism.tp=1", "parallelism.pp=1", "parallelism.dp=1"]),
    # ZeRO-3 over the 8 GPUs of one node, no pipeline
    "fsdp": (TINY, ["parallelism.tp=1", "parallelism.pp=1", "parallelism.dp=8", "parallelism.zero_stage=3"]),
    # MoE: EP8, PP4 with 8 chunks per GPU (interleaved), 8 nodes
    "moe": (MIXTRAL, ["training.global_batch_size=64"]),
    # the toy model on 2,048 nodes: 16,384 GPUs, DP 2,048
    "huge": (TINY, ["cluster.num_nodes=2048", "parallelism.tp=4", "parallelism.pp=2", "parallelism.dp=null",
                    "training.global_batch_size=8192"]),
}
GPUS_PER_NODE = {"one-gpu": 1}  # the others: 8 (DGX H100)


class _Text(HTMLParser):
    """The text of an HTML page, blocks on their own lines (what a reader sees, without a browser)."""

    BLOCKS = {"p", "div", "h1", "h2", "h3", "li", "dt", "dd", "tr", "caption", "figcaption", "footer", "section"}

    def __init__(self):
        super().__init__()
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("style", "script"):
            self._skip += 1
        if tag in self.BLOCKS:
            self.parts.append("\n")
        if tag in ("td", "th"):
            self.parts.append("\t")

    def handle_endtag(self, tag):
        if tag in ("style", "script"):
            self._skip -= 1
        if tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def _text(html: str) -> str:
    parser = _Text()
    parser.feed(html)
    return "".join(parser.parts)


@pytest.fixture(scope="module")
def memos(tmp_path_factory):
    out = {}
    for name, (scenario, sets) in CASES.items():
        folder = tmp_path_factory.mktemp(name)
        flags = [x for v in sets for x in ("--set", v)]
        html_path = folder / "memo.html"
        assert main(["report", scenario, *flags, "--out", str(html_path), "--workers", "2"]) == 0
        html = html_path.read_text()
        out[name] = {"html": html, "text": _text(html), "path": html_path,
                     "run": cli_json(["run", scenario, *flags, "--json"]),
                     "memory": cli_json(["memory", scenario, *flags, "--json"])}
    return out


SEAMS = (
    (r"64-GPU", "the old worksheet's GPU count"),
    (r"\b1 (GPUs|nodes|stages|calls|micro-batches|NICs|sequences|layers|steps|chunks)\b", "a plural after 1"),
    (r"(?<![\w.-])\d+[a-z]{2,}", "a number run into a word"),
    (r"  ", "a double space"),
    (r" [,.;:](?!\d)", "a space before punctuation"),
    (r"[;,:]\s*[;,.:]", "punctuation run together"),
    (r"\(\s*\)|\( | \)", "an empty or padded parenthesis"),
    (r"\bNone\b|\bnan\b|\binf\b|-0(\.0)?%", "a placeholder value"),
)


def seams(text: str) -> list[str]:
    found = []
    for line in text.splitlines():
        for pattern, what in SEAMS:
            for m in re.finditer(pattern, line):
                found.append(f"{what}: ...{line[max(0, m.start() - 40):m.end() + 40]}...")
    return found


@pytest.mark.parametrize("name", list(CASES))
def test_slow_memo_numbers_are_the_run_and_memory_reports(memos, name):
    memo = memos[name]
    parser = _Numbers()
    parser.feed(memo["html"])
    assert len(parser.nums) >= 15
    assert_numbers_match(parser.nums, {"run": memo["run"], "memory": memo["memory"]})
    assert [h for h in parser.h2 if h in WORKSHEET_HEADINGS] == list(WORKSHEET_HEADINGS)
    assert parser.h3 == list(PROMPTS)


@pytest.mark.parametrize("name", list(CASES))
def test_slow_memo_text_has_no_template_seams(memos, name):
    assert seams(memos[name]["text"]) == []


def _section(text: str, heading: str, until: str) -> str:
    return text.split(f"\n{heading}\n", 1)[1].split(f"\n{until}\n", 1)[0]


@pytest.mark.parametrize("name", list(CASES))
def test_slow_memo_says_what_the_layout_is_and_nothing_it_is_not(memos, name):
    memo = memos[name]
    text, run = memo["text"], memo["run"]
    lay = run["layout"]
    gpus = run["num_gpus"]
    nodes = gpus // GPUS_PER_NODE.get(name, 8)
    subtitle = re.search(r"\n([^\n]*the design worksheet answered by simulation\.)", text).group(1)
    assert ("one H100-SXM5-80GB GPU;" in subtitle if gpus == 1 else
            subtitle.startswith(f"{gpus:,} H100-SXM5-80GB GPUs in {nodes:,} node"))
    layout = f"TP{lay['tp']:,} PP{lay['pp']:,} DP{lay['dp']:,}"
    assert layout in subtitle and f"ZeRO-{lay['zero_stage']}" in subtitle
    checkpoint = _section(text, "Checkpoint strategy", "Prompts for final memo")
    pipeline = _section(text, "Pipeline bubble and microbatching", "Checkpoint strategy")
    parallel = _section(text, "Parallelism choice", "Communication map")
    comm = _section(text, "Communication map", "Pipeline bubble and microbatching")
    if lay["pp"] == 1:
        assert "no pipeline" in subtitle and "pipeline schedule" not in subtitle
        assert "closed form" not in text and "stage boundaries" not in text and "Bubble (" not in pipeline
        assert "Idle" in text.split("Cluster topology")[0] and "Bubble\n" not in text.split("Cluster topology")[0]
    else:
        assert f"{lay['pipeline_schedule']} pipeline schedule" in subtitle
        assert "closed form" in pipeline and "activations cross stage boundaries" in parallel
    if lay["tp"] == 1:
        assert "layer-internal" not in text and "There is no TP" in text
    else:
        assert "layer-internal" in parallel
    if nodes == 1:
        assert "none in use: one node" in text and "instead of" not in checkpoint
        assert "Sharded: time lost" not in checkpoint
    else:
        c = re.search(r"takes ([\d.,]+ \w+) with the ([\d,]+) nodes writing at once, instead of ([\d.,]+ \w+)",
                      checkpoint)
        assert c and c.group(2) == f"{nodes:,}" and c.group(1) != c.group(3)
        assert checkpoint.split("Full or sharded checkpoint")[1].lstrip(": \n").startswith("sharded")
    if gpus == 1:
        assert "moves no data between GPUs (one GPU)" in comm and "No collective at all: one GPU moves no data" in text
        assert "Not used by this layout" not in comm
    else:
        hot = run["comm_map"]["most_exposed"]
        calls = int(run["comm_map"]["kinds"][hot]["calls"])
        assert hot and f"{calls:,} call{'s' if calls != 1 else ''} of " in text  # the hottest-collective answer
    if run["model_params"]["total"] != run["model_params"]["active"]:  # MoE
        assert f"experts over EP {lay['ep']}" in parallel and "MoE all-to-all (all_to_all)" in comm
    else:
        assert "dense model: no experts" in parallel and "MoE all-to-all" not in comm.split("Not used")[0]
    if lay["zero_stage"] == 3:
        assert f"shards all model states over DP x CP = {lay['dp']:,}" in parallel


def test_slow_memos_render_in_headless_chromium(memos):
    from browser import find_chromium, inspect_page, require_browser

    if find_chromium() is None:
        if require_browser():
            pytest.fail("STEPSIM_REQUIRE_BROWSER=1 but no Chromium found (apt-get install chromium)")
        pytest.skip("Chromium is not installed (.ci/run installs it; apt-get install chromium)")
    for name, memo in memos.items():
        page = inspect_page(memo["path"])
        assert page["errors"] == [], name
        dom = page["dom"]
        assert dom["answers"] == list(PROMPTS), name
        assert dom["images"] == [True, True, True], name
        body = dom["body"]
        assert seams(body) == [], name
        step = memo["run"]["step_time_s"]
        assert (f"{step * 1e3:.2f} ms" if step < 1 else f"{step:.3f} s") in body, name
