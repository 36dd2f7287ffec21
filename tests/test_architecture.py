"""The house rules, checked by walking the source: pure modules stay pure, lanes stay deletable."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import attrs
import pytest

import lanes
from lanes._core.routing.breaker import BreakerPolicy
from lanes._core.config import Config, LaneConfig, ModelConfig, ServerConfig
from lanes._core.routing.policy import PolicyConfig
from lanes.freetier import kinds

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "lanes"
PURE = [
    "lanes/_core/routing/breaker.py", "lanes/_core/job.py", "lanes/_core/errors.py", "lanes/_core/upstream/responses.py",
    "lanes/_core/upstream/sse.py", "lanes/_core/routing/policy.py", "lanes/freetier/kinds.py", "lanes/freetier/headers.py",
    "lanes/freetier/backoff.py", "lanes/freetier/windows.py", "lanes/freetier/manager.py", "lanes/_core/state/audit.py",
]
IMPURE = {"trio", "httpx2", "httpx", "sqlite3", "sqlite_utils", "hypercorn", "starlette", "socket", "time"}
PROVIDERS = re.compile(
    r"\b(groq|cerebras|gemini|mistral|cohere|openrouter|together|deepseek|xai|deepinfra|ollama|anthropic"
    r"|lm ?studio|llama\.cpp|copilot|perplexity)\b",
    re.IGNORECASE,
)
LANE_MODULES = sorted(p.stem for p in PACKAGE.glob("*.py") if not p.stem.startswith("_"))
SUBPACKAGES = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py") if not p.parent.name.startswith("_"))
SOURCES = [p for d in ("lanes", "tests", "bench") for p in (ROOT / d).rglob("*.py")
           if ".venv" not in p.parts and not any(part.startswith(".venv") for part in p.parts)]


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


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


@pytest.mark.parametrize("path", PURE)
def test_pure_modules_do_no_io(path):
    """Pure modules import no trio, httpx, sqlite, server or clock, even indirectly."""
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
    tree = ast.parse(path.read_text())
    docstrings = {
        (node.body[0].lineno, node.body[0].col_offset)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }
    out = []
    for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if token.type == tokenize.NAME or (token.type == tokenize.STRING and token.start not in docstrings):
            out.append(token.string)
    return " ".join(out)


def test_the_engine_names_no_provider():
    """Nothing in lanes/_core names a provider in its code or strings."""
    named = {p.name: PROVIDERS.findall(code_text(p)) for p in (PACKAGE / "_core").rglob("*.py")}
    assert {k: v for k, v in named.items() if v} == {}


def test_public_api_is_sorted_and_complete():
    """`lanes.__all__` is sorted, every name exists, and nothing public is left out."""
    assert lanes.__all__ == sorted(lanes.__all__)
    assert all(hasattr(lanes, name) for name in lanes.__all__)
    public = {n for n in vars(lanes) if not n.startswith("_") and n not in LANE_MODULES
              and n not in {*SUBPACKAGES, "annotations"}}
    assert public == set(lanes.__all__)


def config_keys() -> set[str]:
    classes = [Config, LaneConfig, ModelConfig, BreakerPolicy, PolicyConfig, ServerConfig, *kinds.KINDS.values(),
               kinds.CustomEndpoint]
    return {field.name for cls in classes for field in attrs.fields(cls)}


def test_readme_documents_every_config_key():
    """Each config key appears in the README's config reference."""
    readme = (ROOT / "README.md").read_text()
    missing = sorted(k for k in config_keys() if f"`{k}`" not in readme)
    assert missing == []


def test_readme_documents_every_cli_command():
    """Each `lanes` subcommand appears in the README."""
    from lanes._cli import _parser

    parser = _parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    readme = (ROOT / "README.md").read_text()
    assert sorted(c for c in commands if f"lanes {c}" not in readme) == []
