"""The protocol's vocabulary, at the bottom of the broker: it imports nothing of the broker.

- codec.py: the one JSON codec (strict reading of a client's body and of the broker's own
  files, lenient-to-None reading of a sandbox's messages, compact encoding)
- jsonrpc.py: JSON-RPC messages as the broker reads them, error codes, answers' envelopes
- versions.py: MCP protocol versions and `_meta` keys
- methods.py: which methods may cross the gateway, and how a method is named in the audit
- sse.py: Server-Sent Events, parsed one event at a time and framed
- answers.py: the answers the broker writes itself (results of its own, typed results)
- inbound.py: the `mcp` SDK's inbound ladder, run before routing (the SDK's answers)
"""
