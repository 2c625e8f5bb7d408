"""A predict request's body, read and decoded under limits, before anything is
allocated for it.

`nitro serve` takes bodies from anyone who can reach it, so each step is bounded by
`ServeLimits` before it allocates:

- the body: refused from its `Content-Length`, or as it streams in, past
  `max_body_bytes` (413);
- JSON: nested deeper than `max_json_depth` is refused by a scan before parsing
  (`json_bounds`); an input's row count and its decoded size (rows times the sample
  size of the bundle's spec) are checked before the nested lists become an array;
- `.npy`: the header is read on its own (its length bounded), and the shape and
  dtype it claims are checked against the rows and bytes left before the data is
  read; a body shorter than its header claims is refused, not padded;
- `.npz`: the zip's directory is checked (member count, directory size) before
  `zipfile` parses it, only stored and deflated members are read, and each member
  is read as an `.npy` under the same budget, so a small archive that would
  inflate to gigabytes is refused after at most the budget is inflated.

Every refusal is a `RequestError` whose message names the input, the limit and the
fix; its `status` is 413 for a limit and 400 for a malformed body.
"""

from __future__ import annotations

import io
import json
import math
import struct
import zipfile
import zlib
from dataclasses import dataclass, fields
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError
from ..json_bounds import JSONRefused, loads_bounded
from .manifest import WireSpec

if TYPE_CHECKING:
    from starlette.requests import Request

    from .loader import LoadedBundle

NPY = "application/x-npy"
NPZ = "application/x-npz"
MIB = 2**20
MAX_NPY_HEADER = 10_000
"""The longest `.npy` header read (NumPy's own default limit)."""
MAX_NPZ_MEMBERS = 64
"""The most members an `.npz` body may hold."""
DRAIN_FACTOR = 4
"""A body refused for its size is read (and dropped) up to this many times the
limit, so that the client reads the 413 instead of a reset connection."""
_NPY_MAGIC = b"\x93NUMPY"
_EOCD = b"PK\x05\x06"
_EOCD_SIZE = 22


class RequestError(ConfigError):
    """A predict request the server refuses; its message is the answer's body.

    Attributes:
        status: the HTTP status: 400 for a malformed request, 413 for one over a
            limit of `ServeLimits`.
    """

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ServeLimits:
    """What one predict request may carry. Each is checked before the memory it
    guards is allocated.

    Args:
        max_body_bytes: the request body, in bytes (16 MiB). A JSON body's
            Python objects take several times its size while it is parsed.
        max_rows: the rows (samples) of one request's batch (8192).
        max_input_bytes: the decoded inputs of one request, in bytes, counted at
            the wider of the sent dtype and the bundle's (64 MiB): an `.npy`
            header or `.npz` member claiming more is refused before its data is
            read.
        max_json_depth: the deepest nesting of a JSON body (32; a request nests
            its input's rank plus 3).

    Raises:
        ConfigError: a limit that is not a whole number >= 1.

    Examples:
        >>> ServeLimits(max_rows=512).max_rows
        512
        >>> ServeLimits(max_rows=0)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        jaxnitro.errors.ConfigError: ServeLimits: max_rows must be a whole number ...
    """

    max_body_bytes: int = 16 * MIB
    max_rows: int = 8192
    max_input_bytes: int = 64 * MIB
    max_json_depth: int = 32

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(
                    f"ServeLimits: {f.name} must be a whole number >= 1, got {value!r}."
                )

    def describe(self) -> str:
        """The limits as the server's start line shows them."""
        return (
            f"body {_size(self.max_body_bytes)}, {self.max_rows} rows and "
            f"{_size(self.max_input_bytes)} of inputs a request, JSON depth "
            f"{self.max_json_depth}"
        )


async def read_body(request: Request, limits: ServeLimits) -> bytes:
    """The request's body, refused (413) once it passes `max_body_bytes`.

    A body refused for its size is still read and dropped, up to
    `DRAIN_FACTOR` times the limit, so the client reads the 413 rather than a
    connection reset; nothing of it is kept.

    Raises:
        RequestError: a `Content-Length` that is not a number (400), or a body
            over the limit, by its `Content-Length` or as it arrives (413).
    """
    limit = limits.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise RequestError(f"Content-Length {declared!r} is not a byte count.")
        if int(declared) > limit:
            if int(declared) <= DRAIN_FACTOR * limit:
                await _drain(request, 0, DRAIN_FACTOR * limit)
            raise _too_large_body(int(declared), limit)
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            await _drain(request, size, DRAIN_FACTOR * limit)
            raise _too_large_body(size, limit, so_far=True)
        chunks.append(chunk)
    return b"".join(chunks)


