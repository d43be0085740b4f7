"""The supply chain of the sandbox image (DESIGN §13, docs/supply-chain.md).

- `provenance`: the signed in-toto statement over an image's digest (DSSE, Ed25519), the
  release keys, and where a build keeps its records.
"""
