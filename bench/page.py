"""`python -m bench.page [--runs 3]`: the status page on a lane of 5,000 models, in headless
Chromium — the page test's own measure (`tests/test_page_responsive.py`, the 5,000-model test),
run `--runs` times: the first paint of the lanes table after navigation, the sidecar's share of it
(building a 1.6 MB `/v1/lanes`), and the main thread's long tasks (over 50 ms, Chromium's
`PerformanceObserver('longtask')`) through about 12 s of refreshes, keys typed, a held "Switch
off" press and a turned page. Writes bench/results/page-DATE.json. Loopback only; needs Debian's
chromium (`make browser`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import peers, publish

ROOT = Path(__file__).resolve().parent.parent
TEST = "tests/test_page_responsive.py::test_five_thousand_models_are_drawn_a_page_at_a_time"


def one_run() -> dict[str, Any]:
    """The test once, its figures read from the file it writes (`LANES_PAGE_FIGURES`)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        env = {**os.environ, "LANES_PAGE_FIGURES": str(out)}
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", TEST]
        subprocess.run(command, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
        figures: dict[str, Any] = json.loads(out.read_text())
        return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    head = peers.commit()  # when the run starts: what it measures
    runs = [one_run() for _ in range(parser.parse_args().runs)]
    date = dt.datetime.now(dt.UTC).date().isoformat()  # wall-clock: the result file's date
    result = {"date": date, "models": 5000, "runs": runs}
    path = publish.result_path(ROOT / "bench" / "results", f"page-{date}", head)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(path)
    for run in runs:
        print(run)


if __name__ == "__main__":
    main()
