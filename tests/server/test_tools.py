"""server/tools.py: the three tool bodies over a real workspace, with real approval tokens."""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from server import workspace as ws
from server.approval import ApprovalVerifier
from server.contracts import Message, ToolResult
from server.tools import DocumentTools
from server.workspace import Workspace

FIXED_MESSAGES = {m.value for m in Message}


@pytest.fixture
def tools(kit: Any, docs_root: Path) -> Iterator[DocumentTools]:
    workspace = Workspace(docs_root)
    yield DocumentTools(workspace, ApprovalVerifier(kit.secret), kit.tenant)
    workspace.close()


def as_dict(result: ToolResult[Any]) -> dict[str, Any]:
    dumped = result.model_dump(mode="json")
    assert dumped["message"] in FIXED_MESSAGES
    return dumped


def search(tools: DocumentTools, **args: Any) -> dict[str, Any]:
    return as_dict(tools.search_documents(args))


def read(tools: DocumentTools, **args: Any) -> dict[str, Any]:
    return as_dict(tools.read_document(args))


def save(tools: DocumentTools, **args: Any) -> dict[str, Any]:
    return as_dict(tools.save_report(args))


def rejected(message: Message) -> dict[str, Any]:
    return {"status": "rejected", "message": message.value, "data": None}


# --- search_documents ------------------------------------------------------------------------


def test_search_is_a_literal_case_sensitive_match(tools: DocumentTools, sources: Path) -> None:
    (sources / "upper.md").write_text("The Needle is here.")
    (sources / "lower.md").write_text("the needle is here.")
    (sources / "regex.md").write_text("literal a.c and [x] and (y)+")
    (sources / "abc.md").write_text("abc xyz")
    assert [h["filename"] for h in search(tools, query="Needle")["data"]["hits"]] == ["upper.md"]
    assert [h["filename"] for h in search(tools, query="needle")["data"]["hits"]] == ["lower.md"]
    assert [h["filename"] for h in search(tools, query="a.c")["data"]["hits"]] == ["regex.md"]
    assert [h["filename"] for h in search(tools, query="[x]")["data"]["hits"]] == ["regex.md"]
    assert search(tools, query="NEEDLE")["data"]["hits"] == []


def test_search_reports_what_it_examined(tools: DocumentTools, sources: Path) -> None:
    for i in range(5):
        (sources / f"doc{i}.md").write_text(f"document {i}")
    result = search(tools, query="document 3")
    assert result["status"] == "ok" and result["message"] == Message.SEARCHED.value
    assert result["data"] == {
        "hits": [{"filename": "doc3.md", "excerpt": "document 3"}],
        "examined": 5,
        "skipped": 0,
        "truncated": False,  # everything was examined
    }


def test_search_is_not_recursive(tools: DocumentTools, sources: Path) -> None:
    (sources / "top.md").write_text("nothing")
    (sources / "sub").mkdir()
    (sources / "sub" / "deep.md").write_text("Needle")
    (sources / "nested.md").mkdir()
    (sources / "nested.md" / "deep.md").write_text("Needle")
    data = search(tools, query="Needle")["data"]
    assert data == {"hits": [], "examined": 3, "skipped": 2, "truncated": False}


def test_search_examines_at_most_64_entries(tools: DocumentTools, sources: Path) -> None:
    for i in range(100):
        (sources / f"doc{i:03}.md").write_text("nothing to see")
    data = search(tools, query="Needle")["data"]
    assert data == {"hits": [], "examined": 64, "skipped": 0, "truncated": True}


def test_scan_limit_counts_invalid_entries_too(tools: DocumentTools, sources: Path) -> None:
    for i in range(70):
        (sources / f"notes{i}.txt").write_text("Needle")
    data = search(tools, query="Needle")["data"]
    assert data == {"hits": [], "examined": 64, "skipped": 64, "truncated": True}


def test_exactly_64_entries_is_not_truncated(tools: DocumentTools, sources: Path) -> None:
    for i in range(64):
        (sources / f"doc{i:02}.md").write_text("nothing")
    assert search(tools, query="Needle")["data"] == {
        "hits": [],
        "examined": 64,
        "skipped": 0,
        "truncated": False,
    }


