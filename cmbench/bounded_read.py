"""Reading files CMBench did not write: regular files only, each kind under a stated size limit.

Run folders, score folders, manifests, datasets and videos may come from someone else (docs/runs.md,
"Trust" and "Reading limits"). Every read of such a file goes through this module:

- the file is opened with ``O_NONBLOCK`` (a FIFO cannot hang the open) and the *opened descriptor* is
  checked to be a regular file (a FIFO, a device such as ``/dev/zero``, a directory, or a link to one
  of them is refused);
- its size is checked against the limit of its kind (:data:`LIMITS`) before anything is read, and no
  more than the limit is ever read (a file that grows meanwhile is still bounded);
- an ``.npz`` array's declared shape x dtype is checked in its header before it is decompressed, and a
  video's declared frame size and frame count against a decode budget before it is decoded.

Over a limit, :class:`ReadLimitError` says so in one line naming the file, its size and the limit.
"""

from __future__ import annotations

import os
import stat
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from cmbench.errors import CMBenchError

MiB = 2**20
GiB = 2**30
LIMITS: dict[str, int] = {  # the kinds of files CMBench reads from folders it did not write -> their limit in bytes
    "records line": 16 * MiB,  # one task record (records*.jsonl is read a line at a time)
    "config": 4 * MiB,  # a folder's config.yaml
    "build record": 1 * MiB,  # a MiniWorld suite's build.json (a few kilobytes)
    "run file": 1 * MiB,  # a run directory's run.json
    "summary": 64 * MiB,  # summary.json
    "calibration log": 16 * MiB,  # <out_dir>/calibration/*.json
    "manifest": 256 * MiB,  # metadata.jsonl
    "marker": 1 * MiB,  # an output folder's .cmbench-written.json (the top-level names CMBench wrote there)
    "table": 64 * MiB,  # a CSV table a command wrote and another reads (curves.csv, leaderboard.csv)
    "lock": 4096,  # a records file's lock (one line: host, process id, start time), never read through a link
    "dataset pin": 16 * MiB,  # a dataset's cmbench-dataset.json (its hub commit, one hash per video)
    "hash cache": 64 * MiB,  # .cache/video_hashes.json (a content hash per video path, size and mtime)
    "leaderboard json": 64 * MiB,  # a received leaderboard.json (a board's rows with their identities)
    "context array": 1 * GiB,  # an .npz of a dataset (MiniWorld's lossless contexts): the arrays' declared bytes
}
FRAME_PIXELS = 7680 * 4320  # the largest frame decoded (8K UHD): one frame of a streamed video is held at a time
DECODE_BUDGET = 4 * GiB  # the most bytes of frames one whole-video decode holds (uint8 [F, H, W, 3])
GROWTH_BLOCK = 1 << 20  # a file that grows while it is read is read on in blocks of this many bytes


class ReadLimitError(CMBenchError):
    """A file is not a regular file, or is larger than its kind's limit."""


def size_text(size: int) -> str:
    """``6442450944 -> "6.0 GiB"``: a size for a message."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


def _what(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str | Path, follow_links: bool = True) -> int:
    """A read-only descriptor of ``path``, checked to be a regular file (links followed, then the opened
    file checked: a link to a FIFO or a device is refused too; ``follow_links=False``: a link is refused,
    ``OSError`` with ``errno.ELOOP``).

    Raises
    ------
    ReadLimitError
        ``path`` is a FIFO, a device, a directory or a socket.
    OSError
        It cannot be opened (``FileNotFoundError`` when absent).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW))
    except IsADirectoryError:
        raise ReadLimitError(f"{path}: is a directory, not a file") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ReadLimitError(f"{path}: is {_what(mode)}, not a regular file: CMBench reads only regular files")
    os.set_blocking(fd, True)
    return fd


def over_limit(path: str | Path, size: int, kind: str, limit: int | None = None) -> ReadLimitError:
    """The one-line error of a ``kind`` file of ``size`` bytes over its limit."""
    limit = LIMITS[kind] if limit is None else limit
    return ReadLimitError(f"{path}: {size_text(size)}, over the {size_text(limit)} limit of a {kind} "
                          f"(docs/runs.md, Reading limits)")


def read_bytes(path: str | Path, kind: str, follow_links: bool = True) -> bytes:
    """The content of a regular file of ``kind`` (a key of :data:`LIMITS`), at most its limit (a link
    refused with ``follow_links=False``, :func:`open_regular`).

    Raises
    ------
    ReadLimitError
        Not a regular file, or larger than the limit (checked before reading, and again while reading).
    OSError
        It cannot be opened or read (``FileNotFoundError`` when absent).
    """
    limit = LIMITS[kind]
    fd = open_regular(path, follow_links)
    with os.fdopen(fd, "rb") as handle:
        size = os.fstat(fd).st_size
        if size > limit:
            raise over_limit(path, size, kind)
        data = handle.read(size + 1)  # sized by the file (a read of the limit allocates the limit)
        grew = len(data) > size  # since it was measured: read on in blocks, to the limit
        while grew and len(data) <= limit and (more := handle.read(min(GROWTH_BLOCK, limit + 1 - len(data)))):
            data += more
    if len(data) > limit:
        raise over_limit(path, max(len(data), size), kind)
    return data


