"""A reference that cannot drift (issue 29 item 4): docs/operations.md's generated part is
what the code says today — every `DOCBROKER_*` variable the settings read (name, type,
default, meaning), every policy key, every command — and a variable read without a meaning
stops the generator. This is the one test of the settings' documentation: README points to
the page.
"""

from __future__ import annotations

import re

import pytest

from broker.cli import build_parser
from broker.cli.base import CliError
from broker.cli.reference import BEGIN, END, generated, replace_generated, settings_table
from broker.settings import SettingRead, Settings, every_read
from broker.testing import ROOT

PAGE = ROOT / "docs" / "operations.md"
SOURCES = sorted((ROOT / "broker" / "settings").glob("*.py"))
# Independent of the recorder: the `Reader` calls as they are written in the source.
_READS = re.compile(
    r"\.(?:text|optional|required|path|folder|paths|integer|number|flag|choice|listed|origins|networks"
    r'|tenant_map)\(\s*"([A-Z][A-Z0-9_]*)"'
)


def in_source() -> set[str]:
    return {f"DOCBROKER_{name}" for source in SOURCES for name in _READS.findall(source.read_text())}


def page_part() -> str:
    text = PAGE.read_text(encoding="utf-8")
    return text[text.index(BEGIN) : text.index(END) + len(END)] + "\n"


def test_the_page_is_what_the_code_generates() -> None:
    # Fails when a setting, a default, a bound, a policy key or a command changes and the page
    # was not regenerated (`docbroker reference --write docs/operations.md`).
    assert page_part() == generated(build_parser())


def test_every_variable_in_the_source_is_on_the_page_and_nothing_else() -> None:
    read = in_source()
    documented = set(re.findall(r"^\| `(DOCBROKER_[A-Z0-9_]+)` \|", page_part(), re.MULTILINE))
    assert len(read) > 70  # the pattern still finds the reads
    assert sorted(read - documented) == []  # a read the recorder missed (read conditionally)
    assert sorted(documented - read) == []


def test_a_setting_read_without_a_meaning_stops_the_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    # As when a read records no meaning (`doc=""`).
    original = Settings.from_env.__func__  # type: ignore[attr-defined]

    def with_a_new_read(cls: type[Settings], env: dict[str, str], *, reads: list[SettingRead]) -> Settings:
        reads.append(SettingRead("DOCBROKER_NEW_THING", "integer", 1, 0, 9))
        return original(cls, env, reads=reads)  # type: ignore[no-any-return]

    monkeypatch.setattr(Settings, "from_env", classmethod(with_a_new_read))
    with pytest.raises(CliError, match="DOCBROKER_NEW_THING"):
        settings_table()


def test_each_meaning_is_said_beside_its_read_once() -> None:
    # One read, one meaning, in the group's module: no prose kept apart from the code.
    reads = every_read()
    assert len({r.name for r in reads}) == len(reads) > 70
    assert [r.name for r in reads if len(r.doc) < 8] == []
    assert "SETTINGS" not in (ROOT / "broker" / "cli" / "reference.py").read_text()


def test_write_replaces_only_the_generated_part() -> None:
    text = f"# page\nhand-written\n{BEGIN}\nold\n{END}\nafter\n"
    assert replace_generated(text, "NEW\n") == "# page\nhand-written\nNEW\nafter\n"
    with pytest.raises(CliError):
        replace_generated("no markers", "NEW")
