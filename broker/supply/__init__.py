"""The supply chain of the sandbox image (DESIGN §13, docs/supply-chain.md).

- `provenance`: the signed in-toto statement over an image's digest (DSSE, Ed25519), the
  release keys, and where a build keeps its records;
- `content`: an image's file tree read back from the daemon: its content digest (two builds
  of the same inputs share it) and the packages installed in it;
- `sbom`: the CycloneDX SBOM made from that, and the check that an SBOM agrees with an image;
- `records`: what `docbroker image build` records about an image, and `image verify` checks.
"""
