"""Docs that cannot lie (issue 38): every `docbroker …` command in README.md and docs/*.md (code
blocks and inline code) names commands and options the real CLI's `--help` lists; every
`DOCBROKER_*` they name is a setting the broker reads, or one of the few other variables listed
below and read where that list says; every link and `#anchor` between the pages, and every
pointer such as `README, "Replicas"` or `(kubernetes.md, "Lab")` anywhere in the repository
(docs, comments, docstrings), leads to a section that exists.

Values are not checked (`ID`, `acme`, a path): only that a reader who copies the line gets a
command that exists, with options it takes. The pages are read as they are when the test runs,
so a page added later is checked too."""

from __future__ import annotations

import contextlib
import functools
import io
import re
import shlex
from pathlib import Path

from broker.cli import main
from broker.cli.reference import settings_table
from broker.settings.known import HARNESS_PREFIX, OTHER_VARIABLES
from broker.testing import ROOT
from tests.docs.markdown import Snippet, anchors, headings, links, pages, snippets

# `DOCBROKER_*` names that are not the broker's settings, and where each is read
# (OTHER_VARIABLES); the test harness's own (`./dev test`, .ci/), each read in one of these places.
HARNESS_PLACES = ("tests", "broker/testing", ".ci", "dev", "k8s/overlays/lab", "bench")

SEPARATORS = {"|", "||", "&&", ";", "&", "(", "$(", "then", "do", "exec", "time", "sudo", "xargs"}
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*")
_REDIRECT = re.compile(r"[0-9]*[<>]")
_PLACEHOLDER = re.compile(r"\.\.\.|…|[A-Z][A-Z0-9_]*(\.\.\.)?|<[^>]*>")


@functools.cache
def help_text(path: tuple[str, ...]) -> str | None:
    """`docbroker PATH --help` as the CLI prints it; None when the CLI refuses the path."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), contextlib.suppress(SystemExit):
        main([*path, "--help"])
    text = out.getvalue()
    return text if text.startswith("usage: docbroker") else None


def subcommands(text: str) -> set[str] | None:
    """The commands a help page lists under COMMAND; None for a command that runs (a leaf)."""
    usage = re.search(r"^usage: docbroker[^\n]*?(\bCOMMAND|\{([a-z0-9,-]+)\}) \.\.\.", text, re.MULTILINE)
    if usage is None:
        return None
    if usage.group(2):  # a group without a metavar lists its commands in the usage line
        return set(usage.group(2).split(","))
    names = set()
    for match in re.finditer(r"^    ([a-z][a-z0-9-]*)(?: \(([a-z0-9, -]+)\))?", text, re.MULTILINE):
        names.add(match.group(1))
        names.update(a.strip() for a in (match.group(2) or "").split(","))
    return names - {""}


def options(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--?[A-Za-z][A-Za-z0-9-]*)", text))


def words(snippet: Snippet) -> list[str]:
    text = snippet.text.replace("$(", " $( ").replace("`", " ")
    try:
        return shlex.split(text, comments=snippet.block)
    except ValueError:  # an unbalanced quote in prose: good enough split on blanks
        return text.split()


def commands(snippet: Snippet) -> list[list[str]]:
    """The `docbroker` commands in a snippet: the words after `docbroker` up to a pipe,
    a redirection or the end; `docbroker` counts where a command starts (after a separator or
    variable assignments), so `kubectl -n docbroker` is not one."""
    found = []
    tokens = words(snippet)
    starts = True
    for i, token in enumerate(tokens):
        if token == "docbroker" and starts:
            rest = []
            for word in tokens[i + 1 :]:
                if word in SEPARATORS or _REDIRECT.match(word):
                    break
                rest.append(word)
            found.append(rest)
        starts = token in SEPARATORS or (starts and bool(_ASSIGNMENT.fullmatch(token)))
    return found


def problems(command: list[str]) -> list[str]:
    """What the CLI's --help does not offer in one documented command line."""
    path: list[str] = []
    text = help_text(())
    assert text is not None
    words = [w.strip("[]") for w in command if w.strip("[]")]
    for i, word in enumerate(words):
        listed = subcommands(text)
        if listed is None:  # a command that runs: the rest are its options and values
            offered = options(text)
            return [
                f"`docbroker {' '.join(path)}` has no option {w.split('=')[0]}"
                for w in words[i:]
                if re.match(r"--?[A-Za-z]", w) and w.split("=")[0] not in offered
            ]
        if word.startswith("-") or _PLACEHOLDER.fullmatch(word) or word.endswith(":"):
            # `docbroker audit ...`, `docbroker --help`: no command path to follow; `docbroker
            # keeper: waiting`: a line the program prints, not a command
            return []
        for alternative in word.split("|"):  # `tenant add|list|show`
            if alternative not in listed:
                return [f"`docbroker {' '.join([*path, alternative])}`: no such command"]
        if "|" in word:
            return []
        path.append(word)
        found = help_text(tuple(path))
        assert found is not None, path
        text = found
    return []


def documented_commands() -> list[tuple[Snippet, list[str]]]:
    return [(s, c) for page in pages() for s in snippets(page) for c in commands(s)]


def test_the_reader_finds_commands_to_check() -> None:
    found = documented_commands()
    assert len(found) > 100  # the parser still sees the pages' commands
    assert any(s.block for s, _ in found) and any(not s.block for s, _ in found)
    # and the check can fail: what a page might say and the CLI does not offer
    assert problems(["audit", "frobnicate"]) == ["`docbroker audit frobnicate`: no such command"]
    assert problems(["tenant", "manifest", "acme", "--secrets"]) == [
        "`docbroker tenant manifest` has no option --secrets"
    ]
    assert problems(["tenant", "add|list|show|remove"]) == []


