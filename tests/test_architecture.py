"""The house rules, checked by walking the source: pure modules stay pure, lanes stay deletable.
(What the documentation must say of the code is checked in test_docs.py.)"""

from __future__ import annotations

import ast
import functools
import io
import os
import re
import tokenize
from pathlib import Path

import pytest

import lanes

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "lanes"
MARKER = "# lanes: pure"
IMPURE = {
    "trio",
    "httpx2",
    "httpx",
    "sqlite3",
    "sqlite_utils",
    "hypercorn",
    "starlette",
    "socket",
    "time",
    "redis",
}
LANE_MODULES = sorted(p.stem for p in PACKAGE.glob("*.py") if not p.stem.startswith("_"))
SUBPACKAGES = sorted(
    p.parent.name for p in PACKAGE.glob("*/__init__.py") if not p.parent.name.startswith("_")
)
SOURCES = [
    p
    for d in ("lanes", "tests", "bench")
    for p in (ROOT / d).rglob("*.py")
    if ".venv" not in p.parts and not any(part.startswith(".venv") for part in p.parts)
]


#: The house, lowest first: every module belongs to the longest entry holding it, and imports only
#: from its own entry or one below (lazy imports too; `TYPE_CHECKING` imports aside). A folder is
#: one entry; `lanes/*.py` is the lane modules, which only the loader imports (by name, from
#: config).
LAYERS = (
    "lanes/testing",  # the fakes, their behaviours and answers, the simulation: nothing of lanes
    "lanes/_core/model",  # job, record, errors, clocks, bounds on what comes from outside
    "lanes/_core/runtime",  # the ground's I/O: the wall source, keys and redaction, task health
    "lanes/_core/freetier",  # free-tier kinds, rate-limit headers, windows, prices, the manager
    "lanes/_core/policy",  # what a job needs, its plan, breakers, scoring, spend arithmetic
    "lanes/_core/config",  # the config model, and how a value is read and a problem said
    "lanes/_core/upstream",  # providers: the one pool, the lane, what they send, the loader
    "lanes/_core/dialects",  # Responses and Messages, to and from chat completions
    "lanes/_core/state",  # what persists and is shared: the stores, the audit tables, the clock
    "lanes/_core/cache",  # the exact response cache: its rules, its entries, a hit as a stream
    "lanes/_core/money",  # consent, approvals, the ledger, the shared terms
    "lanes/_core/engine",  # the walk, the attempt, the gate, the calls, the stream session
    "lanes/_core/audit",  # what every job leaves: the journal, the tally, reports, statistics
    "lanes/_core/batch",  # work that can wait: the durable batch queue and its runner
    "lanes/_core",  # the roof: the dispatcher, open_dispatcher, the config check
    "lanes/_whatif",  # replays of the audit under another config, on in-process providers
    "lanes/_http",  # the sidecar
    "lanes/__init__.py",  # the public API
    "lanes/*.py",  # the lane modules
    "lanes/harness",  # sidecar processes, the herd, configs for tests over the product
    "lanes/canary",
    "lanes/drills",
    "lanes/_cli_inputs.py",
    "lanes/_cli_reports.py",
    "lanes/_cli_whatif.py",
    "lanes/_cli_batch.py",
    "lanes/_cli.py",
    "lanes/__main__.py",
)
#: Folders whose every module is pure (STYLE: values in, values out); elsewhere a module is pure
#: when it says so (`# lanes: pure`).
PURE_FOLDERS = (
    "lanes/_core/model",
    "lanes/_core/policy",
    "lanes/_core/dialects",
    "lanes/_core/freetier",
)


def layer_of(path: Path) -> int:
    """The index in LAYERS of the entry holding `path` (a file of lanes/)."""
    name = str(path.relative_to(ROOT))
    if name in LAYERS:
        return LAYERS.index(name)
    folder = str(path.parent.relative_to(ROOT))
    if folder == "lanes":
        return LAYERS.index("lanes/*.py")
    assert folder in LAYERS, f"{folder}/ stands on no layer: add it to LAYERS"
    return LAYERS.index(folder)


