"""Where a checkout keeps what the package reads (the folders next to `bcr_core/`), and how a file
is written so that no reader, and no crash, ever leaves half of it at its name."""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
NOTEBOOKS = CHECKOUT / "notebooks"
DATA = CHECKOUT / "data"
RESULTS = CHECKOUT / "results"


@contextmanager
def written_whole(path: Path) -> Iterator[Path]:
    """A sibling path to write `path`'s new content to; it takes `path`'s name only when the block
    finishes, so `path` holds the old content or the whole new one. A failed block leaves no sibling."""
    partial = path.with_name(path.name + ".partial")
    try:
        yield partial
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(path)