async def _drain(request: Request, seen: int, cap: int) -> None:
    """Read and drop the rest of the body, stopping past `cap` bytes in all."""
    async for chunk in request.stream():
        seen += len(chunk)
        if seen > cap:
            return


def _too_large_body(size: int, limit: int, *, so_far: bool = False) -> RequestError:
    seen = f"larger than {limit}" if so_far else str(size)
    return RequestError(
        f"the body is {seen} bytes; this server takes at most {limit} "
        f"({_size(limit)}, --max-body-mb). Send fewer rows a request, "
        f"or a binary .npy/.npz body ({NPY}, {NPZ}) rather than JSON.",
        status=413,
    )


class _Budget:
    """The rows and decoded bytes one request has left."""

    def __init__(self, limits: ServeLimits) -> None:
        self.limits = limits
        self.bytes_left = limits.max_input_bytes

    def take(self, name: str, shape: tuple[int, ...], itemsize: int) -> None:
        rows = shape[0]
        if rows > self.limits.max_rows:
            raise RequestError(
                f"input {name!r}: {rows} rows; this server takes at most "
                f"{self.limits.max_rows} a request (--max-rows). Split the batch "
                "into several requests.",
                status=413,
            )
        size = math.prod(shape) * itemsize
        if size > self.bytes_left:
            raise RequestError(
                f"input {name!r}: shape {shape} decodes to {size} bytes, past the "
                f"{self.limits.max_input_bytes} ({_size(self.limits.max_input_bytes)}, "
                "--max-input-mb) this server decodes for one request's inputs. "
                "Split the batch into several requests.",
                status=413,
            )
        self.bytes_left -= size


def decode_json(
    body: bytes, model: LoadedBundle, limits: ServeLimits
) -> dict[str, Any]:
    """A JSON body's inputs by name: arrays for the bundle's inputs (other names
    are passed on as they are, for the bundle's own check to refuse).

    Raises:
        RequestError: over a limit, not JSON, not `{"inputs": {...}}`, or an
            input that is not a list of rows of numbers its dtype holds.
    """
    try:
        payload = loads_bounded(
            body,
            max_bytes=limits.max_body_bytes,
            max_depth=limits.max_json_depth,
            what="the body",
        )
    except JSONRefused as error:
        raise RequestError(
            f'{error} Send {{"inputs": {{"NAME": [[...], ...]}}}}.',
        ) from error
    if not isinstance(payload, dict) or not isinstance(payload.get("inputs"), dict):
        example = ", ".join(f'"{n}": [[...], ...]' for n in model.input_names)
        raise RequestError(
            'the JSON body must be an object with an "inputs" object, '
            f'{{"inputs": {{{example}}}}}; got {_brief(payload)}.'
        )
    specs = {spec.name: spec for spec in model.inputs}
    budget = _Budget(limits)
    inputs = {}
    for key, value in payload["inputs"].items():
        spec = specs.get(key)
        if spec is None:
            inputs[key] = value
            continue
        if not isinstance(value, list):
            raise RequestError(
                f"input {key!r}: got {_brief(value)}, but the bundle takes "
                f"{spec.describe()}: a list of rows, batch axis first."
            )
        # JSON numbers become 8-byte values before the cast to the spec's dtype.
        budget.take(key, (len(value), *spec.sample_shape), max(8, spec.dtype.itemsize))
        inputs[key] = _from_json(value, spec)
    return inputs


