"""Where a checkout keeps what the package reads (the folders next to `bcr_core/`), and how a file
is written so that no reader, and no crash, ever leaves half of it at its name."""

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bcr_core.errors import UsageError

CHECKOUT = Path(__file__).resolve().parent.parent
NOTEBOOKS = CHECKOUT / "notebooks"
DATA = CHECKOUT / "data"
RESULTS = CHECKOUT / "results"


@contextmanager
def written_whole(path: Path) -> Iterator[Path]:
    """A sibling path to write `path`'s new content to; it takes `path`'s name only when the block
    finishes, so `path` holds the old content or the whole new one. A failed block leaves no sibling.
    Writers running at once (two lanes fetching the model on first use) each write their own sibling,
    and the last to finish gives `path` its content. The block may make the sibling a directory (a
    converted model): it then replaces the directory at `path`."""
    partial = partial_sibling(path)
    try:
        yield partial
    except BaseException:
        if partial.is_dir():
            shutil.rmtree(partial)
        else:
            partial.unlink(missing_ok=True)
        raise
    if partial.is_dir():
        shutil.rmtree(path, ignore_errors=True)
        partial.rename(path)
    else:
        partial.replace(path)


def partial_sibling(path: Path) -> Path:
    """A name beside `path` that no other writer, in this process or another, is using."""
    return path.with_name(f"{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.partial")


def utf8_text(path: Path, expected: str) -> str:
    """The file's text; a file that is not UTF-8 (a gzip'd one, say) is a UsageError naming it and
    `expected`, what it should hold. OSErrors (a missing file) are left to the caller."""
    raw = Path(path).read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        gzipped = ", it is gzip'd" if raw[:2] == b"\x1f\x8b" else ""
        raise UsageError(f"{path} is not UTF-8 text (byte {err.start}{gzipped}); expected {expected}") from None