def test_hit_limit_stops_early_and_says_so(tools: DocumentTools, sources: Path) -> None:
    for i in range(100):
        (sources / f"doc{i:03}.md").write_text(f"Needle {i}")
    default = search(tools, query="Needle")["data"]
    assert (len(default["hits"]), default["examined"], default["truncated"]) == (3, 3, True)
    one = search(tools, query="Needle", max_results=1)["data"]
    assert (len(one["hits"]), one["examined"], one["truncated"]) == (1, 1, True)


def test_hit_limit_reached_on_the_last_entry_is_not_truncated(tools: DocumentTools, sources: Path) -> None:
    for i in range(3):
        (sources / f"doc{i}.md").write_text("Needle")
    data = search(tools, query="Needle", max_results=3)["data"]
    assert (len(data["hits"]), data["examined"], data["truncated"]) == (3, 3, False)


@pytest.mark.timeout(10)  # a FIFO among the candidates: a blocking open would hang here
def test_search_skips_every_candidate_read_document_would_refuse(
    tools: DocumentTools, sources: Path, outside: Path
) -> None:
    """Each candidate goes through the bounded read: none of these may produce a hit."""
    (sources / "good.md").write_text("a Needle")
    (sources / "bad name.md").write_text("Needle")
    (sources / "notes.txt").write_text("Needle")
    (sources / "big.md").write_text("Needle" + "x" * 24_000)
    (sources / "latin.md").write_bytes("Needle caf\u00e9".encode("latin-1"))
    (outside / "secret.md").write_text("Needle")
    (sources / "link.md").symlink_to(outside / "secret.md")
    (outside / "hard.md").write_text("Needle")
    os.link(outside / "hard.md", sources / "hard.md")
    os.mkfifo(sources / "fifo.md")
    (sources / "dir.md").mkdir()
    os.mkdir(os.fsencode(sources) + b"/\xff.md")  # a name that is not even UTF-8
    data = search(tools, query="Needle")["data"]
    assert data["hits"] == [{"filename": "good.md", "excerpt": "a Needle"}]
    assert (data["examined"], data["skipped"], data["truncated"]) == (10, 9, False)


def test_search_of_a_24000_byte_file_still_hits(tools: DocumentTools, sources: Path) -> None:
    (sources / "full.md").write_text("x" * 23_994 + "Needle")
    assert [h["filename"] for h in search(tools, query="Needle")["data"]["hits"]] == ["full.md"]


@pytest.mark.parametrize("where", ["start", "middle", "end"])
@pytest.mark.parametrize("query", ["Needle", "N", "Q" * 80, "two words"])
def test_excerpt_contains_the_query(tools: DocumentTools, sources: Path, where: str, query: str) -> None:
    filler = "lorem ipsum\ndolor sit amet\t" * 400
    text = {"start": query + filler, "middle": filler + query + filler, "end": filler + query}[where]
    (sources / "doc.md").write_text(text)
    (hit,) = search(tools, query=query)["data"]["hits"]
    assert query in hit["excerpt"]
    assert len(hit["excerpt"]) <= 160
    assert "\n" not in hit["excerpt"] and "\t" not in hit["excerpt"]


@pytest.mark.parametrize(
    "args",
    [
        {"query": ""},
        {"query": "q" * 81},
        {"query": "x", "max_results": True},
        {"query": "x", "max_results": "3"},
        {"query": "x", "max_results": 0},
        {"query": "x", "max_results": 4},
        {"query": "x", "max_results": 2.0},
        {"query": "x", "recursive": True},
        {"query": 1},
        {},
    ],
)
def test_search_rejects_bad_input(tools: DocumentTools, sources: Path, args: dict[str, Any]) -> None:
    (sources / "x.md").write_text("x")
    assert search(tools, **args) == rejected(Message.INVALID_INPUT)


