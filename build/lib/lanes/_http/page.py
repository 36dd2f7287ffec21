"""The status page as a console: one self-contained HTML document, no build step, no CDN, no
external asset of any kind (the icon is an inline data URL, the charts are SVG drawn by the page).

It is written as package data beside this module — `page.html` (the markup), `page.css`,
`page.js` (the console) and `charts.js` (the report's charts) — and served as one document with
the style and the script inline. Its `Content-Security-Policy` allows exactly that style and that
script (by their SHA-256), requests to the sidecar itself and nothing else: no other origin, no
inline handler, no plugin, no frame.

Every state-changing request the page makes goes through one helper, `send(method, path, body)`:
JSON with `Content-Type: application/json`, and — when an admin key was entered in the page's key
field — `Authorization: Bearer <key>`. The key is kept in sessionStorage (gone with the tab),
never in a URL; the views are read with it too (client keys configured: they need a key).
The kill-switch buttons, the approval buttons and the grants' Revoke buttons all use it.
"""

from __future__ import annotations

import base64
import hashlib
from importlib import resources


def _asset(name: str) -> str:
    return resources.files("lanes._http").joinpath(name).read_text(encoding="utf-8")


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


STYLE = _asset("page.css")
SCRIPT = _asset("charts.js") + _asset("page.js")
PAGE = (
    _asset("page.html")
    .replace("<style></style>", f"<style>{STYLE}</style>", 1)
    .replace("<script></script>", f"<script>{SCRIPT}</script>", 1)
)
PAGE_HEADERS = {
    "Content-Security-Policy": "; ".join(
        (
            "default-src 'none'",
            f"script-src {_sha256(SCRIPT)}",
            f"style-src {_sha256(STYLE)}",
            "connect-src 'self'",
            "img-src data:",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        )
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",  # for browsers that predate frame-ancestors: no clickjacking
    "Referrer-Policy": "no-referrer",
}
