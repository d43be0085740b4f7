# The document-tools server: one tenant's sandbox (DESIGN §7).
#
#   docbroker image build server                 # preferred: builds base + wheelhouse + this
#   docker build -f server.Dockerfile --build-arg BASE=python:3.11-slim CONTEXT
#
# The build context is a small temporary folder made by broker/images.py: this file,
# prune.py, bytecode.py, server-requirements.txt, wheelhouse/ and server/. Nothing is fetched from the
# network during the build (containers on these hosts cannot reach PyPI; air-gapped users
# neither): every dependency comes from the wheelhouse built on the host.
ARG BASE=docbroker-base:bookworm

FROM ${BASE} AS build
COPY wheelhouse/ /wheelhouse/
COPY server-requirements.txt prune.py umask.pth /build/
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/python -m pip install --no-index --find-links /wheelhouse --no-compile \
        --disable-pip-version-check -q -r /build/server-requirements.txt \
 && /opt/venv/bin/python /build/prune.py venv /opt/venv
COPY server/ /build/server/
# The server package goes into the venv's site-packages: `python -m server` then works from
# any working directory and needs no PYTHONPATH.
RUN site="$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
 && cp -r /build/server "$site/server" \
 && cp /build/umask.pth "$site/docbroker-umask.pth" \
 && find "$site/server" -name __pycache__ -prune -exec rm -rf {} + \
 && /opt/venv/bin/python -m compileall -q -j 0 -o 2 --invalidation-mode unchecked-hash /opt/venv >/dev/null
# unchecked-hash: the root fs is read-only and never changes, so Python need not stat sources
# to validate its caches, and it can never try (and fail) to write new ones. Level 2 only:
# the server runs with -OO (see ENTRYPOINT); anything else run in the image reads the sources.

FROM ${BASE}
COPY --from=build /opt/venv /opt/venv
COPY prune.py bytecode.py /
RUN ["/opt/venv/bin/python", "/prune.py", "runtime"]
RUN ["/opt/venv/bin/python", "-B", "-OO", "/bytecode.py"]
# uid 10001 with gid 0: in a rootless daemon container gid 0 is the host user's own gid, so
# the broker (that user) can read reports created with mode 0o240 (owner write-only, group
# read) while the sandbox, the owner, cannot read them back (seccomp forbids chmod).
USER 10001:0
WORKDIR /
ENV PATH=/opt/venv/bin:/usr/bin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MALLOC_ARENA_MAX=2 \
    DOCS_ROOT=/srv/docs \
    DOCS_SECRET_FILE=/run/secrets/approval.key
# -OO: no docstrings or asserts in memory, ~2.5 MiB less per idle sandbox. The tools' published
# schemas do not depend on docstrings (tests/server/test_contracts_optimized.py checks it).
ENTRYPOINT ["/opt/venv/bin/python", "-OO", "-m", "server", "--socket", "/run/docs/mcp.sock"]
