"""Putting a bench run's sections into docs/benchmarks.md without losing what was there.

The page is a preamble and `## ` sections. A run writes the sections it has figures for; each
takes the place of the page's section of the same name (its heading without its figures: see
`key`), and the section it replaces, when it differs, moves whole to
docs/benchmarks-history.md, newest first — with the notes written beside its figures, which were
about them. A section the run does not write — one written by hand, such as a bench's earlier
runs, or one of a bench this run did not run — stays where it is. So `make bench` never drops a
published measurement, nor a word said about it. The preamble, which names the run, is the run's
alone: it is replaced and not kept (a test holds the page's to what its run renders, so no word
written there by hand gets past CI).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

import attrs

HISTORY_HEAD = [
    "# Benchmarks: figures a later run replaced",
    "",
    "Sections of [the benchmarks page](benchmarks.md) as they were before a later run of the same "
    "bench replaced them, newest first, with the notes written beside them. `make bench` (and each "
    "bench's `--docs`) moves a section here when it writes a different one in its place "
    "(`bench/publish.py`); nothing here is written again.",
    "",
]

Section = tuple[str, list[str]]


def key(heading: str) -> str:
    """A section's name: its heading's title before any figures — "## Thundering herd: 200
    clients, …" and "## Thundering herd: 300 clients, …" are one section; the preamble's is ""."""
    title = heading.removeprefix("## ").split(" (")[0].split(":")[0]
    return re.sub(r"\d[\d,.]*", "#", title).strip()


def sections(lines: Sequence[str]) -> list[Section]:
    """The page's sections in order, each (key, its lines), the preamble (maybe empty) first."""
    out: list[Section] = [("", [])]
    for line in lines:
        if line.startswith("## "):
            out.append((key(line), []))
        out[-1][1].append(line)
    return out


@attrs.frozen
class Published:
    page: list[str]  # the page's lines with the run's sections in place
    replaced: list[list[str]]  # each section the run's took the place of, as it was


def publish(new: Sequence[Section], old: Sequence[str]) -> Published:
    """`old`'s page with `new`'s sections (each (key, lines); the preamble's key is "") in place
    of its sections of the same key, in `old`'s order; a section `old` has not follows the new
    section before it. The sections replaced, where different, are returned as they were — but
    the preamble, which only a run writes (a test holds the page's to what its run renders).
    Raises ValueError when `new` has two sections of one name."""
    new = [(k, lines) for k, lines in new if k or lines]  # no preamble: the page's stays
    fresh = dict(new)
    order = [k for k, _ in new]
    if len(fresh) != len(order):
        raise ValueError(
            f"two sections of one name: {sorted(k for k in fresh if order.count(k) > 1)}"
        )
    have = {k for k, _ in sections(old)}
    after: dict[str, list[str]] = {}
    for i, k in enumerate(order):
        if k not in have:
            anchor = next((p for p in reversed(order[:i]) if p in have), "")
            after.setdefault(anchor, []).append(k)
    page: list[str] = []
    replaced: list[list[str]] = []
    placed: set[str] = set()
    for k, lines in sections(old):
        if k in fresh:
            if k and _trimmed(lines) and _trimmed(lines) != _trimmed(fresh[k]):
                replaced.append(lines)
            if k not in placed:  # a second section of the name goes with the first
                page += fresh[k]
                placed.add(k)
        else:
            page += lines
        for extra in after.pop(k, []):
            page += fresh[extra]
    return Published(page, replaced)


def _trimmed(lines: Sequence[str]) -> list[str]:
    out = list(lines)
    while out and not out[-1].strip():
        out.pop()
    return out


def result_path(results: Path, stem: str, commit: str) -> Path:
    """Where a run's figures go: `<stem>.json` (such as `agent-2026-12-04`), or, where a run of
    that day is there already, `<stem>-<commit>.json`, then `<stem>-<commit>-2.json`, …: a run
    never writes over the figures of another, which a page may show."""
    for name in (stem, f"{stem}-{commit}", *(f"{stem}-{commit}-{n}" for n in range(2, 1000))):
        if not (path := results / f"{name}.json").exists():
            return path
    raise FileExistsError(f"{results}: a thousand runs of {stem} at {commit}")


def write(new: Sequence[Section], page: Path, history: Path, when: str) -> Published:
    """Publish `new` into `page` (a file; absent: empty), and put what it replaced at the top of
    `history` (before its first entry) under a line saying `when` (the run's date), each section
    demoted a level. The history is written first, and each file whole or not at all."""
    old = page.read_text().split("\n") if page.exists() else []
    result = publish(new, old)
    if result.replaced:
        text = history.read_text() if history.exists() else ""
        kept = text.split("\n") if text.strip() else list(HISTORY_HEAD)
        head = next((i for i, line in enumerate(kept) if line.startswith("## ")), len(kept))
        entry = [f"## Replaced by the run of {when}", ""]
        for lines in result.replaced:
            entry += [f"#{line}" if line.startswith("#") else line for line in _trimmed(lines)]
            entry.append("")
        _replace(history, [*kept[:head], *entry, *kept[head:]])
    _replace(page, result.page)
    return result


def _replace(path: Path, lines: Sequence[str]) -> None:
    """Write `path` whole: a new file renamed over the old one."""
    part = path.with_name(f".{path.name}.part")
    part.write_text("\n".join(lines))
    os.replace(part, path)
