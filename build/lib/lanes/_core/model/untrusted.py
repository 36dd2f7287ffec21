"""What an upstream says, made fit to show. Pure.

Every string that comes from an upstream — an error's message and `code` (on every path: a non-2xx
body, an error inside a 200, an error event in a stream), a transport error's text, a header
quoted in a message, a catalog's model id — passes through `shown()` where it enters, before it
can reach a client, a log line, the audit or a page:

1. it is cut to a bounded size first, so the work is bounded whatever was sent;
2. each known secret — the lane's key, the request's own key (bring your own key) — is replaced by
   `[redacted]`, as sent and in its escaped forms;
3. control characters are taken out: ANSI CSI and OSC escape sequences whole, every other C0 or C1
   control, bidi override and other invisible format character too, and any run of whitespace
   (CR and LF included) becomes one space — so nothing from outside forges a log line or a
   terminal, and a key split by one is whole again for step 2, which runs once more;
4. anything key-shaped is replaced by `[redacted]` (`keylike`);
5. at most `limit` characters are kept.

The key shapes are for upstream strings only: lanes' own text (its request ids are `uuid4().hex`,
32 hex characters) never goes through them. What is key-shaped is a run of at least 20 letters,
digits, `-` and `_` that holds one of:

- a segment (between `-` and `_`) of 20+ letters and digits that reads as random: digits among
  letters (hex and alphanumeric keys, 32–64 characters), or both cases in a fair share
  (letters-only keys);
- a short lower-case vendor prefix, then a segment of 20+ letters and digits (`sk-…`, `gsk_…`,
  `csk-…`, `hf_…` and the like);
- 40+ characters with digits and both cases and few separators (base64url keys, `sk-ant-…`);
- Google's shape, `AIza` and 31+ more.

Model ids (`gpt-4o-mini-2024-07-18`, `text-embedding-3-small`), error codes
(`rate_limit_exceeded`), UUIDs, dates and plain words are not key-shaped: their segments are short,
or not random. A known key of any shape (a UUID included) is redacted by value.
"""

from __future__ import annotations

# lanes: pure
import re
from collections.abc import Iterable
from urllib.parse import quote

REDACTED = "[redacted]"
MAX_MESSAGE = 300  # characters of an upstream's error message kept
MAX_CODE = 64  # characters of an upstream's error code kept
_OVERSCAN = 4  # characters read per character kept (whitespace and escapes collapse)
_MIN_SECRET = 4  # shorter "secrets" would mangle ordinary text

# ESC [ … final byte (CSI); ESC ] … BEL or ESC \ (OSC, also DCS/PM/APC strings); any other ESC
# sequence of one character; and their 8-bit forms (0x9b CSI, 0x9d OSC, 0x90/0x9e/0x9f strings).
_ESCAPES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|(?:\x1b[\]PX^_]|[\x9d\x90\x98\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -~]?"
)
_WHITESPACE = re.compile(r"\s+")
_TOKEN = re.compile(r"(?<![A-Za-z0-9_\-])[A-Za-z0-9_\-]{20,}(?![A-Za-z0-9_\-])")
_SEPARATORS = re.compile(r"[-_]")
_PREFIX = re.compile(r"[a-z]{2,5}")
_BEARER = re.compile(r"(?i)\bBearer\s+\S+")


def forms(secret: str) -> set[str]:
    """`secret` as an upstream may echo it: as sent, escaped, and URL-encoded (empty when it is
    too short to redact without mangling ordinary text)."""
    if len(secret) < _MIN_SECRET:
        return set()
    return {
        secret,
        secret.encode("unicode_escape").decode("ascii", "replace"),
        quote(secret, safe=""),
    }


def known_forms(secrets: Iterable[str]) -> tuple[str, ...]:
    """Every form of each of `secrets` (see `forms`), longest first: what is replaced."""
    return tuple(sorted({f for s in secrets if s for f in forms(s)}, key=len, reverse=True))


def holds_key(text: str, known: tuple[str, ...]) -> bool:
    """Whether `text` (printable already, such as a catalog's model id) holds one of the `known`
    forms (`known_forms`) or anything key-shaped: what `shown` would redact."""
    return any(k in text for k in known) or any(keylike(t) for t in _TOKEN.findall(text))


def shown(value: object, secrets: Iterable[str] = (), *, limit: int = MAX_MESSAGE) -> str:
    """`value` (an upstream's string, or anything it sent where one was expected) as it may be
    shown: bounded, without known secrets, control characters or anything key-shaped, at most
    `limit` characters."""
    # (one character over what is read, so a text made of a value is cut like a string)
    text = value if isinstance(value, str) else _text(value, limit * _OVERSCAN + 1)
    known = known_forms(secrets)
    if len(text) > limit * _OVERSCAN:
        # what is cut off is never seen; a key cut in two must not leave its first half behind:
        # the last word before the cut goes too
        head = text[: limit * _OVERSCAN].rsplit(None, 1)
        text = head[0] if len(head) == 2 else ""
    text = _without(text, known)
    text = _ESCAPES.sub("", text)
    if not text.isprintable():
        text = "".join(c for c in text if c.isprintable() or c.isspace())
    text = _WHITESPACE.sub(" ", text).strip()
    text = _without(text, known)  # a key that a control character split in two is whole again
    text = _BEARER.sub(f"Bearer {REDACTED}", text)
    text = _TOKEN.sub(lambda m: REDACTED if keylike(m.group()) else m.group(), text)
    return text[:limit].rstrip()


def _text(value: object, size: int) -> str:
    """Something that is not a string (a number, a list, an object) as bounded text."""
    try:
        text = str(value)
    except Exception:  # a value whose str() fails is not worth showing
        return ""
    return text[:size]


def _without(text: str, known: tuple[str, ...]) -> str:
    for secret in known:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def keylike(token: str) -> bool:
    """Whether a run of letters, digits, `-` and `_` (20+ characters) reads as a key."""
    if token.startswith("AIza") and len(token) >= 35:
        return True
    segments = _SEPARATORS.split(token)
    long = [s for s in segments if len(s) >= 20]
    if any(_random(s) for s in long):
        return True
    if long and _PREFIX.fullmatch(segments[0]):
        return True  # a vendor prefix, then a long body
    return (
        len(token) >= 40
        and (len(segments) - 1) * 10 <= len(token)
        and any(c.isdigit() for c in token)
        and any(c.isupper() for c in token)
        and any(c.islower() for c in token)
    )


def _random(segment: str) -> bool:
    """Letters and digits that read as random: digits among letters, or both cases in a fair
    share (a camel-case word has one capital per word, a random string one in two)."""
    digits = sum(c.isdigit() for c in segment)
    upper = sum(c.isupper() for c in segment)
    lower = len(segment) - digits - upper
    if digits and digits < len(segment):
        return True
    return min(upper, lower) * 5 >= len(segment)
