"""The documentation's Python examples run as written: README's library example on a fresh
machine (no config, no key, no network), and each client example of README and of the sidecar
page (docs/sidecar.md) against `lanes serve --simulate`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lanes.testing import ANSWER

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
SIDECAR = (ROOT / "docs" / "sidecar.md").read_text()


def blocks(section: str, page: str = README) -> list[str]:
    """The ```python blocks of a page's section (from its heading to the next of its level)."""
    start = page.index(section)
    level = section.split(" ")[0]
    rest = page[start + len(section) :]
    end = re.search(rf"^{level} ", rest, re.MULTILINE)
    body = rest[: end.start()] if end else rest
    return re.findall(r"```python\n(.*?)```", body, re.DOTALL)


def run(code: str, cwd: Path, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_API_KEY", "_TOKEN"))}
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


#: Runs each example (a JSON list on stdin) as a script of its own — a fresh `__main__`
#: namespace, its output captured apart — in one interpreter: five interpreters importing the
#: OpenAI and Anthropic SDKs cost ten seconds of CPU. An example that leans on a name it does not
#: import or define still fails (NameError), as it would alone.
EACH_AS_MAIN = """
import contextlib, io, json, sys, traceback
said = []
for code in json.load(sys.stdin):
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, "<example>", "exec"), {"__name__": "__main__"})
        said.append({"stdout": out.getvalue(), "error": None})
    except BaseException:
        said.append({"stdout": out.getvalue(), "error": traceback.format_exc()})
print(json.dumps(said))
"""


@pytest.mark.slow
def test_the_python_example_runs_on_a_fresh_machine(tmp_path):
    """The library example, in an empty directory with no provider keys: answers, a stream, and
    vectors, from the simulated providers in-process."""
    [example] = blocks("## Use it from Python")
    done = run(example, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(ANSWER) == 3  # the reply, the stream, complete_sync
    assert "2 vectors from local" in done.stdout


@pytest.mark.slow
def test_the_client_examples_run_against_the_simulator(simulated, tmp_path):
    """Every client example of the sidecar page (chat, Responses, Messages, Gemini, embeddings and
    models) and README's own runs as written against `lanes serve --simulate`."""
    examples = [
        *blocks("## Use it as a sidecar"),
        *re.findall(r"```python\n(.*?)```", SIDECAR, re.S),
    ]
    # README's chat; the page's chat, Responses, Messages, Gemini, embeddings and models
    expected = [ANSWER, ANSWER, ANSWER, ANSWER, ANSWER, "2 "]
    assert len(examples) == len(expected)
    base = simulated.removesuffix("/v1")
    assert all("http://127.0.0.1:4098" in example for example in examples)
    sent = [example.replace("http://127.0.0.1:4098", base) for example in examples]
    done = run(EACH_AS_MAIN, tmp_path, stdin=json.dumps(sent))
    assert done.returncode == 0, done.stderr
    for example, says, ran in zip(examples, expected, json.loads(done.stdout), strict=True):
        assert ran["error"] is None, f"{example}\n{ran['error']}"
        assert says in ran["stdout"], example


@pytest.mark.parametrize("section", ["## Use it from Python", "## Use it as a sidecar"])
def test_the_examples_are_found(section):
    """The sections the tests above read exist and hold Python examples (a renamed heading would
    otherwise pass silently)."""
    assert blocks(section)
