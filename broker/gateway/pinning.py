"""The pinned contract in use: first listing and pinning, the `tools/list` answer from the pin,
and the replacement of a sandbox whose contract changed (broker.gateway.contract keeps pins)."""

from __future__ import annotations

import logging
from typing import Any, NoReturn

from broker.audit import AuditEvent
from broker.audit.fields import sandbox_field
from broker.errors import Denial, Denied
from broker.gateway import listing
from broker.gateway.admission import Admission, admit
from broker.gateway.breaker import CircuitBreakers
from broker.gateway.contract import ContractPins, Pin
from broker.gateway.responder import AuditLike
from broker.gateway.tools_filter import visible_tools
from broker.policy import Call, Decider
from broker.protocol import jsonrpc as rpc
from broker.protocol.versions import LEGACY
from broker.runtime.lifecycle import Runtime
from broker.types import Principal, RunningSandbox, TenantId
from broker.upstream import Upstream
from server import contracts as c

log = logging.getLogger("docbroker.gateway")


class Pinning:
    def __init__(
        self,
        *,
        pins: ContractPins,
        runtime: Runtime,
        breakers: CircuitBreakers,
        engine: Decider,
        audit: AuditLike,
    ) -> None:
        self._pins = pins
        self._runtime = runtime
        self._breakers = breakers
        self._engine = engine
        self._audit = audit

    def pinned_without(self, tenant: TenantId, tool: str) -> bool:
        """Was the tenant's running sandbox pinned without this tool?"""
        sandbox = self._runtime.get(tenant)
        if sandbox is None:
            return False
        pin = self._pins.get(tenant, sandbox.backend_id)
        return pin is not None and tool not in pin.admission.tools

    async def pinned(self, tenant: TenantId, sandbox: RunningSandbox, client: Upstream) -> Pin:
        """The contract pinned for this sandbox instance, listing and pinning it on first use."""
        pin = self._pins.get(tenant, sandbox.backend_id)
        if pin is None:
            admission = await _list_and_admit(client)
            pin = self._pins.pin(tenant, sandbox.backend_id, admission)
            for tool, reason in admission.rejected:
                await self._audit.emit(
                    AuditEvent.TOOLS_REJECTED, tenant=tenant, sandbox=sandbox_field(sandbox.backend_id),
                    tool=tool if tool in c.TOOL_NAMES else None, reason=reason, outcome="rejected",
                )  # fmt: skip
        if pin.broken:
            await self._replace_changed(tenant, sandbox)
        return pin

    async def tools_list(
        self,
        principal: Principal,
        msg: rpc.RpcMessage,
        session: tuple[str, str] | None,
        sandbox: RunningSandbox,
        client: Upstream,
        pin: Pin,
        request_id: str,
    ) -> dict[str, Any]:
        """The answer to `tools/list`, from the pin, after a fresh listing shows the sandbox
        still offers the same. `session`: the legacy session (its id, protocol) it belongs to."""
        if session is not None and not await listing.session_alive(client, *session):
            raise Denied(Denial.SESSION_NOT_FOUND, "session_ended")
        fresh = await _list_and_admit(client)
        if not self._pins.matches(pin, fresh):
            await self._audit.emit(
                AuditEvent.CONTRACT_CHANGED, tenant=principal.tenant, subject=principal.subject,
                sandbox=sandbox_field(sandbox.backend_id), request_id=request_id, outcome="denied",
                reason="descriptors_changed",
            )  # fmt: skip
            await self._replace_changed(principal.tenant, sandbox)
        protocol = msg.protocol_version

        def may_call(tool: str) -> bool:
            return self._engine.decide(Call(principal, tool, protocol=protocol)).allowed

        tools = visible_tools(list(pin.admission.tools.values()), may_call)
        result: dict[str, Any] = {"tools": tools}
        if msg.protocol_version is not None:
            result.update(resultType="complete", ttlMs=0, cacheScope="private")
        return rpc.result(msg.id, result)

    async def _replace_changed(self, tenant: TenantId, sandbox: RunningSandbox) -> NoReturn:
        """A sandbox whose contract changed is no longer the program that was admitted: it is
        replaced at once, and the breaker held open for its cool-down, so the successor starts
        (and is pinned afresh) with the first call after it, and a sandbox that keeps
        changing is not restarted on every call. This call is refused."""
        self._pins.forget(tenant, sandbox.backend_id)
        self._breakers.trip(tenant)
        try:
            await self._runtime.replace(tenant, sandbox.backend_id, reason="contract_changed")
        except Exception as exc:  # the engine refused: the successor is pinned afresh all the same
            log.warning("a changed sandbox could not be removed", extra={"error": type(exc).__name__})
        wait = max(1, self._breakers.cooldown_left(tenant))
        raise Denied(Denial.CONTRACT_CHANGED, "contract_changed", retry_after=wait)


async def _list_and_admit(client: Upstream) -> Admission:
    tools, problems = await listing.list_all_tools(client)
    admission = admit(tools)
    admission.rejected.extend(("-", problem) for problem in problems)
    return admission


def legacy_session(headers: dict[str, str], sealed_session: str | None) -> tuple[str, str] | None:
    """The sandbox's session id and protocol of a session-era request, if it is one."""
    if sealed_session is None:
        return None
    return headers["mcp-session-id"], headers.get("mcp-protocol-version", LEGACY)