def test_every_documented_command_is_one_the_cli_offers() -> None:
    wrong = [f"{s.where()}: {p}" for s, command in documented_commands() for p in problems(command)]
    assert wrong == []


def settings_read() -> set[str]:
    return set(re.findall(r"^\| `(DOCBROKER_[A-Z0-9_]+)` \|", "\n".join(settings_table()), re.MULTILINE))


def read_in(name: str, places: tuple[str, ...]) -> bool:
    for place in places:
        target = ROOT / place
        files = [target] if target.is_file() else [p for p in target.rglob("*") if p.is_file()]
        for path in files:
            if path.suffix in (".pyc", ".png") or path == Path(__file__):
                continue
            with contextlib.suppress(OSError, UnicodeDecodeError):
                if name in path.read_text(encoding="utf-8"):
                    return True
    return False


def test_every_variable_the_docs_name_is_read() -> None:
    known = settings_read()
    assert len(known) > 70
    wrong = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        for match in re.finditer(r"DOCBROKER_[A-Z0-9_]*[A-Z0-9](_?\*)?", text):
            name = match.group(0)
            where = f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, match.start()) + 1}"
            if name.endswith("*"):  # `DOCBROKER_AUTH_*`: a family the settings read
                if not any(k.startswith(name.rstrip("*")) for k in known):
                    wrong.append(f"{where}: no setting is named {name}")
            elif name in known:
                continue
            elif name in OTHER_VARIABLES:
                if not read_in(name, tuple(p.strip() for p in OTHER_VARIABLES[name].split(","))):
                    wrong.append(f"{where}: {name} is not read in {OTHER_VARIABLES[name]}")
            elif name.startswith(HARNESS_PREFIX):
                if not read_in(name, HARNESS_PLACES):
                    wrong.append(f"{where}: the test harness never reads {name}")
            else:
                wrong.append(f"{where}: the broker reads no {name}")
    assert wrong == []


def test_every_link_between_the_pages_leads_somewhere() -> None:
    wrong = []
    for page in pages():
        for line, target in links(page):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: — not ours to check
                continue
            path, _, anchor = target.partition("#")
            goes_to = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}:{line}"
            if not goes_to.exists():
                wrong.append(f"{where}: {target}: no such file")
            elif anchor and goes_to.suffix == ".md" and anchor not in anchors(goes_to):
                wrong.append(f"{where}: {target}: no such section")
    assert wrong == []


# `README, "Replicas"`, `docs/audit.md's "Troubleshooting"`, `(kubernetes.md, "Lab")`: a page
# and a section of it, named in prose, a comment or a docstring.
_POINTER = re.compile(r"\b(README|[a-z][a-z0-9-]*\.md)(?:'s)?,?\s+\"([^\"]{2,80})\"")
_TEXT_FILES = (".md", ".py", ".yaml", ".yml", ".toml", ".env", ".sh", ".cedar", ".json")
_COMMENT_MARK = re.compile(r"^\s*#+ ?", re.MULTILINE)
_SEARCHED = ("README.md", "docs", "k8s", "broker", "server", "tests", "deploy", "bench", "policies", ".ci")


def sections(page: Path) -> set[str]:
    """A page's headings and its paragraphs' bold leads (`**Kubernetes lab.** The tests…`)."""
    bold = re.findall(r"^\*\*([^*]+?)\.?\*\*", page.read_text(encoding="utf-8"), re.MULTILINE)
    return {h.replace("`", "").lower() for h in headings(page)} | {b.lower() for b in bold}


def pointed_page(name: str) -> Path | None:
    if name == "README":
        return ROOT / "README.md"
    found = [p for p in (ROOT / name, ROOT / "docs" / name) if p.is_file()]
    return found[0] if found else None


def names_a_section(pointer: str, known: set[str]) -> bool:
    """A pointer to "Lab" names `## Lab (Kubernetes 1.20, CI)`: a heading's first words, whole."""
    wanted = pointer.replace("`", "").lower()
    return any(s == wanted or re.match(re.escape(wanted) + r"[\s:(,]", s) for s in known)


def test_every_pointer_to_a_section_names_one() -> None:
    assert "replicas" in sections(ROOT / "docs" / "operations.md")
    assert {"tests", "kubernetes lab"} <= sections(ROOT / "docs" / "testing.md")
    wrong = []
    for root in _SEARCHED:
        target = ROOT / root
        for path in [target] if target.is_file() else sorted(target.rglob("*")):
            if not path.is_file() or path.suffix not in _TEXT_FILES or path == Path(__file__):
                continue
            # a comment's lines read as one text: `# (kubernetes.md, "A managed` / `# cluster, …"`
            raw = path.read_text(encoding="utf-8", errors="replace")
            text = " ".join(_COMMENT_MARK.sub("", raw).split())
            for match in _POINTER.finditer(text):
                page, section = pointed_page(match.group(1)), match.group(2).strip().rstrip(".")
                if page is None:
                    wrong.append(f"{path.relative_to(ROOT)}: {match.group(1)}: no such page")
                elif not names_a_section(section, sections(page)):
                    wrong.append(f'{path.relative_to(ROOT)}: {match.group(1)} has no section "{section}"')
    assert wrong == []