@functools.cache
def tree_of(path: Path) -> ast.Module:
    """A file's syntax tree, parsed once for all the tests here (they only read it)."""
    return ast.parse(path.read_text())


def runtime_imports(path: Path) -> set[str]:
    """The modules `path` imports when it runs: top-level and lazy imports, not those under
    `if TYPE_CHECKING:`."""
    tree = tree_of(path)
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def test_every_module_stands_on_a_layer():
    """Every file of lanes/ belongs to an entry of LAYERS, and every entry holds a file."""
    files = sorted(PACKAGE.rglob("*.py"))
    held = {LAYERS[layer_of(p)] for p in files}
    assert sorted(set(LAYERS) - held) == []


def test_nothing_imports_upward():
    """No module imports from a layer above its own — so, collapsing modules to their folders,
    no two folders import each other, directly or around a loop."""
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        mine = layer_of(path)
        for name in runtime_imports(path):
            target = module_file(name) if name.startswith("lanes") else None
            if target is not None and layer_of(target) > mine:
                upward.append(
                    f"{path.relative_to(ROOT)} ({LAYERS[mine]}) imports {name} "
                    f"({LAYERS[layer_of(target)]})"
                )
    assert upward == []


def test_the_fakes_import_nothing_of_the_product():
    """`lanes.testing`'s bottom half (everything but the harness) imports only itself: a fake
    reads a request as the provider would, not as lanes does."""
    outside = [
        f"{p.relative_to(ROOT)} imports {name}"
        for p in (PACKAGE / "testing").glob("*.py")
        for name in runtime_imports(p)
        if name.split(".")[0] == "lanes"
        and (not name.startswith("lanes.testing") or name.startswith("lanes.harness"))
    ]
    assert outside == []


def pure_modules() -> list[str]:
    """Every module of a pure folder, and every module carrying the pure marker."""
    found = {p for folder in PURE_FOLDERS for p in (ROOT / folder).glob("*.py")}
    found |= {p for p in PACKAGE.rglob("*.py") if MARKER in p.read_text().splitlines()}
    return sorted(str(p.relative_to(ROOT)) for p in found)


PURE = pure_modules()


