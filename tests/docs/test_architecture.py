"""docs/architecture.md keeps up with the code (issue 36): every package under broker/ and
server/ has its paragraph in "Packages, what each owns, what it may import", and no paragraph is
left for a package that is gone; every module the page names (a dotted `broker.…` name, a
`name.py` in a package's paragraph) exists, and so does every `broker/…py` or `server/…py` path
that any page (README.md, docs/*.md) names.

The code is read as it is when the test runs, so a package added later fails here until the
page says what its one job is."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import re

from broker.testing import ROOT
from tests.docs.markdown import pages, snippets, split

PAGE = ROOT / "docs" / "architecture.md"
SECTION = "## Packages, what each owns, what it may import"
_PARAGRAPH = re.compile(r"^\*\*`((?:broker|server)(?:\.\w+)*)`\*\*")
_PATH = re.compile(r"(?<![\w/.-])((?:broker|server)/(?:\w+/)*(?:\w+\.py\b)?)")
_DOTTED = re.compile(r"(?<![\w.-])(?:broker|server)(?:\.\w+)+")
_MODULE = re.compile(r"`(\w+\.py)`")


def packages() -> set[str]:
    """Every package of the code, dotted (`broker.runtime.docker`)."""
    return {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("broker", "server")
        for init in (ROOT / top).rglob("__init__.py")
    }


@functools.cache
def paragraphs() -> dict[str, str]:
    """The section's paragraphs that open with a package's name in bold: name → text."""
    _, prose = split(PAGE.read_text(encoding="utf-8"))
    found: dict[str, str] = {}
    inside, current = False, None
    for _, line in prose:
        if line.startswith("## "):
            inside, current = line.strip() == SECTION, None
            continue
        if not inside or not line.strip():
            current = None
            continue
        opening = _PARAGRAPH.match(line)
        if opening:
            current = opening.group(1)
            assert current not in found, f"two paragraphs for {current}"
            found[current] = ""
        if current is not None:
            found[current] += line + "\n"
    return found


def test_the_reader_finds_paragraphs() -> None:
    # The check below must be able to fail: the page's own paragraphs are seen, with their text.
    assert {"server", "broker", "broker.runtime"} <= paragraphs().keys()
    assert "lifecycle.py" in paragraphs()["broker.runtime"]


def test_every_package_has_its_paragraph() -> None:
    missing = sorted(packages() - paragraphs().keys())
    stale = sorted(paragraphs().keys() - packages())
    assert not missing, f"say in docs/architecture.md what these packages are for: {missing}"
    assert not stale, f"docs/architecture.md describes packages that are gone: {stale}"


def test_every_module_a_paragraph_names_is_in_its_package() -> None:
    wrong = [
        f"{package}: {name}"
        for package, text in paragraphs().items()
        for name in _MODULE.findall(text)
        if not (ROOT / package.replace(".", "/") / name).is_file()
    ]
    assert not wrong, f"docs/architecture.md names modules its packages do not have: {wrong}"


def test_every_path_the_pages_name_exists() -> None:
    # Every page, not only this one: a module that moves leaves no page pointing at its old place.
    named = {(page, path) for page in pages() for path in _PATH.findall(page.read_text(encoding="utf-8"))}
    assert len({path for page, path in named if page == PAGE}) > 10  # the reader sees the paths
    gone = sorted(f"{page.relative_to(ROOT)}: {path}" for page, path in named if not (ROOT / path).exists())
    assert not gone, f"pages name files that do not exist: {gone}"


def _resolves(dotted: str) -> bool:
    """A module or package, or an attribute of one (`broker.app.BrokerApp`)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a parent that is not a package
            found = False
        if not found:
            continue
        if cut == len(parts):
            return True
        holder: object = importlib.import_module(module)
        for attribute in parts[cut:]:
            if not hasattr(holder, attribute):
                return False
            holder = getattr(holder, attribute)
        return True
    return False


def test_every_dotted_name_the_page_gives_exists() -> None:
    named = {match.group(0) for snippet in snippets(PAGE) for match in _DOTTED.finditer(snippet.text)}
    assert {"broker.app.BrokerApp", "broker.runtime"} <= named  # the diagram's names and the table's
    gone = sorted(name for name in named if not _resolves(name))
    assert not gone, f"docs/architecture.md names modules or objects that do not exist: {gone}"


def test_the_check_sees_a_name_that_is_gone() -> None:
    assert _resolves("broker.gateway.handler.McpGateway")
    assert not _resolves("broker.gateway.sessions")
    assert not _resolves("broker.app.NoSuchThing")
    assert not (ROOT / "broker/policy.py").exists()
