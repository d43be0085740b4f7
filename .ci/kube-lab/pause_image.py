"""Build the pod sandbox (pause) image offline: compile Kubernetes' pause.c statically and pack it
as a docker-archive tar that `ctr images import` takes (there is no registry to pull it from).

    python3 pause_image.py PAUSE_C IMAGE_NAME OUT_TAR
"""

import hashlib
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    tar.addfile(info, io.BytesIO(data))


def main(pause_c: str, image: str, out: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "pause"
        subprocess.run(
            ["gcc", "-Os", "-static", "-Wall", "-DVERSION=v3.4.1-docbroker", "-o", str(binary), pause_c],
            check=True,
        )
        subprocess.run(["strip", str(binary)], check=True)
        layer_buf = io.BytesIO()
        with tarfile.open(fileobj=layer_buf, mode="w", format=tarfile.PAX_FORMAT) as layer:
            _add(layer, "pause", binary.read_bytes(), 0o755)
        layer_bytes = layer_buf.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created_by": "docbroker kube-lab pause_image.py"}],
        },
        sort_keys=True,
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    layer_name = diff_id.removeprefix("sha256:") + "/layer.tar"
    repo, _, tag = image.rpartition(":")
    manifest = json.dumps([{"Config": config_name, "RepoTags": [image], "Layers": [layer_name]}]).encode()
    with tarfile.open(out, "w") as tar:
        _add(tar, config_name, config)
        _add(tar, layer_name, layer_bytes)
        _add(tar, "manifest.json", manifest)
        _add(tar, "repositories", json.dumps({repo: {tag: diff_id.removeprefix("sha256:")}}).encode())


if __name__ == "__main__":
    main(*sys.argv[1:4])
