"""The reference pages, generated from the code so they cannot drift from it.

`python docs/gen_reference.py` rewrites the generated blocks of docs/reference/config.md (from the
attrs classes of the config), docs/reference/cli.md (from the `lanes` command's argparse parser)
and docs/reference/lanes.md (from the lane modules' `PROVIDER`s and docstrings); `--check` writes
nothing and exits 1 naming the pages that differ. `make docs` runs it
before building, and tests/test_docs.py fails when a committed page is not what it writes now.

A page is prose written by hand around blocks the generator owns:

    <!-- generated: [lanes.breaker] -->
    (the table, rewritten on every run)
    <!-- end generated -->

On the config page a block names a TOML table as a file writes it (`[policy]`, `[[lanes]]`,
`[server.clients.NAME]`, `[lanes.free_tier] kind = "credits"`), or `top level`, or
`free-tier kinds`; every table the walk finds must have its block, and a block naming no table is
an error. The CLI page has one block, `lanes`: every subcommand with its arguments (and each action
of one that has actions, `lanes batch submit`, a level down). The lanes
page has one block, `lanes`: a row for every lane module the loader finds in `lanes/` (its
provider, default free-tier kind and limits, key variable, and its docstring's first paragraph).

A config key's description lives with its field: the `#:` comment lines right above it (Markdown;
links relative to docs/). A `#: default: …` line among them says the default in words where the
field's own (unset) would mislead, e.g. a value the lane module supplies.

This is a script beside the pages rather than a module of `lanes`: it is for the docs build and
its test, and every folder of the package is a layer that would have to hold it.
"""

from __future__ import annotations

import argparse
import ast
import ipaddress
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python docs/gen_reference.py` from a checkout
    sys.path.insert(0, str(ROOT))

import attrs  # noqa: E402

from lanes._cli import _parser  # noqa: E402
from lanes._core.config.schema import Config, LaneConfig  # noqa: E402
from lanes._core.freetier.kinds import KINDS  # noqa: E402
from lanes._core.upstream.loader import find_module, shipped_lane_modules  # noqa: E402
from lanes._core.upstream.spec import Provider  # noqa: E402

CONFIG_PAGE = ROOT / "docs" / "reference" / "config.md"
CLI_PAGE = ROOT / "docs" / "reference" / "cli.md"
LANES_PAGE = ROOT / "docs" / "reference" / "lanes.md"
BLOCK = re.compile(r"(<!-- generated: (.+?) -->\n)(.*?)(<!-- end generated -->)", re.DOTALL)
COMMAND = "python docs/gen_reference.py"


@attrs.frozen(kw_only=True)
class Table:
    """One TOML table of the config: its header as a file writes it, and the class read from it."""

    header: str
    cls: type
    #: the kind a free-tier table is read as (its `kind` key picks the class), else None
    kind: str | None = None


@attrs.frozen(kw_only=True)
class Key:
    """One key of a table, as the reference shows it."""

    name: str
    type: str
    default: str
    doc: str


def tables(cls: type = Config, path: str = "", header: str = "top level") -> list[Table]:
    """`cls`'s table and every table below it, walking the fields' annotations (in a list, a
    dict, an optional or a union of free-tier kinds), in field order."""
    found = [Table(header=header, cls=cls, kind=kind_of(cls))]
    hints = typing.get_type_hints(cls)
    for field in attrs.fields(cls):
        here = f"{path}.{field.name}" if path else field.name
        for shape, inner in nested(hints[field.name]):
            if shape == "array":
                found += tables(inner, here, f"[[{here}]]")
            elif shape == "map":
                found += tables(inner, f"{here}.NAME", f"[{here}.NAME]")
            elif (kind := kind_of(inner)) is not None:
                found += tables(inner, here, f'[{here}] kind = "{kind}"')
            else:
                found += tables(inner, here, f"[{here}]")
    return found


def nested(hint: Any) -> Iterator[tuple[str, type]]:
    """The attrs classes a field's annotation holds: ("table", C) for C or a union member,
    ("array", C) for a list of C, ("map", C) for a dict whose values are C."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            yield from nested(arg)
    elif origin in (list, tuple) and args and attrs.has(args[0]):
        yield "array", args[0]
    elif origin is dict and attrs.has(args[1]):
        yield "map", args[1]
    elif isinstance(hint, type) and attrs.has(hint):
        yield "table", hint


def kind_of(cls: type) -> str | None:
    """A free-tier kind's name (its `kind` field's one value), or None for any other table."""
    names = {field.name: field for field in attrs.fields(cls)}
    field = names.get("kind")
    return field.default if field is not None and isinstance(field.default, str) else None


def comments(cls: type) -> dict[str, list[str]]:
    """Field name → the `#:` comment lines right above it in `cls`'s source (without `#:`)."""
    source = Path(sys.modules[cls.__module__].__file__ or "").read_text(encoding="utf-8")
    lines = source.splitlines()
    node = next(
        n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls.__name__
    )
    found: dict[str, list[str]] = {}
    for statement in node.body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            above: list[str] = []
            i = statement.lineno - 2
            while i >= 0 and lines[i].strip().startswith("#"):
                if lines[i].strip().startswith("#:"):
                    above.insert(0, lines[i].strip()[2:].strip())
                i -= 1
            found[statement.target.id] = above
    return found


