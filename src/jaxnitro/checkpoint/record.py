"""The checkpoint record: one `.safetensors` file per checkpoint, no pickle anywhere.

Arrays are stored flat under `<tree>/<keypath>` keys (`params/['Dense_0']['kernel']`,
`opt_state/...`, `device/<field>`); the rest of the record (step, epoch, seed, preset,
config, metrics, stop_reason, run ids, logger state, versions) is a `RecordHeader`
(`header.py`), JSON in the safetensors metadata under the `jaxnitro` key, so
`checkpoint_info` reads it without loading a weight.
Restoring fills a template tree (what `build_model` or the optimizer builds) leaf for
leaf by key path, so no tree structure is ever deserialized from the file: a checkpoint
from an untrusted source cannot run code.

Writes go to a temporary file in the same directory, are fsynced, then renamed into
place: a crash at any instant leaves either the old file or the new one. Temporary
names start with `.tmp-` and never end in `.safetensors`, so a leftover one is never
mistaken for a record. Records and the manifest get the permissions the process umask
gives any new file (`-rw-r--r--` under the usual 022), not mkstemp's `-rw-------` nor
the `-rw-------` of the file safetensors' `save_file` puts in its place: the mode is
set on the file as the writer left it, just before the rename.

A file that is truncated, has a corrupted header, was written by another program, is
not a safetensors file at all, or whose record header `RecordHeader.from_json` refuses
raises `CheckpointError` naming the file and what is wrong, before any library parses
its arrays.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import re
import shutil
import stat
import struct
import tempfile
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from ..errors import CheckpointError
from ..json_bounds import json_depth
from .compat import check_record_tree_compatible
from .header import RecordHeader
from .io_retry import is_transient_io, with_io_retry
from .modes import new_file_mode
from .paths import checked_path

_META_KEY = "jaxnitro"
_KEY_DATA_SUFFIX = "#prng_key_data"
TMP_PREFIX = ".tmp-"
_MAX_HEADER = 100_000_000  # safetensors' own limit on the header
# The deepest JSON a record header or manifest may nest; a record's config and
# metrics nest a few levels, and Python's parser recurses once per level.
MAX_JSON_DEPTH = 64


def atomic_write(
    path: str, write: Callable[[str], None], *, prefix: str = TMP_PREFIX
) -> None:
    """Write `path` through a temporary file, fsynced and renamed into place.

    `write(tmp)` fills the temporary file (or replaces it). The file then gets
    the mode the process umask gives a new file (0o666 & ~umask), whatever `write`
    created it with. A transient I/O error retries the whole sequence (see
    `with_io_retry`); any other error removes the temporary file.
    """
    with_io_retry(
        lambda: _atomic_write_once(path, write, prefix), what=f"writing {path}"
    )


def _atomic_write_once(path: str, write: Callable[[str], None], prefix: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=prefix, dir=directory)
    os.close(handle)
    try:
        write(tmp)
        # mkstemp creates the file -rw-------, and a writer may replace the file
        # (safetensors' save_file does, with its own -rw-------): set the mode on
        # what `write` left. A record is a file like any other, readable as the
        # process umask allows (a team shares a run directory).
        os.chmod(tmp, new_file_mode())
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def _host_array(leaf: Any) -> tuple[np.ndarray, str | None]:
    if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(
        leaf.dtype, jax.dtypes.prng_key
    ):
        impl = str(jax.random.key_impl(leaf))
        return np.asarray(jax.random.key_data(leaf)), impl
    # A non-contiguous array would be saved wrong; np.require keeps 0-d arrays 0-d.
    return np.require(np.asarray(leaf), requirements="C"), None


def flatten_tree(
    prefix: str, tree: Any
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """A tree's leaves as host arrays keyed `<prefix>/<keypath>`, and PRNG key impls."""
    arrays: dict[str, np.ndarray] = {}
    key_impls: dict[str, str] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = f"{prefix}/{jax.tree_util.keystr(path)}"
        array, impl = _host_array(leaf)
        if impl is not None:
            key_impls[name] = impl
            name += _KEY_DATA_SUFFIX
        arrays[name] = array
    return arrays, key_impls


