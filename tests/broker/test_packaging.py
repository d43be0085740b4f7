"""What ships (issue 24, item 26): the test harness stays out of the wheel, and so out of the
broker image, which installs that wheel (deploy/broker.Dockerfile).

`broker/testing/` mints tokens with a signing key of its own and starts lab and replica
subprocesses: in a production venv it is code nobody reviewed as product, on the import
path of every broker. The wheel is built the way `docbroker image build` builds it
(`broker.images.build_docbroker_wheel`, pip with the locked setuptools, no build isolation),
from a clean copy of the sources, so nothing an earlier build left in `build/` can ride along.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from broker.images import build_docbroker_wheel


def test_the_wheel_holds_the_product_and_not_the_test_harness(tmp_path: Path) -> None:
    lines: list[str] = []
    wheel = build_docbroker_wheel(tmp_path, lines.append)
    names = zipfile.ZipFile(wheel).namelist()
    assert [n for n in names if n.startswith("broker/testing")] == []
    # and still the product: the CLI, the keeper of the tenant Pods, the page's files, the server
    product = (
        "broker/cli/__init__.py",
        "broker/cli/serve.py",
        "broker/keeper/__main__.py",
        "server/__main__.py",
    )
    for expected in product:
        assert expected in names
    assert any(n.startswith("broker/web/static/") for n in names)