def keys(table: Table) -> list[Key]:
    """The keys of `table`, in field order (a kind's `kind` left out: its header says it).
    Raises ValueError naming a field that has no `#:` description."""
    hints, docs = typing.get_type_hints(table.cls), comments(table.cls)
    out = []
    for field in attrs.fields(table.cls):
        if table.kind is not None and field.name == "kind":
            continue
        lines = docs.get(field.name, [])
        said = [line.removeprefix("default:").strip() for line in lines if is_default(line)]
        doc = " ".join(line for line in lines if not is_default(line))
        if not doc:
            raise ValueError(
                f"{table.cls.__module__}.{table.cls.__qualname__}.{field.name}: no description; "
                "write a `#:` comment above the field saying what the key does"
            )
        default = said[0] if said else shown_default(field)
        out.append(
            Key(name=field.name, type=toml_type(hints[field.name]), default=default, doc=doc)
        )
    return out


def is_default(line: str) -> bool:
    return line.startswith("default:")


def toml_type(hint: Any) -> str:
    """How a value of `hint` is written in TOML, in words: `integer`, `array of strings`, …"""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        if all(attrs.has(a) for a in members):
            return "table"
        return " or ".join(toml_type(a) for a in members)
    if origin is typing.Literal:
        return "one of " + ", ".join(f'`"{a}"`' for a in args)
    if origin in (list, tuple):
        return f"array of {plural(toml_type(args[0]))}"
    if origin is dict:
        return f"table of {plural(toml_type(args[1]))}"
    if isinstance(hint, type) and attrs.has(hint):
        return "table"
    names = {bool: "boolean", int: "integer", float: "number", str: "string"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))


def plural(word: str) -> str:
    if word.startswith(("array of", "table of", "one of")):
        return word.replace("array of", "arrays of", 1).replace("table of", "tables of", 1)
    return f"{word}s"


def shown_default(field: attrs.Attribute[Any]) -> str:
    """A field's default as TOML writes it: `required`, `unset`, a value, or `its defaults` for
    a table of its own."""
    default: Any = field.default
    if default is attrs.NOTHING:
        return "required"
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        default = default.factory()
    if attrs.has(type(default)):
        return "its defaults"
    text = f"`{toml_value(default)}`" if default is not None else "unset"
    if field.name.endswith("_bytes") and isinstance(default, int) and default % 1024 == 0:
        size = f"{default // 1024**2} MiB" if default % 1024**2 == 0 else f"{default // 1024} KiB"
        text += f" ({size})"
    return text


def toml_value(value: Any) -> str:
    """`value` as TOML writes it (numbers without a needless `.0`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        inner = ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items())
        return f"{{ {inner} }}" if inner else "{}"
    return str(value)


def cell(text: str) -> str:
    """Text fit for a table cell of a page in docs/reference/: pipes escaped, links to other
    pages (written relative to docs/) made relative to the page."""
    text = re.sub(r"\]\((?!https?:|#|/|\.\./)([^)]+)\)", r"](../\1)", text)
    return text.replace("|", "\\|")


def key_table(table: Table) -> str:
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for key in keys(table):
        rows.append(f"| `{key.name}` | {cell(key.type)} | {cell(key.default)} | {cell(key.doc)} |")
    return "\n".join(rows) + "\n"


def kinds_table(found: list[Table]) -> str:
    """The free-tier kinds: each one's `kind`, what it is (its class docstring), its keys."""
    rows = ["| `kind` | what it is | keys |", "|---|---|---|"]
    for table in found:
        if table.kind is None:
            continue
        doc = " ".join((table.cls.__doc__ or "").split("\n\n")[0].split())
        names = ", ".join(f"`{key.name}`" for key in keys(table)) or "—"
        rows.append(f'| `"{table.kind}"` | {cell(doc)} | {names} |')
    return "\n".join(rows) + "\n"