def provider_names() -> set[str]:
    """What the lane modules call their providers (`Provider(name=...)`), and the modules'
    own names. `openai` names the wire protocol the engine speaks, so the engine may say it."""
    names = set(LANE_MODULES)
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(tree_of(path)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Provider":
                names |= {
                    k.value.value
                    for k in node.keywords
                    if k.arg == "name"
                    and isinstance(k.value, ast.Constant)
                    and isinstance(k.value.value, str)
                }
    return names - {"openai", "openai_compatible"}


PROVIDERS = re.compile(
    r"\b(" + "|".join(sorted(map(re.escape, provider_names()))) + r")\b", re.IGNORECASE
)


@functools.cache
def imports(path: Path) -> frozenset[str]:
    tree = tree_of(path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return frozenset(found)


def module_file(name: str) -> Path | None:
    base = ROOT / name.replace(".", "/")
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def closure(path: Path) -> set[str]:
    """Every module `path` imports, following the project's own modules transitively."""
    seen, todo, out = set(), [path], set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for name in imports(current):
            out.add(name.split(".")[0] if not name.startswith("lanes") else name)
            target = module_file(name) if name.startswith("lanes") else None
            if target is not None and target.name != "__init__.py":
                todo.append(target)
    return out


def test_the_pure_set_is_found_not_listed():
    """The pure set comes from the folders and the marker and holds the core's known pure
    modules."""
    assert {
        "lanes/_core/policy/breaker.py",
        "lanes/_core/policy/policy.py",
        "lanes/_core/policy/scoring.py",
        "lanes/_core/upstream/catalog.py",
        "lanes/_core/upstream/sse.py",
        "lanes/_core/freetier/headers.py",
        "lanes/canary/score.py",
        "lanes/_core/model/job.py",
        "lanes/_core/model/errors.py",
    } <= set(PURE)


@pytest.mark.parametrize("path", PURE)
def test_pure_modules_do_no_io(path):
    """Pure modules import no trio, httpx, sqlite, redis, server or clock, even indirectly."""
    assert not (closure(ROOT / path) & IMPURE)


def test_only_the_loader_imports_lane_modules():
    """No module imports a lane module by name: lanes are found through config only."""
    assert {"groq", "ollama", "openai", "openai_compatible"} <= set(LANE_MODULES)
    offenders = []
    for path in SOURCES:
        for name in imports(path):
            parts = name.split(".")
            if len(parts) >= 2 and parts[0] == "lanes" and parts[1] in LANE_MODULES:
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offenders == []


def code_text(path: Path) -> str:
    """Names and string literals of a module, without comments and docstrings."""
    tree = tree_of(path)
    docstrings = {
        (node.body[0].lineno, node.body[0].col_offset)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    out = []
    for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if token.type == tokenize.NAME or (
            token.type == tokenize.STRING and token.start not in docstrings
        ):
            out.append(token.string)
    return " ".join(out)


def test_the_engine_names_no_provider():
    """Nothing in lanes/_core (nor the HTTP side) names a provider in its code or strings: the
    rate-limit parser reads header families by their shape, not by whose they are."""
    assert {"groq", "openrouter", "ollama", "gemini"} <= provider_names()
    engine = [*(PACKAGE / "_core").rglob("*.py"), *(PACKAGE / "_http").rglob("*.py")]
    named = {str(p.relative_to(ROOT)): PROVIDERS.findall(code_text(p)) for p in engine}
    assert {k: v for k, v in named.items() if v} == {}


def test_lane_modules_import_only_the_public_api():
    """A lane module imports `lanes` (the lane-author API) and the stdlib, nothing private."""
    offenders = []
    for name in LANE_MODULES:
        for node in ast.walk(tree_of(PACKAGE / f"{name}.py")):
            modules = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            )
            offenders += [
                f"{name} imports {m}"
                for m in modules
                if m.startswith("lanes.")
                or m.split(".")[0] in ("httpx2", "trio", "attrs", "sqlite3")
            ]
    assert offenders == []


def test_lanes_never_imports_the_scripts_around_it():
    """Nothing in the package imports the top-level `drills`, `canary` or `bench`."""
    offenders = [
        f"{p.relative_to(ROOT)} imports {name}"
        for p in PACKAGE.rglob("*.py")
        for name in imports(p)
        if name.split(".")[0] in ("drills", "canary", "bench")
    ]
    assert offenders == []


TOP_LEVEL = (
    "pyproject.toml",
    "README.md",
    "Makefile",
    "lanes",
    "canary",
    "drills",
    "tests",
    "config",
)


def test_the_repository_top_level_is_the_design_cards():
    """The design card's top level exists: `canary/` and `drills/` beside `lanes/`, `config/` and
    `tests/`, each home with a README; they hold no Python (nothing that could shadow
    `lanes.canary` or `lanes.drills`, which stay the code); `canary/prompts.toml` is the package's
    prompt set itself (a link, not a copy), and CI runs the drills through `drills/ci`."""
    assert [n for n in TOP_LEVEL if not (ROOT / n).exists()] == []
    for home in ("canary", "drills"):
        assert (ROOT / home / "README.md").is_file()
        assert sorted(p.name for p in (ROOT / home).rglob("*.py")) == []
    prompts = ROOT / "canary" / "prompts.toml"
    assert prompts.is_symlink()
    assert prompts.resolve() == (PACKAGE / "config" / "canary.toml").resolve()
    assert "drills/ci" in (ROOT / ".ci" / "run").read_text().split()
    assert os.access(ROOT / "drills" / "ci", os.X_OK)


def test_the_drills_readme_lists_every_drill_as_lanes_drill_says():
    """`drills/README.md` holds `lanes drill --list --md` as it is now: a drill added, renamed or
    re-described without the README changing fails here. Through `scenarios`, which loads every
    drill as `lanes drill` does: a test that imported one drill module alone (`drills.clock`)
    left a part of the table, in its own order, and this test failed after it on that worker."""
    from lanes.drills.registry import table
    from lanes.drills.scenarios import DRILLS

    assert DRILLS  # every drill module loaded

    assert table() in (ROOT / "drills" / "README.md").read_text()


def module_graph() -> dict[str, set[str]]:
    """lanes' modules → the lanes modules each imports (type-checking imports included)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        targets = set()
        for imported in imports(path):
            if imported.startswith("lanes"):
                target = module_file(imported)
                if target is not None and target.name != "__init__.py":
                    targets.add(".".join(target.relative_to(ROOT).with_suffix("").parts))
        graph[name] = targets - {name}
    return graph


def test_no_import_cycle():
    """No module of lanes imports itself back, however indirectly."""
    graph, cycles = module_graph(), []
    for start in graph:
        todo, seen = list(graph[start]), set()
        while todo:
            current = todo.pop()
            if current == start:
                cycles.append(start)
                break
            if current not in seen:
                seen.add(current)
                todo.extend(graph.get(current, ()))
    assert cycles == []


#: The most public attributes a class of `lanes/_core` may have: more, and it is a hall everyone
#: crosses (STYLE 17). Records are data, not halls: attrs classes, named tuples, protocols,
#: exceptions, and the job's record (`JobRecord`, written only through its methods).
MAX_PUBLIC_ATTRIBUTES = 8
RECORDS = {"JobRecord"}


def is_data(cls: ast.ClassDef) -> bool:
    """attrs or dataclasses, or a named tuple, protocol, enum, typed dict or exception."""
    decorated = (ast.unparse(d).split("(")[0] for d in cls.decorator_list)
    bases = [ast.unparse(b) for b in cls.bases]
    return (
        cls.name in RECORDS
        or any(d.startswith(("attrs.", "attr.", "dataclass")) for d in decorated)
        or any(b in {"NamedTuple", "Protocol", "Enum", "TypedDict"} for b in bases)
        or any(b.endswith(("Error", "Exception", "Exhausted", "Failed")) for b in bases)
    )


def public_attributes(cls: ast.ClassDef) -> set[str]:
    """The public names a class gives its instances: set as `self.name` in its methods, or
    declared in its body (properties and methods aside)."""
    found = set()
    for item in cls.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found |= {
                node.attr
                for node in ast.walk(item)
                if isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            }
        elif isinstance(item, ast.Assign):
            found |= {t.id for t in item.targets if isinstance(t, ast.Name)}
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            found.add(item.target.id)
    return {name for name in found if not name.startswith("_")}


def test_no_class_of_the_engine_is_a_hall():
    """No class in lanes/_core that holds collaborators has more than `MAX_PUBLIC_ATTRIBUTES`
    public attributes: each changing fact has one owner, and the rest are reached through it."""
    halls = {}
    for p in sorted((PACKAGE / "_core").rglob("*.py")):
        for cls in ast.walk(ast.parse(p.read_text())):
            if isinstance(cls, ast.ClassDef) and not is_data(cls):
                names = public_attributes(cls)
                if len(names) > MAX_PUBLIC_ATTRIBUTES:
                    halls[f"{p.relative_to(ROOT)}:{cls.name}"] = sorted(names)
    assert halls == {}


def attribute_owners(trees: dict[Path, ast.Module]) -> dict[str, set[Path]]:
    """Each attribute name a class of lanes gives its instances → the modules defining it (not
    those every exception has: Python's, like `args`)."""
    owners: dict[str, set[Path]] = {}
    for path, tree in trees.items():
        for cls in ast.walk(tree):
            if not isinstance(cls, ast.ClassDef):
                continue
            for item in cls.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    owners.setdefault(item.target.id, set()).add(path)
            for node in ast.walk(cls):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "self"
                ):
                    owners.setdefault(node.attr, set()).add(path)
    return {name: paths for name, paths in owners.items() if name not in dir(BaseException)}


def test_no_attribute_is_written_from_outside_its_owning_module():
    """An object of lanes changes through its own methods: no module sets an attribute (`x.a = …`,
    `x.a += …`) that only classes of other modules define. Writes to a framework's own namespace
    (Starlette's `app.state`) or a library's object are not of lanes."""
    trees = {p: ast.parse(p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))}
    owners = attribute_owners(trees)
    theirs = {"response.request"}  # httpx2's Response, as its own client sets it on a transport's
    found = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            else:
                continue
            for target in targets:
                for sub in ast.walk(target):
                    if not isinstance(sub, ast.Attribute) or not isinstance(sub.ctx, ast.Store):
                        continue
                    on = ast.unparse(sub.value)
                    if on in ("self", "cls") or on.endswith(".state") or ast.unparse(sub) in theirs:
                        continue
                    if sub.attr in owners and path not in owners[sub.attr]:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(sub)}")
    assert found == []