def test_search_that_cannot_list_fails(tools: DocumentTools, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_scandir(fd: int) -> Any:
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(ws.os, "scandir", failing_scandir)
    assert search(tools, query="x") == {
        "status": "failed",
        "message": Message.SEARCH_FAILED.value,
        "data": None,
    }


# --- read_document ---------------------------------------------------------------------------


def test_read_returns_the_content(tools: DocumentTools, sources: Path) -> None:
    (sources / "notes.md").write_text("Grüße\r\nline 2\n", encoding="utf-8", newline="")
    assert read(tools, filename="notes.md") == {
        "status": "ok",
        "message": Message.READ.value,
        "data": {"filename": "notes.md", "content": "Grüße\r\nline 2\n"},
    }


@pytest.mark.parametrize(
    "name",
    [
        "../outside.md",
        "..",
        "/etc/passwd",
        "sub/x.md",
        "a\x00.md",
        "a" * 65 + ".md",
        "notes.txt",
        ".hidden.md",
    ],
)
def test_read_rejects_names_outside_the_pattern(tools: DocumentTools, name: str) -> None:
    assert read(tools, filename=name) == rejected(Message.INVALID_FILENAME)


@pytest.mark.parametrize("args", [{}, {"filename": 5}, {"filename": "a.md", "mode": "r"}, {"filename": None}])
def test_read_rejects_bad_input(tools: DocumentTools, args: dict[str, Any]) -> None:
    assert read(tools, **args) == rejected(Message.INVALID_INPUT)


def test_read_missing_file_fails(tools: DocumentTools) -> None:
    assert read(tools, filename="absent.md") == {
        "status": "failed",
        "message": Message.NOT_FOUND.value,
        "data": None,
    }


@pytest.mark.timeout(10)
def test_read_refuses_anything_but_one_regular_file(
    tools: DocumentTools, sources: Path, outside: Path
) -> None:
    (outside / "secret.md").write_text("secret")
    (sources / "link.md").symlink_to(outside / "secret.md")
    os.link(outside / "secret.md", sources / "hard.md")
    os.mkfifo(sources / "fifo.md")
    (sources / "dir.md").mkdir()
    for name in ("link.md", "hard.md", "fifo.md", "dir.md"):
        assert read(tools, filename=name) == rejected(Message.NOT_REGULAR), name
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sources / "sock.md"))
        assert read(tools, filename="sock.md")["status"] in ("rejected", "failed")


def test_read_size_limit(tools: DocumentTools, sources: Path) -> None:
    (sources / "fits.md").write_bytes(b"a" * 24_000)
    (sources / "over.md").write_bytes(b"a" * 24_001)
    assert read(tools, filename="fits.md")["data"]["content"] == "a" * 24_000
    assert read(tools, filename="over.md") == rejected(Message.TOO_LARGE)


def test_read_refuses_non_utf8(tools: DocumentTools, sources: Path) -> None:
    (sources / "bin.md").write_bytes(b"\xff\xfe\x00binary")
    assert read(tools, filename="bin.md") == rejected(Message.NOT_UTF8)


# --- save_report -------------------------------------------------------------------------------


def test_save_with_a_valid_token_writes_exact_bytes(kit: Any, tools: DocumentTools, reports: Path) -> None:
    content = "# Report\r\nGrüße \U0001f600\n"
    result = save(tools, filename="r.md", content=content, approval_token=kit.mint("r.md", content))
    size = len(content.encode("utf-8"))
    assert result == {
        "status": "ok",
        "message": Message.SAVED.value,
        "data": {"filename": "r.md", "bytes": size},
    }
    assert (reports / "r.md").read_bytes() == content.encode("utf-8")
    assert stat.S_IMODE((reports / "r.md").stat().st_mode) & stat.S_IRUSR == 0


def test_save_at_both_limits(kit: Any, tools: DocumentTools, reports: Path) -> None:
    content = "\u20ac" * 8000  # 8,000 characters, exactly 24,000 bytes
    assert (
        save(tools, filename="max.md", content=content, approval_token=kit.mint("max.md", content))["status"]
        == "ok"
    )
    assert (reports / "max.md").stat().st_size == 24_000


@pytest.mark.parametrize(
    "content",
    [
        "\U0001f600" * 8000,  # 8,000 characters, but 32,000 bytes
        "\u20ac" * 7999 + "\U0001f600",  # 24,001 bytes
        "x" * 8001,
        "",
        "a\ud800b",  # a lone surrogate has no UTF-8 form
    ],
    ids=["8000-chars-over-bytes", "24001-bytes", "8001-chars", "empty", "lone-surrogate"],
)
def test_save_rejects_content_outside_the_limits(
    kit: Any, tools: DocumentTools, reports: Path, content: str
) -> None:
    # The token is valid for this exact content: only the limit can reject it.
    token = (
        kit.sign(kit.payload("r.md", "placeholder", sha256="0" * 64))
        if "\ud800" in content
        else kit.mint("r.md", content)
    )
    assert save(tools, filename="r.md", content=content, approval_token=token) == rejected(
        Message.INVALID_INPUT
    )
    assert list(reports.iterdir()) == []