def _from_json(value: list[Any], spec: WireSpec) -> np.ndarray:
    """Nested lists as an array of the spec's dtype, refusing what would change a
    value: fractions for an integer input, values out of its range, non-numbers."""
    expected = spec.describe()
    try:
        array = np.asarray(value)
    except ValueError as error:  # ragged nesting
        raise RequestError(
            f"input {spec.name!r}: the nested lists are not rectangular "
            f"({error}); the bundle takes {expected} (batch axis first)."
        ) from error
    dtype = spec.dtype
    if array.dtype.kind not in "biuf" or (
        array.dtype.kind == "f" and dtype.kind in "biu"
    ):
        seen = "fractions" if array.dtype.kind == "f" else f"{array.dtype} values"
        raise RequestError(
            f"input {spec.name!r}: got {seen}, but the bundle takes {expected}; "
            "send numbers of that type."
        )
    if dtype.kind in "iu" and array.size:
        info = np.iinfo(dtype)
        low, high = array.min(), array.max()
        if low < info.min or high > info.max:
            raise RequestError(
                f"input {spec.name!r}: values from {low} to {high} do not fit "
                f"the bundle's {expected} (range {info.min}..{info.max})."
            )
    with np.errstate(over="ignore", invalid="ignore"):
        cast = array.astype(dtype)
    if dtype.kind == "f" and array.size:
        overflow = ~np.isfinite(cast)
        if array.dtype.kind == "f":
            overflow &= np.isfinite(array)
        if overflow.any():
            first = array[tuple(np.argwhere(overflow)[0])]
            raise RequestError(
                f"input {spec.name!r}: {first} is out of the range of the "
                f"bundle's {expected} (largest {np.finfo(dtype).max}); it would "
                "become infinite."
            )
    return cast


def decode_npy(
    body: bytes, name: str, model: LoadedBundle, limits: ServeLimits
) -> dict[str, np.ndarray]:
    """A raw `.npy` body as the input `name`.

    Raises:
        RequestError: not an `.npy` array of numbers, shorter or longer than its
            header says, or past a limit.
    """
    spec = next((s for s in model.inputs if s.name == name), None)
    stream = io.BytesIO(body)
    what = f"the .npy body for input {name!r}"
    array = _read_npy(stream, name, what, spec, _Budget(limits))
    if stream.read(1):
        raise RequestError(
            f"{what} holds {len(body) - stream.tell() + 1} bytes past the array its "
            "header describes; send exactly what np.save(buffer, array) writes."
        )
    return {name: array}


def decode_npz(
    body: bytes, model: LoadedBundle, limits: ServeLimits
) -> dict[str, np.ndarray]:
    """An `.npz` body's members as inputs by name (`x.npy` is the input `x`).

    Raises:
        RequestError: not a zip archive of `.npy` members, a member compressed
            other than stored or deflated, more than `MAX_NPZ_MEMBERS` members,
            a damaged member (a bad CRC, truncated data), or past a limit.
    """
    _check_zip_directory(body)
    specs = {spec.name: spec for spec in model.inputs}
    budget = _Budget(limits)
    inputs = {}
    try:
        with zipfile.ZipFile(io.BytesIO(body)) as archive:
            for info in archive.infolist():
                name = info.filename.removesuffix(".npy")
                what = f"the .npz member {info.filename!r}"
                if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                    raise RequestError(
                        f"{what} is compressed with method {info.compress_type}; "
                        "this server reads stored and deflated members (np.savez, "
                        "np.savez_compressed)."
                    )
                if name in inputs:
                    raise RequestError(f"{what} is in the archive twice.")
                with archive.open(info) as member:
                    array = _read_npy(member, name, what, specs.get(name), budget)
                    if member.read(1):  # also where zipfile checks the CRC
                        raise RequestError(
                            f"{what} holds bytes past the array its header "
                            "describes; write the archive with np.savez."
                        )
                inputs[name] = array
    except RequestError:
        raise
    except (
        zipfile.BadZipFile,
        zlib.error,
        EOFError,
        OSError,
        ValueError,
        NotImplementedError,
        RuntimeError,  # an encrypted member
    ) as error:
        raise RequestError(
            f"the body is not a readable .npz archive ({error}); write it with "
            "np.savez(buffer, name=array, ...)."
        ) from error
    return inputs


def _check_zip_directory(body: bytes) -> None:
    """Refuse a zip whose directory is too large before `zipfile` parses it."""
    end = body.rfind(_EOCD, max(0, len(body) - _EOCD_SIZE - 0xFFFF))
    if end < 0 or len(body) - end < _EOCD_SIZE:
        raise RequestError(
            "the body is not a readable .npz archive (no zip end record); write it "
            "with np.savez(buffer, name=array, ...)."
        )
    entries, directory_size = struct.unpack_from("<2xHI", body, end + 8)
    if entries > MAX_NPZ_MEMBERS or directory_size > MAX_NPZ_MEMBERS * 1024:
        raise RequestError(
            f"the .npz body lists {entries} members in a directory of "
            f"{directory_size} bytes; this server reads at most {MAX_NPZ_MEMBERS} "
            "members, one per input.",
            status=413,
        )