def test_one_class_name_means_one_class():
    """No two classes of lanes share a name: a newcomer who greps a class finds one — but for a
    lane module's `Lane`, the name the loader looks for (each module holds at most one)."""
    where: dict[str, list[str]] = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        lane_module = p.parent == PACKAGE and p.name != "__init__.py"
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef) and not (lane_module and node.name == "Lane"):
                where.setdefault(node.name, []).append(str(p.relative_to(ROOT)))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}


def test_the_error_tree_is_drawn_as_it_is():
    """The tree in errors.py's docstring is the class hierarchy, class for class."""
    from lanes._core.model import errors

    drawn = {}
    for line in (errors.__doc__ or "").splitlines():
        match = re.match(r"^([│ ]*)(?:[├└]── )?([A-Z][A-Za-z]+)\b", line)
        if (
            match
            and hasattr(errors, match.group(2))
            and isinstance(getattr(errors, match.group(2)), type)
        ):
            depth = len(match.group(1)) // 4 + (1 if "──" in line else 0)
            drawn[match.group(2)] = depth
    parents: dict[str, str] = {}
    stack: list[str] = []
    for line in (errors.__doc__ or "").splitlines():
        match = re.match(r"^([│ ]*)(?:[├└]── )?([A-Z][A-Za-z]+)\b", line)
        if not match or match.group(2) not in drawn:
            continue
        depth = drawn[match.group(2)]
        del stack[depth:]
        if stack:
            parents[match.group(2)] = stack[-1]
        stack.append(match.group(2))
    bases = {
        name: {b.__name__ for b in cls.__bases__}
        for name, cls in vars(errors).items()
        if isinstance(cls, type)
        and issubclass(cls, errors.LanesError)
        and cls is not errors.LanesError
    }
    assert set(parents) == set(bases) and set(drawn) == {*bases, "LanesError"}
    assert {name: parent for name, parent in parents.items() if parent not in bases[name]} == {}