@pytest.mark.parametrize(
    "name", ["../escape.md", "/tmp/escape.md", "sub/x.md", "x.txt", "a\x00.md", "a" * 65 + ".md"]
)
def test_save_rejects_names_outside_the_pattern(
    kit: Any, tools: DocumentTools, docs_root: Path, reports: Path, name: str
) -> None:
    result = save(tools, filename=name, content="x", approval_token=kit.mint(name, "x"))
    assert result == rejected(Message.INVALID_FILENAME)
    assert list(reports.iterdir()) == []
    assert not (docs_root / "escape.md").exists()


@pytest.mark.parametrize(
    "args",
    [
        {"filename": "r.md", "content": "x"},
        {"filename": "r.md", "content": "x", "approval_token": ""},
        {"filename": "r.md", "content": "x", "approval_token": None},
        {"filename": "r.md", "content": "x", "approval_token": "t", "overwrite": True},
    ],
)
def test_save_rejects_bad_input(tools: DocumentTools, reports: Path, args: dict[str, Any]) -> None:
    assert save(tools, **args) == rejected(Message.INVALID_INPUT)
    assert list(reports.iterdir()) == []


@pytest.mark.parametrize(
    "change",
    [
        {"scope": "globex"},
        {"tool": "read_document"},
        {"filename": "other.md"},
        {"sha256": "0" * 64},
        {"expires": "9999999999"},
        {"expires": 9_999_999_999.0},
        {"expires": True},
        {"expires": 1},  # long expired
        {"expires": 4_000_000_000},  # far more than 300 s ahead
        {"jti": "not-hex"},
        {"extra": "x"},
    ],
    ids=lambda change: "-".join(f"{k}={v!r}" for k, v in change.items()),
)
def test_no_report_without_a_valid_token(
    kit: Any, tools: DocumentTools, reports: Path, change: dict[str, Any]
) -> None:
    token = kit.sign(kit.payload("r.md", "content", **change))
    assert save(tools, filename="r.md", content="content", approval_token=token) == rejected(
        Message.APPROVAL_INVALID
    )
    assert list(reports.iterdir()) == []


def test_token_of_another_tenant_or_tampered_is_rejected(
    kit: Any, tools: DocumentTools, reports: Path
) -> None:
    other_tenant = kit.mint("r.md", "content", secret="g" * 40)
    tampered = kit.mint("r.md", "content")[:-1] + "x"
    for token in (other_tenant, tampered, "garbage", "a.b"):
        result = save(tools, filename="r.md", content="content", approval_token=token)
        assert result == rejected(Message.APPROVAL_INVALID)
    assert list(reports.iterdir()) == []


def test_replayed_token_is_rejected(kit: Any, tools: DocumentTools, reports: Path) -> None:
    jti = "ab" * 16
    assert (
        save(tools, filename="a.md", content="x", approval_token=kit.mint("a.md", "x", jti=jti))["status"]
        == "ok"
    )
    again = save(tools, filename="b.md", content="x", approval_token=kit.mint("b.md", "x", jti=jti))
    assert again == rejected(Message.APPROVAL_INVALID)
    assert not (reports / "b.md").exists()


def test_save_never_overwrites(kit: Any, tools: DocumentTools, reports: Path) -> None:
    (reports / "r.md").write_bytes(b"original")
    result = save(tools, filename="r.md", content="new", approval_token=kit.mint("r.md", "new"))
    assert result == rejected(Message.REPORT_EXISTS)
    assert (reports / "r.md").read_bytes() == b"original"


