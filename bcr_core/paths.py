"""Where a checkout keeps what the package reads (the folders next to `bcr_core/`), and how a file
is written so that no reader, and no crash, ever leaves half of it at its name."""

import errno
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from bcr_core.errors import UsageError

CHECKOUT = Path(__file__).resolve().parent.parent
NOTEBOOKS = CHECKOUT / "notebooks"
DATA = CHECKOUT / "data"
RESULTS = CHECKOUT / "results"

# What a disk or a folder can refuse a writer: full, past the file-size limit or the quota, read-only,
# not a folder. Any other OSError keeps its traceback.
REFUSED = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR}
REFUSED |= {errno.EEXIST, errno.EISDIR}
PARTIAL = re.compile(r"\.(\d+)-[0-9a-f]{8}\.partial")  # in a sibling's name, before the suffix


class WriteError(UsageError):
    """A file could not be written (a full disk, a folder that cannot be written); what was at its
    name is as it was."""


@contextmanager
def written_whole(path: Path) -> Iterator[Path]:
    """A sibling path to write `path`'s new content to; it takes `path`'s name only when the block
    finishes, so `path` holds the old content or the whole new one. A failed block leaves no sibling.
    Writers running at once (two lanes fetching the model on first use) each write their own sibling,
    and the last to finish gives `path` its content. The block may make the sibling a directory (a
    converted model): it then replaces the directory at `path`. See `all_written_whole` for the rest."""
    with all_written_whole([path]) as (partial,):
        yield partial


@contextmanager
def all_written_whole(paths: list[Path]) -> Iterator[list[Path]]:
    """`written_whole` for several files that belong together (an export's three): one sibling per
    path, and every path takes its new content only once the block has written them all, so a
    failure leaves each as it was (so does a sibling the block never made). Folders missing on the
    way are made (and removed again on a failure); siblings a killed writer left are removed. A full
    disk or a folder that cannot be written is a WriteError naming the folder and the cause."""
    paths, made, partials = [Path(p) for p in paths], [], []
    try:
        for path in paths:
            make_folders(path.parent, made)
            remove_stale_partials(path)
        partials = [partial_sibling(p) for p in paths]
        yield partials
        for partial, path in zip(partials, paths):
            move(partial, path)
    except BaseException as err:
        for partial in partials:
            remove(partial)
        for folder in reversed(made):
            with suppress(OSError):  # left where another writer put something in it meanwhile
                folder.rmdir()
        if isinstance(err, OSError) and err.errno in REFUSED:
            raise write_error(paths, err) from None
        raise


@contextmanager
def held_exclusively(lock: Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """An exclusive `flock` on the file `lock` for the block: processes doing the same first-time work (two
    lanes converting a model into an empty cache, two kernels rebuilding shared caches) take turns, and the
    later ones find the work done. `on_wait` is called once when another process holds it."""
    import fcntl

    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as held:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(held, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


def write_text_whole(path: Path, text: str) -> None:
    """`text` at `path`, written whole (`written_whole`)."""
    with written_whole(path) as partial:
        partial.write_text(text, encoding="utf-8")


def write_error(paths: list[Path], err: OSError) -> WriteError:
    folders = ", ".join(dict.fromkeys(str(p.parent) for p in paths))
    names = ", ".join(p.name for p in paths)
    return WriteError(
        f"{folders}: cannot write {names} ({err.strerror or err}); nothing there was changed: "
        "free space or give a folder you can write, then run again"
    )


def make_folders(folder: Path, made: list[Path]) -> None:
    """Make `folder` and its missing parents, outermost first, adding each to `made` once made."""
    for f in [f for f in [folder, *folder.parents] if not f.exists()][::-1]:
        f.mkdir()
        made.append(f)


def move(partial: Path, path: Path) -> None:
    """`partial` to `path`'s name; a sibling never made (a block that wrote nothing) leaves `path` as it was."""
    if not partial.exists():
        return
    if partial.is_dir():
        shutil.rmtree(path, ignore_errors=True)
        partial.rename(path)
    else:
        partial.replace(path)


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def partial_sibling(path: Path) -> Path:
    """A name beside `path` that no other writer, in this process or another, is using; it keeps
    `path`'s suffix, for writers that read it (papermill's `.ipynb`)."""
    return path.with_name(f"{path.stem}.{os.getpid()}-{uuid.uuid4().hex[:8]}.partial{path.suffix}")


def remove_stale_partials(path: Path) -> None:
    """The siblings of `path` whose writer was killed before it finished (its process is gone)."""
    if not path.parent.is_dir():
        return
    for sibling in path.parent.iterdir():
        found = PARTIAL.search(sibling.name)
        ours = found and (sibling.name[: found.start()], sibling.name[found.end() :]) == (path.stem, path.suffix)
        if ours and not process_alive(int(found.group(1))):
            remove(sibling)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def utf8_text(path: Path, expected: str) -> str:
    """The file's text; a file that is not UTF-8 (a gzip'd one, say) is a UsageError naming it and
    `expected`, what it should hold. OSErrors (a missing file) are left to the caller."""
    raw = Path(path).read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        gzipped = ", it is gzip'd" if raw[:2] == b"\x1f\x8b" else ""
        raise UsageError(f"{path} is not UTF-8 text (byte {err.start}{gzipped}); expected {expected}") from None
