"""A readable summary of py-spy's collapsed stacks (`py-spy record --format raw --nolineno`).

Three views of the same samples (py-spy leaves idle samples out, so these are shares of CPU):

- **by layer**: each sample goes to the innermost frame of a layer we can name — the httpx2 client
  (httpx2, httpcore2), the server (hypercorn, h11), starlette, lanes — so trio and the standard
  library count for the layer that called them; samples under none of them are "trio / other";
- **self**: the functions the samples were in (the leaf frame);
- **inclusive**: the functions on the stack, counted once per sample.
"""

from __future__ import annotations

import re
from collections import Counter

_FRAME = re.compile(r"^(?P<name>.*) \((?P<file>[^()]*)\)$")
LAYERS = (
    ("httpx2 client", ("httpx2/", "httpcore2/")),
    ("hypercorn / h11", ("hypercorn/", "h11/")),
    ("starlette", ("starlette/",)),
    ("lanes", ("lanes/",)),
)


def _frames(stack: str) -> list[tuple[str, str]]:
    out = []
    for part in stack.split(";"):
        match = _FRAME.match(part.strip())
        if match:
            out.append((match["name"], match["file"]))
    return out


def _layer(frames: list[tuple[str, str]]) -> str:
    for name, file in reversed(frames):
        if name == "unrolled_run":  # trio's scheduler: what calls it is no layer's work
            break
        for layer, marks in LAYERS:
            if any(file.startswith(mark) or "/" + mark in file for mark in marks):
                return layer
    return "trio / other"


def _short(file: str) -> str:
    for mark in ("site-packages/", "/lib/python3.11/", "/wt-hot/", "/work/"):
        if mark in file:
            return file.split(mark, 1)[1]
    return file


def summarise(raw: str, *, header: str = "", top: int = 30) -> str:
    layers: Counter[str] = Counter()
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = _frames(stack)
        if not frames:
            continue
        total += count
        layers[_layer(frames)] += count
        name, file = frames[-1]
        own[f"{name} ({_short(file)})"] += count
        for key in {f"{n} ({_short(f)})" for n, f in frames}:
            inclusive[key] += count
    if not total:
        return header + "\nno samples\n"

    def pct(n: int) -> str:
        return f"{100 * n / total:5.1f} %"

    lines = [header, f"{total} samples", "", "by layer (innermost named layer on the stack):"]
    lines += [f"  {pct(n)}  {layer}" for layer, n in layers.most_common()]
    lines += ["", f"self (top {top}):"]
    lines += [f"  {pct(n)}  {key}" for key, n in own.most_common(top)]
    lines += ["", f"inclusive (top {top}):"]
    lines += [f"  {pct(n)}  {key}" for key, n in inclusive.most_common(top)]
    lanes_only = [
        (k, n) for k, n in inclusive.most_common() if k.split("(", 1)[1].startswith("lanes/")
    ]
    lines += ["", f"inclusive, lanes' own functions (top {top}):"]
    lines += [f"  {pct(n)}  {key}" for key, n in lanes_only[:top]]
    return "\n".join(lines) + "\n"