def test_public_api_is_sorted_and_complete():
    """`lanes.__all__` is sorted, every name exists, and nothing public is left out."""
    assert lanes.__all__ == sorted(lanes.__all__)
    assert all(hasattr(lanes, name) for name in lanes.__all__)
    public = {
        n
        for n in vars(lanes)
        if not n.startswith("_")
        and n not in LANE_MODULES
        and n not in {*SUBPACKAGES, "annotations"}
    }
    assert public == set(lanes.__all__)


CLOCK_READS = {("time", "time"), ("time", "monotonic"), ("time", "sleep"), ("datetime", "now")}
#: Engine modules that may read the system's wall clock: the wall source, and the probe lease's
#: default for a caller outside a dispatcher (which passes its wall's `now`).
WALL_READERS = {"lanes/_core/runtime/wall.py", "lanes/_core/state/leases.py"}


def clock_reads(path: Path) -> list[tuple[int, str]]:
    """(line, "module.function") of every call reading a clock (or sleeping on one) in `path`."""
    found = []
    for node in ast.walk(tree_of(path)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and (node.func.value.id, node.func.attr) in CLOCK_READS
        ):
            found.append((node.lineno, f"{node.func.value.id}.{node.func.attr}"))
    return found


def test_every_clock_read_is_marked_and_the_engine_reads_the_wall_in_one_place():
    """Every read of the wall or monotonic clock in `lanes` says why (`# wall-clock: why`), and
    the engine reads the system's wall clock only through the wall source (STYLE habit 2)."""
    unmarked, engine = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text().splitlines()
        name = str(path.relative_to(ROOT))
        for line, call in clock_reads(path):
            if "# wall-clock:" not in lines[line - 1]:
                unmarked.append(f"{name}:{line} {call}")
            if name.startswith("lanes/_core/") and call == "time.time" and name not in WALL_READERS:
                engine.append(f"{name}:{line}")
    assert unmarked == [] and engine == []


