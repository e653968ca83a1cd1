"""``stepsim ... --json`` run in-process, for tests whose module-scoped fixtures cannot take capsys."""

import contextlib
import io
import json

from simulator.cli import main


def cli_json(args: list[str]) -> dict:
    """The parsed JSON ``stepsim args`` prints; the command must exit 0."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(args) == 0
    return json.loads(buf.getvalue())