def read_text(path: str | Path, kind: str, errors: str = "strict") -> str:
    """:func:`read_bytes` decoded as UTF-8 (``UnicodeDecodeError`` unless ``errors`` says otherwise)."""
    return read_bytes(path, kind).decode("utf-8", errors)


def read_optional_text(path: str | Path, kind: str) -> str | None:
    """:func:`read_text`, or None when nothing is at ``path`` (a dangling link counts as nothing)."""
    try:
        return read_text(path, kind)
    except FileNotFoundError:
        return None


def read_lines(path: str | Path, kind: str = "records line") -> Iterator[tuple[int, bytes, bool]]:
    """The lines of a regular file, one at a time, each at most ``kind``'s limit.

    Yields
    ------
    (number, line, complete)
        The 1-based line number, its bytes without the newline, and whether a newline ended it (only
        the last line can lack one: a torn write).

    Raises
    ------
    ReadLimitError
        Not a regular file, or a line longer than the limit (nothing past it is read).
    """
    limit = LIMITS[kind]
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as handle:
        number = 0
        while True:
            line = handle.readline(limit + 1)
            if not line:
                return
            number += 1
            complete = line.endswith(b"\n")
            if len(line) - complete > limit:
                raise ReadLimitError(f"{path}:{number}: a line of more than {size_text(limit)}, over the limit of "
                                     f"a {kind} (docs/runs.md, Reading limits)")
            yield number, line[:-1] if complete else line, complete


def npz_arrays(path: str | Path, names: tuple[str, ...] | None = None,
               kind: str = "context array") -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` (all, or ``names``), each header checked before it is decompressed:
    their declared bytes (shape x dtype) together at most ``kind``'s limit; no pickled objects.

    Raises
    ------
    ReadLimitError
        Not a regular file, or arrays declaring more bytes than the limit.
    KeyError
        A name the file does not hold.
    ValueError, zipfile.BadZipFile, EOFError
        Not a readable npz (a header that is not an array's, object arrays).
    """
    limit = LIMITS[kind]
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as handle, zipfile.ZipFile(handle) as archive:
        members = {info.filename.removesuffix(".npy"): info for info in archive.infolist()}
        wanted = list(members) if names is None else list(names)
        declared = 0
        for name in wanted:
            if name not in members:
                raise KeyError(f"{name} is not a file in the archive")
            with archive.open(members[name]) as member:
                shape, dtype = _npy_header(member)
            declared += int(np.prod(shape, dtype=object)) * dtype.itemsize
            if declared > limit:
                raise ReadLimitError(f"{path}: its arrays declare {size_text(declared)} ({name}: {dtype} "
                                     f"{list(shape)}), over the {size_text(limit)} limit of a {kind} "
                                     f"(docs/runs.md, Reading limits)")
        arrays = {}
        for name in wanted:
            with archive.open(members[name]) as member:
                arrays[name] = np.lib.format.read_array(member, allow_pickle=False)
        return arrays


def _npy_header(member) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype an ``.npy`` stream's header declares (only the header is read)."""
    version = np.lib.format.read_magic(member)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(member)
    elif version == (2, 0):
        shape, _, dtype = np.lib.format.read_array_header_2_0(member)
    else:
        raise ValueError(f"npy format version {version} is not read")
    if dtype.hasobject:
        raise ValueError("object arrays are not read (they would unpickle)")
    return shape, dtype


def check_decode(path: str | Path, height: int, width: int, frames: int | None) -> None:
    """Refuse a video whose declared frame size, or frame size x frame count (``frames``: None when
    only one frame at a time is held), is over :data:`FRAME_PIXELS` or :data:`DECODE_BUDGET`.

    Raises
    ------
    ReadLimitError
        One line naming the video, what it declares and the limit.
    """
    if height * width > FRAME_PIXELS:
        raise ReadLimitError(f"{path}: declares {width}x{height} frames, over the {FRAME_PIXELS:,}-pixel limit of a "
                             f"decoded frame (docs/runs.md, Reading limits)")
    if frames is not None and frames * height * width * 3 > DECODE_BUDGET:
        raise ReadLimitError(f"{path}: declares {frames} frames of {width}x{height} "
                             f"({size_text(frames * height * width * 3)} decoded), over the "
                             f"{size_text(DECODE_BUDGET)} decode budget of a video (docs/runs.md, Reading limits)")
