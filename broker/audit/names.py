"""The names the broker writes into `method`, `tool`, `arg_names` and `header_names`, and the form
of its `reason` codes: what a reader of a log (the OCSF export) may pass on as it is.

The schema's validators check a name's shape only (`[A-Za-z0-9_./-]{1,128}`): `q3-layoffs.md` is
a fine shape. The broker itself writes only names it knows (anything a client or a sandbox
invents becomes `other`, broker/gateway/record.py), so a log in which `tool` holds a file name was
rewritten by someone, and a reader that hands names on to another system (a SIEM) checks them
against the same lists: the broker's promise that a name never carries a value then holds for
what leaves through the export too.

The lists are built from where the broker takes its names (the tools' contracts, the MCP method
table), so a tool or method added there is known here at once.
"""

from __future__ import annotations

import re
from typing import Final

from broker.protocol.methods import MCP_METHODS
from server import contracts as c

OTHER: Final = "other"

# Besides MCP's methods: the REST API's and the surfaces an Origin refusal names (broker/origin.py).
METHODS: Final = MCP_METHODS | frozenset({OTHER, "approvals", "approvals_page", "mcp"})
TOOLS: Final = frozenset({*c.TOOL_NAMES, OTHER})
# An argument name is known only for the tool that declares it, as the gateway records it.
ARGS_BY_TOOL: Final = {
    tool: frozenset({*model.model_fields, OTHER}) for tool, model in c.INPUT_MODELS.items()
}
# `Mcp-Param-*` headers the contracts declare (`x-mcp-header`), spelt as the gateway records them.
HEADERS: Final = frozenset(
    {
        f"mcp-param-{header}".title()
        for tool in c.TOOL_NAMES
        for prop in c.input_schema(tool).get("properties", {}).values()
        if isinstance(header := prop.get("x-mcp-header"), str)
    }
    | {OTHER}
)
# Reason codes are fixed snake_case words in the code (`tool_not_allowed`, `upstream_no_answer`),
# coming from many places (auth, policy, runtimes, approvals): their form is checked, which leaves
# no room for a file's extension, a path, a space or an upper-case letter.
_REASON = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*")
MAX_REASON_CHARS: Final = 64


def known(value: object, names: frozenset[str]) -> str:
    """`value` when it is one of `names`, else `other`."""
    return value if type(value) is str and value in names else OTHER


def known_list(value: object, names: frozenset[str]) -> list[str]:
    """Each item that is one of `names`, the rest as one `other`; sorted, as the writer keeps them."""
    items = value if type(value) is list else [value]
    return sorted({known(item, names) for item in items})


def reason_code(value: object) -> str:
    """`value` when it has the form of the broker's reason codes, else `other`."""
    ok = type(value) is str and len(value) <= MAX_REASON_CHARS and _REASON.fullmatch(value)
    return value if ok and isinstance(value, str) else OTHER