def save_record(
    path: str,
    trees: Mapping[str, Any],
    header: RecordHeader,
    *,
    tmp_prefix: str = TMP_PREFIX,
) -> None:
    """Write a record: each tree in `trees` under its prefix, `header` as its header
    with `prng_keys` naming the key implementation of each PRNG key leaf."""
    arrays: dict[str, np.ndarray] = {}
    key_impls: dict[str, str] = {}
    for prefix, tree in trees.items():
        tree_arrays, tree_impls = flatten_tree(prefix, tree)
        arrays.update(tree_arrays)
        key_impls.update(tree_impls)
    header = dataclasses.replace(header, prng_keys=key_impls)
    write_arrays(path, arrays, header, tmp_prefix=tmp_prefix)


def write_arrays(
    path: str,
    arrays: Mapping[str, np.ndarray],
    header: RecordHeader,
    *,
    tmp_prefix: str = TMP_PREFIX,
) -> None:
    """Write flat `arrays` (keys as `save_record` names them), `header` atomically.

    Raises:
        CheckpointError: the disk or quota is full or the file too large, naming
            the path, the bytes the record needs and the bytes free; the partial
            file is removed first.
        OSError: any other write failure (a transient one is retried first).
    """
    text = _header_text(header)
    host = {k: np.require(np.asarray(v), requirements="C") for k, v in arrays.items()}
    _write_with_room(
        path,
        lambda tmp: save_file(host, tmp, metadata={_META_KEY: text}),
        needed=8 + len(text) + sum(a.nbytes for a in host.values()),
        prefix=tmp_prefix,
    )


def _write_with_room(
    path: str, write: Callable[[str], None], *, needed: int, prefix: str
) -> None:
    """`atomic_write`, with a write that finds no room (`space_errno`) raised as
    CheckpointError naming the path, the `needed` bytes and the bytes free."""
    try:
        atomic_write(path, write, prefix=prefix)
    except (OSError, SafetensorError) as error:
        code = space_errno(error)
        if code is None:
            raise
        # atomic_write removed its temporary file: the earlier records are intact.
        raise CheckpointError(
            NO_SPACE.format(
                path=path,
                reason=os.strerror(code),
                needed=_bytes(needed),
                free=_bytes(free_bytes(os.path.dirname(os.path.abspath(path)))),
            )
        ) from error


NO_SPACE = """\
Cannot write the checkpoint {path}: {reason}. The record needs about {needed}; the \
file system holding it has {free} free. The partial file was removed and the run's \
earlier records are intact. Free space on that disk (or raise its quota), or pass a \
run_dir on a larger one, then resume."""