def test_write_failure_after_create_is_result_unknown(
    kit: Any, tools: DocumentTools, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Narrow fault injection: only os.fsync fails, after the file was created and written."""

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(ws.os, "fsync", failing_fsync)
    result = save(tools, filename="r.md", content="x", approval_token=kit.mint("r.md", "x"))
    assert result == {"status": "result_unknown", "message": Message.WRITE_UNKNOWN.value, "data": None}


def test_create_failure_is_failed(kit: Any, tools: DocumentTools, reports: Path) -> None:
    reports.rmdir()  # the held folder is gone: the create itself fails
    result = save(tools, filename="r.md", content="x", approval_token=kit.mint("r.md", "x"))
    assert result == {"status": "failed", "message": Message.WRITE_FAILED.value, "data": None}


# --- nothing echoed --------------------------------------------------------------------------


@pytest.mark.usefixtures("no_canary_in_logs")
def test_results_and_logs_never_echo_inputs(kit: Any, tools: DocumentTools, sources: Path) -> None:
    path, content, token, query = kit.canaries
    (sources / "doc.md").write_text(f"text with {query} inside")
    calls = [
        (tools.search_documents, {"query": query * 3}),
        (tools.search_documents, {"query": query, "max_results": path}),
        (tools.search_documents, {"query": query, path: 1}),
        (tools.read_document, {"filename": f"../{path}.md"}),
        (tools.read_document, {"filename": f"{path}.md"}),
        (tools.read_document, {"filename": path}),
        (tools.read_document, {"filename": "doc.md", path: content}),
        (tools.save_report, {"filename": f"/{path}.md", "content": content, "approval_token": token}),
        (tools.save_report, {"filename": "r.md", "content": content, "approval_token": token}),
        (tools.save_report, {"filename": "r.md", "content": content * 400, "approval_token": token}),
        (tools.save_report, {"filename": "r.md", "content": content, "approval_token": token, path: 1}),
    ]
    for body, args in calls:
        kit.assert_no_canary(json.dumps(as_dict(body(args))))
    # Successful calls carry data, but their messages stay fixed texts.
    ok_search = as_dict(tools.search_documents({"query": query}))
    assert ok_search["status"] == "ok" and ok_search["message"] == Message.SEARCHED.value
    ok_save = as_dict(
        tools.save_report(
            {"filename": "ok.md", "content": content, "approval_token": kit.mint("ok.md", content)}
        )
    )
    assert ok_save["status"] == "ok"
    kit.assert_no_canary(json.dumps(ok_save))


# --- reports are write-only ------------------------------------------------------------------

_WRITE_ONLY_PROBE = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    from server.approval import ApprovalVerifier
    from server.tools import DocumentTools
    from server.workspace import Workspace

    root, token = Path(sys.argv[1]), sys.argv[2]
    tools = DocumentTools(Workspace(root), ApprovalVerifier(os.environ["PROBE_SECRET"]), "acme")
    out = {
        "save": tools.save_report(
            {"filename": "r.md", "content": "report", "approval_token": token}
        ).model_dump(mode="json"),
        "read_locked": tools.read_document({"filename": "locked.md"}).model_dump(mode="json"),
        "search": tools.search_documents({"query": "Needle"}).model_dump(mode="json"),
    }
    for probe, action in (
        ("list_reports", lambda: os.listdir(root / "reports")),
        ("read_report", lambda: (root / "reports" / "r.md").read_bytes()),
    ):
        try:
            action()
            out[probe] = "allowed"
        except PermissionError:
            out[probe] = "denied"
    print(json.dumps(out))
    """
)


def test_reports_folder_is_never_read_or_listed(
    kit: Any, docs_root: Path, sources: Path, reports: Path
) -> None:
    """With permissions enforced, save works in a reports folder of mode 0o300 (write + search only).

    Root ignores permissions, so the probe runs as root without CAP_DAC_OVERRIDE and
    CAP_DAC_READ_SEARCH; as any other user it runs as is. A source file of mode 0 gives a
    real unreadable candidate on the way.
    """
    reports.chmod(0o300)
    (sources / "good.md").write_text("Needle")
    (sources / "locked.md").write_text("Needle")
    (sources / "locked.md").chmod(0)
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    proc = subprocess.run(
        [*drop, sys.executable, "-c", _WRITE_ONLY_PROBE, str(docs_root), kit.mint("r.md", "report")],
        cwd=kit.repo,
        env={**os.environ, "PROBE_SECRET": kit.secret},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["save"]["status"] == "ok"
    assert out["read_locked"] == {"status": "failed", "message": Message.READ_FAILED.value, "data": None}
    assert out["search"]["data"]["hits"] == [{"filename": "good.md", "excerpt": "Needle"}]
    assert out["search"]["data"]["skipped"] == 1  # the unreadable candidate
    assert out["list_reports"] == "denied"
    assert out["read_report"] == "denied"
    assert (reports / "r.md").read_bytes() == b"report"