def _read_npy(
    stream: IO[bytes],
    name: str,
    what: str,
    spec: WireSpec | None,
    budget: _Budget,
) -> np.ndarray:
    """One `.npy` array from `stream`, its header checked before its data is read."""
    shape, fortran, dtype = _read_npy_header(stream, what)
    if dtype.hasobject or dtype.kind not in "biufc" or dtype.fields is not None:
        raise RequestError(
            f"{what} holds {dtype} values; send numbers (the bundle takes "
            f"{spec.describe() if spec else 'numeric arrays'})."
        )
    if not shape or any(size < 0 for size in shape):
        raise RequestError(
            f"{what} has shape {shape}; an input is (rows, *sample_shape), batch "
            "axis first."
        )
    wider = max(dtype.itemsize, spec.dtype.itemsize if spec else 0)
    budget.take(name, shape, wider)
    count = math.prod(shape)
    size = count * dtype.itemsize
    data = stream.read(size)
    if len(data) != size:
        raise RequestError(
            f"{what} is truncated: its header claims {dtype}{list(shape)} "
            f"({size} bytes of data), but {len(data)} follow."
        )
    array = (
        np.frombuffer(data, dtype=dtype, count=count) if count else np.empty(0, dtype)
    )
    if fortran:
        return array.reshape(shape[::-1]).transpose()
    return array.reshape(shape)


def _read_npy_header(
    stream: IO[bytes], what: str
) -> tuple[tuple[int, ...], bool, np.dtype[Any]]:
    """The shape, order and dtype an `.npy` header claims, read with bounded reads."""
    magic = stream.read(len(_NPY_MAGIC) + 2)
    if len(magic) < len(_NPY_MAGIC) + 2 or not magic.startswith(_NPY_MAGIC):
        raise RequestError(
            f"{what} is not a readable .npy array (it does not start with the .npy "
            "magic); write it with np.save(buffer, array)."
        )
    version = (magic[-2], magic[-1])
    if version not in ((1, 0), (2, 0)):
        raise RequestError(
            f"{what} is an .npy of version {version[0]}.{version[1]}; this server "
            "reads versions 1.0 and 2.0 (what np.save writes for numeric arrays)."
        )
    length_format = "<H" if version == (1, 0) else "<I"
    length_bytes = stream.read(struct.calcsize(length_format))
    if len(length_bytes) != struct.calcsize(length_format):
        raise RequestError(f"{what} is truncated inside its header.")
    (length,) = struct.unpack(length_format, length_bytes)
    if length > MAX_NPY_HEADER:
        raise RequestError(
            f"{what} declares a header of {length} bytes; at most "
            f"{MAX_NPY_HEADER} are read."
        )
    header = stream.read(length)
    if len(header) != length:
        raise RequestError(f"{what} is truncated inside its header.")
    reader = (
        np.lib.format.read_array_header_1_0
        if version == (1, 0)
        else np.lib.format.read_array_header_2_0
    )
    try:
        shape, fortran, dtype = reader(io.BytesIO(length_bytes + header))
    except Exception as error:  # NumPy's parser: ValueError, SyntaxError,
        # tokenize.TokenError, RecursionError, ... on at most MAX_NPY_HEADER bytes
        raise RequestError(
            f"{what} is not a readable .npy array ({error}); write it with "
            "np.save(buffer, array)."
        ) from error
    return tuple(shape), bool(fortran), dtype


def _size(n: int) -> str:
    return f"{n / MIB:g} MiB" if n >= MIB else f"{n} bytes"


def _brief(value: Any, limit: int = 80) -> str:
    """`value` as JSON, cut short: at most 4 items a container, 3 levels deep."""
    text = json.dumps(_trimmed(value, 3))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _trimmed(value: Any, depth: int) -> Any:
    if isinstance(value, dict):
        if depth == 0:
            return "{...}"
        items = list(value.items())
        trimmed = {str(k): _trimmed(v, depth - 1) for k, v in items[:4]}
        if len(items) > 4:
            trimmed["..."] = "..."
        return trimmed
    if isinstance(value, list):
        if depth == 0:
            return "[...]"
        trimmed_list = [_trimmed(v, depth - 1) for v in value[:4]]
        return trimmed_list + ["..."] if len(value) > 4 else trimmed_list
    if isinstance(value, str) and len(value) > 40:
        return value[:37] + "..."
    return value