def config_blocks() -> dict[str, str]:
    """Block name → its generated text, for every block the config page must have."""
    found = tables()
    blocks = {t.header: key_table(t) for t in found if keys(t)}
    blocks["free-tier kinds"] = kinds_table(found)
    return blocks


def usage(name: str, parser: argparse.ArgumentParser) -> str:
    """`lanes NAME` and its arguments as argparse's usage line writes them, on one line (argparse
    wraps at the terminal's width; this page must not depend on it)."""
    parts = [f"lanes {name}"]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        shown = argument(action)
        if not action.option_strings:
            if action.nargs == "?":
                shown = f"[{shown}]"
            elif action.nargs == "*":
                shown = f"[{shown} ...]"
        else:
            shown = f"[{shown}]"
        parts.append(shown)
    return " ".join(parts)


def argument(action: argparse.Action) -> str:
    """An argument as usage writes it: `--port PORT`, `--json`, `{off,on}`, `MODEL`."""
    if action.metavar is not None:
        value = str(action.metavar)
    elif action.choices is not None:
        value = "{" + ",".join(map(str, action.choices)) + "}"
    else:
        value = action.dest if not action.option_strings else action.dest.upper()
    if not action.option_strings:
        return value
    flag = max(action.option_strings, key=len)
    return flag if action.nargs == 0 else f"{flag} {value}"


def meaning(action: argparse.Action) -> str:
    """An argument's help text, with its default when it has one worth saying."""
    said = [action.help] if action.help and action.help != argparse.SUPPRESS else []
    default = action.default
    if default not in (None, False, [], argparse.SUPPRESS) and action.nargs != 0:
        shown = " ".join(default) if isinstance(default, list) else str(default)
        said.append(f"default `{shown}`")
    return "; ".join(said) or "—"


def cli_blocks() -> dict[str, str]:
    """The `lanes` block: the command's own options, then each subcommand (in the order `lanes
    --help` lists them) with its help, its usage and a table of its arguments."""
    parser = _parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help or "" for a in commands._choices_actions}
    out = ["| option | meaning |", "|---|---|"]
    for action in parser._actions:
        if action.option_strings and not isinstance(action, argparse._HelpAction):
            out.append(f"| `{argument(action)}` | {cell(meaning(action))} |")
    out.append("")
    for name, sub in commands.choices.items():
        out += command_section(name, sub, helps.get(name, ""))
    return {"lanes": "\n".join(out)}


def command_section(name: str, parser: argparse.ArgumentParser, said: str) -> list[str]:
    """`lanes NAME`'s section: its help, its usage and a table of its arguments; then, for a
    command of actions (`lanes batch submit`, …), a section a level down for each."""
    level = "#" * (2 + len(name.split()))
    out = [f"{level} `lanes {name}`", "", cell(said), ""]
    out += ["```", usage(name, parser), "```", ""]
    arguments = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    if arguments:
        out += ["| argument | meaning |", "|---|---|"]
        out += [f"| `{argument(a)}` | {cell(meaning(a))} |" for a in arguments]
        out.append("")
    for action in arguments:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for inner, sub in action.choices.items():
                out += command_section(f"{name} {inner}", sub, helps.get(inner, ""))
    return out


def lane_modules() -> dict[str, tuple[Provider, str]]:
    """Every lane module shipped in `lanes/`, found as the loader finds them (a non-underscore
    module declaring a `PROVIDER`): name → its provider and its docstring. Raises ValueError for
    a module the loader can not load for any other reason (a broken import is not left out)."""
    found = {}
    for name in shipped_lane_modules():
        module, why = find_module(LaneConfig(name=name))
        if module is not None:
            found[name] = (module.PROVIDER, module.__doc__ or "")
        elif not why.endswith("declares no PROVIDER"):
            raise ValueError(f"lanes/{name}.py: {why}; fix it, or the lanes page leaves it out")
    return found


def per(unit: str) -> Callable[[Any], str]:
    return lambda value: f"{value:,} {unit}"


