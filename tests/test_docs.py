"""The documentation holds to the code: the reference pages are what docs/gen_reference.py writes
from it now, every config key and every `lanes` command and flag is on them, the architecture
page names every layer, the paths the pages name exist, and every Markdown table renders."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import sys
import typing
from pathlib import Path
from types import ModuleType

import attrs
import pytest
from test_architecture import LANE_MODULES, LAYERS

from lanes._core.config.schema import (
    ClientConfig,
    Config,
    LaneConfig,
    MetricsConfig,
    ModelConfig,
    ServerConfig,
)
from lanes._core.freetier import kinds
from lanes._core.policy.breaker import BreakerPolicy
from lanes._core.policy.policy import PolicyConfig

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "lanes"
DOCS = ROOT / "docs"
REGENERATE = "python docs/gen_reference.py (or make docs)"


def generator() -> ModuleType:
    """docs/gen_reference.py, loaded from its file (docs/ is no package)."""
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = generator()


def pages() -> list[Path]:
    """README and every page of the docs site (docs/**/*.md)."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def documentation() -> str:
    """README and every page of the docs site, as one text."""
    return "\n".join(p.read_text() for p in pages())


def blocks(path: Path) -> dict[str, str]:
    """A reference page's generated blocks as committed: name → text."""
    return {m.group(2): m.group(3) for m in GEN.BLOCK.finditer(path.read_text())}


def test_the_reference_pages_are_what_the_generator_writes_now():
    """docs/reference/config.md, cli.md and lanes.md are what the generator writes from the code
    now: a config key, a flag or a lane module added, renamed or changed without regenerating
    fails here."""
    stale = [
        str(path.relative_to(ROOT))
        for path, text in GEN.generated().items()
        if path.read_text() != text
    ]
    assert stale == [], f"stale reference pages: run {REGENERATE}"


def config_classes(cls: type, seen: set[type] | None = None) -> set[type]:
    """`cls` and every attrs class its fields hold (in a list, a dict, an optional or a union),
    found by walking the annotations — so a config class added anywhere is in."""
    seen = set() if seen is None else seen
    if cls in seen:
        return seen
    seen.add(cls)
    hints = typing.get_type_hints(cls)
    todo = [hints[f.name] for f in attrs.fields(cls)]
    while todo:
        hint = todo.pop()
        todo.extend(typing.get_args(hint))
        if isinstance(hint, type) and attrs.has(hint):
            config_classes(hint, seen)
    return seen


def config_keys() -> set[str]:
    classes = config_classes(Config) | set(kinds.KINDS.values()) | {kinds.CustomEndpoint}
    return {field.name for cls in classes for field in attrs.fields(cls)}


def test_the_config_classes_are_found_not_listed():
    """Walking `Config` finds every config class, the scoring's among them, and the generator's
    walk finds the same classes."""
    from lanes._core.policy.scoring import ScoringConfig

    assert {
        Config,
        LaneConfig,
        ModelConfig,
        BreakerPolicy,
        PolicyConfig,
        ScoringConfig,
        ServerConfig,
        ClientConfig,
        MetricsConfig,
        kinds.CustomEndpoint,
        *kinds.KINDS.values(),
    } <= config_classes(Config)
    assert {table.cls for table in GEN.tables()} == config_classes(Config)