def record_writes(path: Path) -> list[str]:
    """Where `path` changes a job record's fields itself: `record.x = …`, `record.x += …`, or
    `record.x.append(…)` (and the like), the record being any name or attribute `record`."""

    def is_record(node: ast.expr) -> bool:
        return (isinstance(node, ast.Name) and node.id == "record") or (
            isinstance(node, ast.Attribute) and node.attr == "record"
        )

    found = []
    for node in ast.walk(tree_of(path)):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = [t for target in node.targets for t in ast.walk(target)]
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"append", "extend", "add", "update", "pop", "clear", "remove"}
        ):
            targets = [node.func.value]
        found += [
            f"{path.relative_to(ROOT)}:{t.lineno} record.{t.attr}"
            for t in targets
            if isinstance(t, ast.Attribute) and is_record(t.value)
        ]
    return found


def test_a_job_record_changes_only_through_its_own_methods():
    """The record of a job is written by its named methods (`skip`, `consented`, `planned`, …)
    alone: no module that imports `JobRecord` sets or mutates one of its fields directly."""
    users = [
        p
        for p in sorted(PACKAGE.rglob("*.py"))
        if p != PACKAGE / "_core" / "model" / "record.py"
        and "lanes._core.model.record" in imports(p)
    ]
    assert len(users) >= 5  # the walk, the gate, consent, the paid gate, the journal…
    assert [w for p in users for w in record_writes(p)] == []


def test_the_free_tier_manager_s_state_is_its_own():
    """Outside `lanes/_core/freetier/`, no module reaches into the manager's state: its fields are
    private, read and changed through its methods (`used`, `count_request`, `backoff`,
    `give_back`, …). A manager is whatever is named `manager` or `…_manager`."""
    names = {
        "terms", "backoffs", "snapshots", "usage", "spend", "balances", "credit_held",
        "confirmed", "pending_usage", "pending_spend", "changed_backoffs", "changed_snapshots",
    }  # fmt: skip

    def a_manager(node: ast.expr) -> bool:
        name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
        return name == "manager" or name.endswith("_manager")

    reached = []
    for p in sorted(PACKAGE.rglob("*.py")):
        if "freetier" in p.parts:
            continue
        tree = tree_of(p)
        called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}  # its methods
        reached += [
            f"{p.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and id(node) not in called
            and node.attr.lstrip("_") in names
            and a_manager(node.value)
        ]
    assert reached == []