#: How a free-tier kind's field reads in the lanes table ("" leaves it out; a reading in parentheses
#: qualifies the kind's name, the rest are its limits). A field not named here is shown as TOML
#: (`name = value`) where a lane sets it away from its default, so a field added to a kind shows
#: up without a change here.
TIER_FIELDS: dict[str, Callable[[Any], str]] = {
    "patterns": lambda value: "(" + ", ".join(f"`{p}`" for p in value) + ")",
    "rpm": per("RPM"),
    "rpd": per("RPD"),
    "rpmonth": per("requests a month"),
    "tpm": per("TPM"),
    "tpd": per("TPD"),
    "tpmonth": per("tokens a month"),
    "budget_usd": lambda value: f"${value:,g}",
    "reset": lambda value: "no reset" if value == "never" else f"reset {value}",
    "account_wide": lambda value: "account-wide" if value else "",
}


def free_tier(kind: Any) -> str:
    """A free-tier kind as the lanes table shows it: its name, the models it covers, then the
    limits it declares — `` `free_models` (`*:free`): 20 RPM, 50 RPD, account-wide ``."""
    head, limits = f"`{kind.kind}`", []
    for field in attrs.fields(type(kind)):
        shown = tier_field(field, getattr(kind, field.name))
        if shown.startswith("("):
            head += f" {shown}"
        elif shown:
            limits.append(shown)
    return f"{head}: {', '.join(limits)}" if limits else head


def tier_field(field: attrs.Attribute[Any], value: Any) -> str:
    """One field of a free-tier kind as the lanes table shows it, "" when it says nothing."""
    if field.name == "kind" or value is None:
        return ""
    if field.name in TIER_FIELDS:
        return TIER_FIELDS[field.name](value) or ""
    if value == field.default:
        return ""
    value = attrs.asdict(value) if attrs.has(type(value)) else value
    return f"`{field.name} = {toml_value(value)}`"


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def notes(provider: Provider, docstring: str) -> str:
    """A lane's notes: its docstring's first paragraph, whitespace-folded, and where it listens
    when its default `base_url` is on this machine."""
    said = " ".join(docstring.strip().split("\n\n")[0].split())
    if is_loopback(provider.base_url):
        said += f" Default `base_url`: `{provider.base_url}`."
    return said


def lanes_blocks() -> dict[str, str]:
    """The `lanes` block: a row for every lane module, by default kind (in `KINDS` order), then
    by name."""
    rows = [
        "| module | provider | default kind and limits | key variable | notes |",
        "|---|---|---|---|---|",
    ]
    order = list(KINDS)
    found = lane_modules()
    for name in sorted(found, key=lambda n: (order.index(found[n][0].free_tier.kind), n)):
        provider, docstring = found[name]
        key = f"`{provider.api_key_env}`" if provider.api_key_env else "—"
        rows.append(
            f"| `{name}` | {cell(provider.name)} | {cell(free_tier(provider.free_tier))} | {key} "
            f"| {cell(notes(provider, docstring))} |"
        )
    return {"lanes": "\n".join(rows) + "\n"}


PAGES: dict[Path, Callable[[], dict[str, str]]] = {
    CONFIG_PAGE: config_blocks,
    CLI_PAGE: cli_blocks,
    LANES_PAGE: lanes_blocks,
}


def render(text: str, blocks: dict[str, str], page: str) -> str:
    """`text` with each generated block rewritten. Raises ValueError for a block naming nothing
    the generator makes, or a block missing from the page."""
    named = [m.group(2) for m in BLOCK.finditer(text)]
    unknown = sorted(set(named) - set(blocks))
    missing = [name for name in blocks if name not in named]
    if unknown or missing:
        raise ValueError(
            f"{page}: blocks naming nothing generated: {unknown}; blocks missing: {missing} "
            "(add `<!-- generated: NAME -->` … `<!-- end generated -->` where each belongs)"
        )
    return BLOCK.sub(lambda m: m.group(1) + blocks[m.group(2)] + m.group(4), text)


def generated() -> dict[Path, str]:
    """Each reference page as the generator writes it now."""
    return {
        path: render(path.read_text(encoding="utf-8"), make(), str(path.relative_to(ROOT)))
        for path, make in PAGES.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    stale = []
    for path, text in generated().items():
        if path.read_text(encoding="utf-8") != text:
            stale.append(str(path.relative_to(ROOT)))
            if not args.check:
                path.write_text(text, encoding="utf-8")
    if args.check and stale:
        print(f"stale: {', '.join(stale)}; run `{COMMAND}`", file=sys.stderr)
        return 1
    for name in stale:
        print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