def row(text: str, key: str) -> list[str] | None:
    """The cells of `key`'s row in a generated table, or None when it has none."""
    for line in text.splitlines():
        if line.startswith(f"| `{key}` |"):
            return [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
    return None


def test_the_docs_document_every_config_key():
    """Each config key has its row — type, default and a description — in its table's block of
    the configuration reference (docs/reference/config.md); `kind` is in the kinds' table."""
    committed = blocks(DOCS / "reference" / "config.md")
    missing = []
    for table in GEN.tables():
        for field in attrs.fields(table.cls):
            if table.kind is not None and field.name == "kind":
                continue
            cells = row(committed.get(table.header, ""), field.name)
            if cells is None or len(cells) != 4 or "" in cells or cells[3] == "—":
                missing.append(f"{table.header} {field.name}")
    assert missing == []
    assert "`kind`" in committed["free-tier kinds"]
    assert all(f'`"{kind}"`' in committed["free-tier kinds"] for kind in kinds.KINDS)


def test_a_config_field_without_a_description_is_refused(tmp_path, monkeypatch):
    """Every config field carries its description in the code (a `#:` comment above it): the
    generator refuses a field without one, naming it."""
    for table in GEN.tables():
        assert all(key.doc for key in GEN.keys(table))
    (tmp_path / "bare_config.py").write_text(
        "import attrs\n\n\n@attrs.frozen\nclass Bare:\n    #: said\n    said: int = 1\n"
        "    # a comment, not a description\n    unsaid: int = 2\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    bare = importlib.import_module("bare_config").Bare

    with pytest.raises(ValueError, match=r"bare_config\.Bare\.unsaid: no description"):
        GEN.keys(GEN.Table(header="[bare]", cls=bare))


def subcommands(
    parser: argparse.ArgumentParser | None = None,
) -> dict[str, argparse.ArgumentParser]:
    """Each `lanes` subcommand by name, and each action of one that has actions by its whole name
    (`batch submit`)."""
    from lanes._cli import _parser

    found = {}
    for action in (parser or _parser())._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[name] = sub
                found |= {f"{name} {inner}": p for inner, p in subcommands(sub).items()}
    return found


def cli_sections() -> dict[str, str]:
    """The CLI reference's section of each subcommand (`### lanes NAME`) and of each action of one
    (`#### lanes NAME ACTION`), up to the next section."""
    text = (DOCS / "reference" / "cli.md").read_text()
    parts = re.split(r"^#{3,4} `lanes ([a-z -]+)`$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_the_docs_document_every_cli_command():
    """Each `lanes` subcommand (and each action of one) has its section in the CLI reference, with
    its help, and is named on the hand-written pages too (the sidecar page's `lanes` command
    table)."""
    commands = subcommands()
    assert "batch submit" in commands
    assert sorted(cli_sections()) == sorted(commands)
    written = "\n".join(p.read_text() for p in pages() if p != DOCS / "reference" / "cli.md")
    assert sorted(c for c in commands if f"lanes {c}" not in written) == []


def test_the_docs_document_every_cli_flag():
    """Each option of each `lanes` subcommand (`--workers`, `--log-format`, …) is in that
    command's section of the CLI reference, with its help text when it has one."""
    sections, missing = cli_sections(), []
    for name, sub in subcommands().items():
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            shown = f"| `{GEN.argument(action)}` |"
            if shown not in sections[name] or (action.help and action.help not in sections[name]):
                missing.append(f"lanes {name} {GEN.argument(action)}")
    assert missing == []
    documented = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)(?![\w-])", documentation()))
    assert "--workers" in documented and "--log-format" in documented


def declares_provider(name: str) -> bool:
    """Whether lanes/NAME.py assigns `PROVIDER` at its top level (read, not imported)."""
    tree = ast.parse((PACKAGE / f"{name}.py").read_text())
    targets = [
        t
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
    ]
    return any(isinstance(t, ast.Name) and t.id == "PROVIDER" for t in targets)


def test_the_lanes_page_has_a_row_for_every_lane_module():
    """docs/reference/lanes.md's generated table has one row per lane module (each non-underscore
    module of lanes/ that declares a `PROVIDER`), and none for a module that is gone; the
    generator finds the same modules. A lane added or deleted without regenerating fails here."""
    lanes = sorted(name for name in LANE_MODULES if declares_provider(name))
    table = blocks(DOCS / "reference" / "lanes.md")["lanes"]
    rows = re.findall(r"^\| `(\w+)` \|", table, flags=re.MULTILINE)
    assert {"groq", "ollama", "openrouter", "openai_compatible"} <= set(lanes)
    without_row = [name for name in lanes if name not in rows]
    assert without_row == [], f"lane modules with no row: run {REGENERATE}"
    assert sorted(rows) == lanes, f"rows for no lane module, or twice: run {REGENERATE}"
    assert sorted(GEN.lane_modules()) == lanes


def test_a_free_tier_field_shows_on_the_lanes_page_without_a_generator_change():
    """A free-tier field the generator has no words for is shown as TOML where a lane sets it
    away from its default, and left out at its default; the fields it knows read as limits."""

    @attrs.frozen(kw_only=True)
    class Hourly:
        kind: str = "hourly"
        rpm: int | None = None
        rph: int | None = None
        note: str = "x"

    assert GEN.free_tier(Hourly()) == "`hourly`"
    assert (
        GEN.free_tier(Hourly(rpm=2, rph=5, note="y")) == '`hourly`: 2 RPM, `rph = 5`, `note = "y"`'
    )
    credits = kinds.CreditBased(budget_usd=25.0, detection="provider_api")
    assert GEN.free_tier(credits) == '`credits`: $25, no reset, `detection = "provider_api"`'
    free = kinds.FreeModelsOnly(rpm=20, rpd=50)
    assert GEN.free_tier(free) == "`free_models` (`*:free`): 20 RPM, 50 RPD, account-wide"


def test_a_lane_module_that_fails_to_import_stops_the_lanes_page(tmp_path, monkeypatch):
    """The generator refuses a lane module the loader can not import, naming it, rather than
    leaving its row out; a module of lanes/ declaring no `PROVIDER` is no lane, and is skipped."""
    import lanes

    (tmp_path / "broken_lane.py").write_text('raise RuntimeError("half-written")\n')
    (tmp_path / "not_a_lane.py").write_text('"""A helper, no PROVIDER."""\n')
    monkeypatch.setattr(lanes, "__path__", [*lanes.__path__, str(tmp_path)])
    try:
        monkeypatch.setattr(GEN, "shipped_lane_modules", lambda: ["not_a_lane"])
        assert GEN.lane_modules() == {}
        monkeypatch.setattr(GEN, "shipped_lane_modules", lambda: ["broken_lane", "not_a_lane"])
        with pytest.raises(ValueError, match=r"lanes/broken_lane\.py: module lanes\.broken_lane"):
            GEN.lane_modules()
    finally:
        sys.modules.pop("lanes.not_a_lane", None)
        vars(lanes).pop("not_a_lane", None)


def test_the_architecture_page_names_every_layer():
    """docs/architecture.md names every entry of LAYERS (tests/test_architecture.py) and every
    folder of lanes/_core, so the page's layer table can not fall behind the house."""
    page = (DOCS / "architecture.md").read_text()
    folders = [
        f"lanes/_core/{d.name}"
        for d in sorted((PACKAGE / "_core").iterdir())
        if (d / "__init__.py").is_file()
    ]
    assert len(folders) >= 10
    named = [e for e in (*LAYERS, *folders) if f"`{e}`" not in page and f"`{e}/`" not in page]
    assert named == []


#: Words the walk quotes that are values, not code: consent modes, the `auto` model, a logger.
WALK_VALUES = {"off", "ask", "allow", "auto", "lanes.jobs"}
NAME = re.compile(r"`([A-Za-z_]\w*(?:\.\w+)?)`(?:\s+\(`([\w/]+\.py)`)?")


def definitions(path: Path) -> set[str]:
    """What a module defines: its functions, classes and constants, each class's methods and
    fields (as `Class.name` and bare)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names |= {item.name, f"{node.name}.{item.name}"}
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names |= {item.target.id, f"{node.name}.{item.target.id}"}
    return names


def test_the_architecture_walk_names_what_the_code_defines():
    """Every function, class, method or setting docs/architecture.md's walk of a request names is
    defined in lanes — in the module named beside it, when one is (a path's end: `gate.py`,
    `engine/gate.py`) — so a rename or a move that leaves the walk behind fails here."""
    page = (DOCS / "architecture.md").read_text()
    walk = page[page.index("## One request, walked through the layers") :]
    files = {p: definitions(p) for p in PACKAGE.rglob("*.py")}
    everywhere = set().union(*files.values())
    found = NAME.findall(walk)
    assert len(found) > 60  # the walk is read, not skipped
    wrong = []
    for name, where in found:
        if name in WALK_VALUES or name.endswith("py"):
            continue
        modules = [p for p in files if where and str(p).endswith(f"/{where}")]
        if where and not any(name in files[p] for p in modules):
            wrong.append(f"{name} not in {where}")
        elif name not in everywhere:
            wrong.append(name)
    assert wrong == []


#: Paths a page tells the reader to create, not ones that exist.
TO_CREATE = {"lanes/acme.py"}


def test_the_docs_name_only_paths_that_exist():
    """Every `lanes/…` path and `lanes._core…` module the pages name exists: a module moved
    without its documentation fails here."""
    gone = []
    for path in pages():
        text = path.read_text()
        for name in re.findall(r"`(lanes/[\w./*-]*)`", text):
            if name not in TO_CREATE and not list(ROOT.glob(name.rstrip("/"))):
                gone.append(f"{path.relative_to(ROOT)}: {name}")
        for name in re.findall(r"`(lanes\._[\w.]+)`", text):
            base = ROOT / name.replace(".", "/")
            if not (base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()):
                gone.append(f"{path.relative_to(ROOT)}: {name}")
    assert gone == []


def test_readme_tables_render():
    """Every Markdown table in README, docs/ and the top-level homes is one block: a header, its
    `|---|` separator, then rows with as many cells — a blank line inside a table would split it,
    and the rows after it would render as text."""
    problems = []
    for path in [*pages(), *ROOT.glob("[cd]*/README.md")]:
        lines = path.read_text().splitlines()
        fenced = False
        header = 0
        for i, line in enumerate(lines):
            if line.startswith("```"):
                fenced = not fenced
            if fenced or not line.startswith("|"):
                continue
            cells = len(re.split(r"(?<!\\)\|", line.strip())) - 2
            if i == 0 or not lines[i - 1].startswith("|"):  # a table starts here
                header = cells
                separator = lines[i + 1] if i + 1 < len(lines) else ""
                if not re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", separator.strip()):
                    problems.append(f"{path.name}:{i + 1}: a table row without a header above it")
            elif cells != header:
                problems.append(f"{path.name}:{i + 1}: {cells} cells, the header has {header}")
    assert problems == []
