"""`bench/publish.py`: a run's sections put into docs/benchmarks.md lose nothing that was there —
what they replace goes to the history page — and the page is what its results render."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench import agentreport, publish, report, sections
from helpers import examples

ROOT = Path(__file__).resolve().parent.parent
HEADINGS = ["## Alpha", "## Alpha: 3 runs", "## Beta (2 s)", "## Beta (3 s)", "## Gamma, by hand"]
BODY = st.lists(
    st.sampled_from(["", "text", "| 1 | 2 |", "### an earlier run", "more"]), max_size=4
)
SECTIONS = st.lists(st.tuples(st.sampled_from(HEADINGS), BODY), max_size=6)


def flat(preamble: list[str], sections: Sequence[tuple[str, list[str]]]) -> list[str]:
    return [*preamble, *(line for heading, body in sections for line in (heading, *body))]


def holds(page: list[str], block: list[str]) -> bool:
    n = len(block)
    return any(page[i : i + n] == block for i in range(len(page) - n + 1))


def trimmed(lines: list[str]) -> list[str]:
    return "\n".join(lines).rstrip().split("\n") if "".join(lines).strip() else []


@given(st.tuples(BODY, SECTIONS), st.tuples(BODY, SECTIONS), st.booleans())
@settings(max_examples=examples(300))
def test_a_section_replaced_is_kept_and_every_other_stays(old, new, with_preamble):
    """Every section of the old page is on the new one (not written by the run, or written the
    same) or among those replaced; every section the run writes is on the page once; publishing
    the same again changes nothing and replaces nothing."""
    old_page = flat(*old)
    fresh = {publish.key(h): [h, *body] for h, body in new[1]}
    if with_preamble:
        fresh = {"": new[0], **fresh}
    result = publish.publish(list(fresh.items()), old_page)
    for k, lines in publish.sections(old_page):
        if not trimmed(lines):
            continue  # nothing to keep
        if k not in fresh or trimmed(lines) == trimmed(fresh[k]):
            assert holds(result.page, fresh.get(k, lines))
        else:  # the preamble is the run's alone
            assert (lines in result.replaced) == (k != "")
    keys = [k for k, _ in publish.sections(result.page)]
    for k, lines in fresh.items():
        assert holds(result.page, lines)
        assert keys.count(k) == 1
    # the old page's sections keep their order; a new one follows the run's section before it
    olds = [k for k, _ in publish.sections(old_page)]
    once = [k for i, k in enumerate(olds) if k not in fresh or k not in olds[:i]]
    assert [k for k in keys if k in olds] == once
    run = ["", *(k for k in fresh if k)]
    for before, k in zip(run, run[1:], strict=False):
        if k not in olds:
            assert keys.index(k) == keys.index(before) + 1
    again = publish.publish(list(fresh.items()), result.page)
    assert again.page == result.page and again.replaced == []


def test_a_sections_name_is_its_title_without_its_figures():
    assert publish.key("## Thundering herd: 200 clients, 429") == "Thundering herd"
    assert publish.key("## The status page on 5,000 models") == publish.key(
        "## The status page on 20,000 models"
    )
    assert publish.key("## Agent-sized requests: lanes beside") != publish.key(
        "## Agent-sized requests, earlier runs"
    )


def test_a_run_with_two_sections_of_one_name_is_refused():
    with pytest.raises(ValueError, match="two sections of one name"):
        publish.publish([("A", ["## A: 1"]), ("A", ["## A: 2"])], ["# P"])


def test_what_a_run_replaces_goes_to_the_top_of_the_history(tmp_path):
    page, history = tmp_path / "benchmarks.md", tmp_path / "benchmarks-history.md"
    page.write_text("# B\n\n## Hot: 1\n\nfirst\n\n## By hand\n\nkept\n")
    publish.write([("Hot", ["## Hot: 2", "", "second", ""])], page, history, "2026-12-05")
    publish.write([("Hot", ["## Hot: 3", "", "third", ""])], page, history, "2026-12-06")
    publish.write([("Hot", ["## Hot: 3", "", "third", ""])], page, history, "2026-12-07")
    assert page.read_text() == "# B\n\n## Hot: 3\n\nthird\n\n## By hand\n\nkept\n"
    text = history.read_text()
    assert text.startswith("\n".join(publish.HISTORY_HEAD))
    assert "2026-12-07" not in text  # the same section again replaces nothing
    later, earlier = text.index("run of 2026-12-06"), text.index("run of 2026-12-05")
    assert later < text.index("### Hot: 2") < earlier < text.index("### Hot: 1")
    assert sorted(p.name for p in tmp_path.iterdir()) == [history.name, page.name]  # no part file


def test_the_history_keeps_its_head_as_edited_and_an_empty_one_gets_one(tmp_path):
    page, history = tmp_path / "benchmarks.md", tmp_path / "benchmarks-history.md"
    page.write_text("# B\n\n## Hot: 1\n\nfirst\n")
    history.write_text("# Edited\n\nby hand\n\n## Replaced by the run of 2026-12-01\n\nold\n")
    publish.write([("Hot", ["## Hot: 2", "", "second"])], page, history, "2026-12-05")
    assert history.read_text().startswith(
        "# Edited\n\nby hand\n\n## Replaced by the run of 2026-12-05\n\n### Hot: 1\n\nfirst\n"
    )
    history.write_text("")
    publish.write([("Hot", ["## Hot: 3", "", "third"])], page, history, "2026-12-06")
    assert history.read_text().startswith("\n".join(publish.HISTORY_HEAD))
    assert "### Hot: 2" in history.read_text()


def test_a_run_never_writes_over_another_runs_figures(tmp_path):
    first = publish.result_path(tmp_path, "agent-2026-12-04", "abc1234")
    assert first.name == "agent-2026-12-04.json"
    first.write_text("{}")
    second = publish.result_path(tmp_path, "agent-2026-12-04", "abc1234")
    second.write_text("{}")
    third = publish.result_path(tmp_path, "agent-2026-12-04", "abc1234")
    assert [second.name, third.name] == [
        "agent-2026-12-04-abc1234.json",
        "agent-2026-12-04-abc1234-2.json",
    ]


def test_the_page_is_what_its_results_render():
    """docs/benchmarks.md rendered again from the run it names (and the newest runs of the benches
    that run on their own) is the page as it is: no figure on it is from a file that says
    otherwise, and `make bench` would drop no word written beside the figures it keeps."""
    page = (ROOT / "docs" / "benchmarks.md").read_text().split("\n")
    [source] = [m[1] for line in page if (m := re.match(r"Raw numbers: `([^`]+)`", line))]
    chart = (
        "benchmarks-throughput.png" if "![throughput](benchmarks-throughput.png)" in page else None
    )
    data = json.loads((ROOT / source).read_text())
    lines = report.render(data, ROOT / source, chart)
    result = publish.publish(publish.sections(lines), page)
    assert result.replaced == [] and result.page == page
    # the sections a run of their own wrote, from the file each names
    on_page = dict(publish.sections(page))
    for render, key in (
        (agentreport.section, "Agent-sized requests"),
        (sections.hot_section, "The hot path"),
    ):
        [named, *_] = re.findall(r"`(bench/results/[^`]+\.json)`", "\n".join(on_page[key]))
        section = render(json.loads((ROOT / named).read_text()))
        assert publish.key(section[0]) == key  # rendered from the file, not empty
        assert publish.publish(publish.sections(section), page).page == page