# The errors a checkpoint write meets when its disk (or quota, or file size limit)
# has no room: the same write fails again until space is freed.
SPACE_ERRNOS = frozenset(
    code
    for code in (errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", None))
    if code is not None
)

# safetensors reports an I/O error as a SafetensorError whose text ends "(os error N)".
_OS_ERROR_CODE = re.compile(r"\(os error (\d+)\)")


def space_errno(error: BaseException) -> int | None:
    """The errno of `error` when it says the disk or quota is full or the file too
    large (an OSError, or safetensors' error wrapping one); else None.

    Examples:
        >>> import errno
        >>> space_errno(OSError(errno.ENOSPC, "full")) == errno.ENOSPC
        True
        >>> space_errno(OSError(errno.EACCES, "denied")) is None
        True
    """
    if isinstance(error, OSError):
        return error.errno if error.errno in SPACE_ERRNOS else None
    if isinstance(error, SafetensorError):
        found = _OS_ERROR_CODE.search(str(error))
        if found is not None and int(found.group(1)) in SPACE_ERRNOS:
            return int(found.group(1))
    return None


def free_bytes(directory: str) -> int | None:
    """The bytes free to this process on `directory`'s file system, or None when
    they cannot be read."""
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


def _bytes(count: int | None) -> str:
    """`4,000,512 bytes (3.8 MiB)`, or "an unknown amount" for None."""
    if count is None:
        return "an unknown amount"
    return f"{count:,} bytes ({count / 2**20:.1f} MiB)"


def _header_text(header: RecordHeader) -> str:
    return json.dumps(header.to_json(), default=_json_default)


def _json_default(value: Any) -> Any:
    if isinstance(value, np.ndarray | np.generic):
        array = np.asarray(value)
        return array.item() if array.ndim == 0 else array.tolist()
    return repr(value)


def json_object(
    text: str | bytes,
    invalid: Callable[[Exception], str],
    not_object: Callable[[str], str],
) -> dict[str, Any]:
    """`text` parsed as a JSON object, or CheckpointError: `invalid(error)` when it
    is not JSON (or nests deeper than MAX_JSON_DEPTH levels, refused before it is
    parsed, as Python's parser would raise RecursionError), `not_object(type name)`
    when it is JSON but not an object."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    depth = json_depth(data) if _openings(data) > MAX_JSON_DEPTH else 0
    if depth > MAX_JSON_DEPTH:
        raise CheckpointError(
            invalid(
                ValueError(
                    f"it nests {depth} levels of arrays and objects; at most "
                    f"{MAX_JSON_DEPTH} are accepted, and no jaxnitro file nests "
                    f"past a few"
                )
            )
        )
    try:
        value = json.loads(text)
    except RecursionError:  # not reached below MAX_JSON_DEPTH; kept as a guard
        raise CheckpointError(invalid(ValueError("it nests too deeply"))) from None
    except (TypeError, UnicodeDecodeError, ValueError) as error:
        # ValueError: JSONDecodeError, or an integer past Python's 4300 digits.
        raise CheckpointError(invalid(error)) from None
    if not isinstance(value, dict):
        raise CheckpointError(not_object(type(value).__name__))
    return value


def _openings(data: bytes) -> int:
    """How many arrays and objects `data` could open: a bound on its depth."""
    return data.count(b"[") + data.count(b"{")


def _unreadable(path: str, error: OSError) -> NoReturn:
    """Raise for an OSError reading `path`: a transient one as is (`with_io_retry`
    tries again), any other as CheckpointError."""
    if isinstance(error, FileNotFoundError):
        raise CheckpointError(f"No checkpoint at {path}.") from None
    if is_transient_io(error):
        raise error
    raise CheckpointError(f"{path} cannot be read: {error}") from None


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, in words, from its `st_mode`."""
    kinds = (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    )
    return next((name for test, name in kinds if test(mode)), "special file")


NOT_REGULAR = (
    "{path} is a {kind}, not a regular file; a checkpoint record is a regular "
    ".safetensors file, and reading a {kind} could block or never end. Pass a "
    "record's path, or move the {kind} away."
)


class _FileHeader:
    """A safetensors file's parsed header: tensor entries, metadata, data extent."""

    def __init__(self, path: str) -> None:
        self.path = path
        mode = os.stat(path).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(path)
        if not stat.S_ISREG(mode):  # a FIFO would block the open below
            raise CheckpointError(NOT_REGULAR.format(path=path, kind=file_kind(mode)))
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise CheckpointError(
                    f"{path} is truncated: {size} bytes, shorter than the 8-byte "
                    f"length that starts a safetensors file. Re-save or delete it."
                )
            (length,) = struct.unpack("<Q", f.read(8))
            if length > _MAX_HEADER or 8 + length > size:
                raise CheckpointError(
                    f"{path} is not a readable safetensors file: its first 8 bytes "
                    f"announce a {length}-byte header but the file holds {size} "
                    f"bytes. It is truncated or not a checkpoint at all."
                )
            raw = f.read(length)
        header = json_object(
            raw,
            lambda error: (
                f"{path} has a corrupted header: it is not valid JSON ({error}). "
                f"The file is damaged or not a safetensors file."
            ),
            lambda kind: (
                f"{path} has a corrupted header: a JSON {kind}, not the object "
                f"safetensors writes."
            ),
        )
        metadata = header.pop("__metadata__", None) or {}
        if not isinstance(metadata, dict):
            raise CheckpointError(f"{path} has a corrupted header: bad __metadata__.")
        self.metadata: dict[str, Any] = metadata
        self.tensors: dict[str, Any] = header
        self.data_start = 8 + length
        end = 0
        for name, entry in header.items():
            offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
            if not (
                isinstance(offsets, list)
                and len(offsets) == 2
                and all(isinstance(o, int) for o in offsets)
            ):
                raise CheckpointError(
                    f"{path} has a corrupted header: tensor {name!r} has no valid "
                    f"data_offsets."
                )
            end = max(end, offsets[1])
        self.data_length = end
        if self.data_start + end != size:
            raise CheckpointError(
                f"{path} is truncated or damaged: its header describes "
                f"{self.data_start + end} bytes but the file holds {size}. The write "
                f"that produced it did not finish; use another checkpoint."
            )


def read_header(path: str) -> RecordHeader:
    """The record's header, reading the file's header bytes only (no array)."""
    return _record_header(_read_file_header(path))


def read_header_checksummed(path: str) -> tuple[RecordHeader, str]:
    """The record's header and its checksum, which the manifest records: a file
    whose checksum differs is not the record the manifest listed.

    The checksum covers the record header (run, epoch, step, metrics, seed, ...)
    and every tensor's name, dtype, shape and offsets, but not `stop_reason`, which
    `Checkpointer.finalize` rewrites in place before it updates the manifest.
    """
    file_header = _read_file_header(path)
    header = _record_header(file_header)
    identity = {
        "header": {**header.to_json(), "stop_reason": None},
        "tensors": file_header.tensors,
    }
    text = json.dumps(identity, sort_keys=True, default=_json_default)
    return header, hashlib.sha256(text.encode()).hexdigest()[:16]


def _read_file_header(path: str) -> _FileHeader:
    checked_path(path, "the checkpoint path")

    def read() -> _FileHeader:
        try:
            return _FileHeader(path)
        except IsADirectoryError:
            raise CheckpointError(
                f"{path} is a directory, not a checkpoint file; pass a record's path, "
                f"or a (run, which) pair to look it up in a run directory."
            ) from None
        except OSError as error:
            _unreadable(path, error)

    return with_io_retry(read, what=f"reading {path}")


def _record_header(header: _FileHeader) -> RecordHeader:
    path = header.path
    if _META_KEY not in header.metadata:
        raise CheckpointError(
            f"{path} is a safetensors file but not a jaxnitro record: its header has "
            f"no {_META_KEY!r} metadata. It was written by another program; load its "
            f"arrays with safetensors directly."
        )
    meta = json_object(
        header.metadata[_META_KEY],
        lambda error: (
            f"{path} has corrupted record metadata: the {_META_KEY!r} header entry "
            f"is not valid JSON ({error})."
        ),
        lambda kind: (
            f"{path} has corrupted record metadata: a JSON {kind}, not an object."
        ),
    )
    return RecordHeader.from_json(meta, path=path)


def rewrite_header(
    path: str,
    update: Callable[[RecordHeader], RecordHeader],
    *,
    tmp_prefix: str = TMP_PREFIX,
) -> None:
    """Rewrite a record's header as `update(header)`, atomically.

    The tensor bytes are copied unchanged (their offsets are relative to the end of
    the header), so no array is decoded. A disk without room raises CheckpointError
    as `write_arrays` does, and the record is left as it was.
    """
    header = _read_file_header(path)
    raw: dict[str, Any] = {
        "__metadata__": {
            **header.metadata,
            _META_KEY: _header_text(update(_record_header(header))),
        },
        **header.tensors,
    }
    text = json.dumps(raw, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)

    def write(tmp: str) -> None:
        with open(path, "rb") as src, open(tmp, "wb") as dst:
            dst.write(struct.pack("<Q", len(text)))
            dst.write(text)
            src.seek(header.data_start)
            shutil.copyfileobj(src, dst)

    tensor_bytes = os.path.getsize(path) - header.data_start
    needed = 8 + len(text) + tensor_bytes
    _write_with_room(path, write, needed=needed, prefix=tmp_prefix)


class CheckpointRecord:
    """A loaded checkpoint: its header and the stored arrays by key.

    Opening a file checks its header first, so a damaged or foreign file, or a
    record header `RecordHeader.from_json` refuses, raises `CheckpointError` naming
    it; nothing in a record is ever executed. `load_checkpoint(checkpointer, path)`
    and `Checkpointer.load` return one.

    Attributes:
        path: the file it was read from.
        header: the record's `RecordHeader` (epoch, step, seed, metrics, ...).
        arrays: every stored array by key, e.g. "params/['w1']", as NumPy arrays.

    Example::

        record = nx.CheckpointRecord("runs/exp/epoch-0003-step-12.safetensors")
        record.header.epoch, record.arrays["params/['w1']"].shape
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.header = _record_header(_read_file_header(path))
        self.arrays = with_io_retry(lambda: _load_arrays(path), what=f"reading {path}")

    @classmethod
    def in_memory(
        cls, arrays: dict[str, np.ndarray], header: RecordHeader, path: str
    ) -> CheckpointRecord:
        """A record that was never read from a file (an average, say)."""
        record = cls.__new__(cls)
        record.path = path
        record.header = header
        record.arrays = arrays
        return record

    @property
    def meta(self) -> dict[str, Any]:
        """`header.to_json()`: the JSON object the file stores, for a caller of
        `average_checkpoints` reading it by key. The framework reads `header`."""
        return self.header.to_json()

    def keep_only(self, prefix: str) -> None:
        """Free the host copies of every stored tree but `prefix`."""
        self.arrays = {
            k: v for k, v in self.arrays.items() if k.startswith(prefix + "/")
        }

    def has_tree(self, prefix: str) -> bool:
        """Whether the record stores any leaf under `prefix`."""
        return any(key.startswith(prefix + "/") for key in self.arrays)

    def restore(self, prefix: str, template: Any, what: str) -> Any:
        """Fill `template`'s leaves from the arrays stored under `prefix`, on device.

        Refuses missing leaves, extra stored leaves and shape or dtype mismatches,
        naming the first mismatching leaves by key path with both shapes (see
        `check_record_tree_compatible`).
        """
        impls = self.header.prng_keys
        check_record_tree_compatible(
            self.arrays, prefix, template, what=what, path=self.path, key_impls=impls
        )
        paths, treedef = jax.tree_util.tree_flatten_with_path(template)
        leaves = []
        for path, _ in paths:
            name = f"{prefix}/{jax.tree_util.keystr(path)}"
            impl = impls.get(name)
            if impl:
                stored = self.arrays[name + _KEY_DATA_SUFFIX]
                leaves.append(jax.random.wrap_key_data(jnp.asarray(stored), impl=impl))
            else:
                leaves.append(jnp.asarray(self.arrays[name]))
        return jax.tree_util.tree_unflatten(treedef, leaves)

    def device_values(self) -> dict[str, np.ndarray]:
        """The Device field values stored in the record, by field name."""
        return self.field_arrays("device")

    def field_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """The arrays of a tree stored as a dict of fields, by field name."""
        start = f"{prefix}/['"
        return {
            key[len(start) : -2]: value
            for key, value in self.arrays.items()
            if key.startswith(start) and key.endswith("']")
        }


def _load_arrays(path: str) -> dict[str, np.ndarray]:
    try:
        return load_file(path)
    except OSError as error:
        _unreadable(path, error)
    except Exception as error:  # safetensors raises its own error type
        raise CheckpointError(
            f"{path}: its arrays cannot be read ({type(error).__name__}: {error}). "
            f"The file is damaged; use another checkpoint."
        ) from None
