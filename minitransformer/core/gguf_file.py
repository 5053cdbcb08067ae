"""Reading a GGUF file: its metadata (gguf.GGUFReader, with one clear error for a bad file) and its tensors as
float32 arrays (gguf.quants), whole or a tensor-parallel rank's part.

Loading dequantizes every tensor once to float32 (loading.py lays each out for `x @ w`). Finding or fetching a model
by name is not here: that is models.py, outside core/, which hands core a path.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import ModelFileError

GGUF_MAGIC = b"GGUF"


def open_gguf(path: str | Path):
    """A `gguf.GGUFReader` over `path` (memory-mapped), with one clear error for a missing, foreign or
    truncated file instead of the reader's internal traceback."""
    path = Path(path)
    if not path.exists():
        raise ModelFileError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelFileError(f"model path is not a file: {path}")
    try:
        with open(path, "rb") as f:
            magic, version = f.read(4), f.read(4)
    except OSError as exc:
        raise ModelFileError(f"cannot read model file {path}: {exc.strerror or exc}") from None
    if magic != GGUF_MAGIC:
        raise ModelFileError(f"{path} is not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")
    _check_gguf_version(path, version)
    try:
        return _bulk_array_reader()(path, "r")
    except Exception:  # the reader fails with ValueError/IndexError/... wherever a short or corrupt file ends
        pass
    try:    # the reader's own path: the bulk one overrides a private method, which a gguf release may change
        import gguf
        return gguf.GGUFReader(path, "r")
    except Exception:
        raise ModelFileError(f"{path} is truncated or corrupt ({path.stat().st_size:,} bytes): its GGUF header "
                             "or tensor data ends early or does not parse; download it again") from None


def _bulk_array_reader():
    """gguf.GGUFReader, reading each metadata array in bulk instead of element by element.

    The reader cuts every element of an array out of the memory map on its own: over a million numpy slices for
    Gemma 3's 262,144-token vocabulary (its tokens, scores and types), seconds before the tokenizer can start. Here
    an array of numbers is one slice, and the strings of an array of strings are found by reading their lengths
    from the bytes. The fields come out as the reader's own (ReaderField: the same `contents()` and `types`);
    byte-swapped files, empty and nested arrays take the reader's own path.
    """
    import gguf
    from gguf import GGUFValueType

    class BulkArrayReader(gguf.GGUFReader):
        def _get_field_parts(self, orig_offs, raw_type):
            if raw_type != GGUFValueType.ARRAY or self.byte_order == "S":
                return super()._get_field_parts(orig_offs, raw_type)
            raw_itype, count = self._get(orig_offs, np.uint32), self._get(orig_offs + 4, np.uint64)
            item_type, n, start = GGUFValueType(int(raw_itype[0])), int(count[0]), orig_offs + 12
            number_type = self.gguf_scalar_to_np.get(item_type)
            if n and number_type is not None:
                values = self._get(start, number_type, n)                       # (n,)
                return 12 + values.nbytes, [raw_itype, count, values], [2], [GGUFValueType.ARRAY, item_type]
            if n and item_type == GGUFValueType.STRING:
                size, parts = _string_array_parts(self.data.view(np.ndarray), start, n)
                return 12 + size, [raw_itype, count, *parts], list(range(3, 3 + 2 * n, 2)), \
                    [GGUFValueType.ARRAY, GGUFValueType.STRING]
            return super()._get_field_parts(orig_offs, raw_type)

    return BulkArrayReader


def _string_array_parts(data: np.ndarray, start: int, n: int) -> tuple[int, list[np.ndarray]]:
    """The n strings (uint64 length, then UTF-8 bytes, little-endian) from byte `start` of `data` (a plain uint8
    array over the file): their total size and [length, bytes, length, bytes, ...] as views of `data`."""
    buffer = data.data                       # the bytes themselves: no numpy object per length read
    parts, offset = [], start
    for _ in range(n):
        length = int.from_bytes(buffer[offset:offset + 8], "little")
        parts.append(data[offset:offset + 8].view(np.uint64))
        parts.append(data[offset + 8:offset + 8 + length])
        offset += 8 + length
    return offset - start, parts


def _check_gguf_version(path: Path, version: bytes) -> None:
    """A whole file of a GGUF version the reader does not know is not a damaged download: say which version it is.
    The version is a uint32 after the magic, little-endian, or big-endian in a byte-swapped file (the reader takes
    both)."""
    from gguf.gguf_reader import READER_SUPPORTED_VERSIONS

    if len(version) < 4:
        return                                   # too short to hold a header: the reader reports it as truncated
    little, big = int.from_bytes(version, "little"), int.from_bytes(version, "big")
    if little not in READER_SUPPORTED_VERSIONS and big not in READER_SUPPORTED_VERSIONS:
        known = " and ".join(str(v) for v in READER_SUPPORTED_VERSIONS)
        raise ModelFileError(f"{path} is GGUF version {little}, which this reader cannot read (it reads versions "
                             f"{known}); a newer gguf package may, or convert the model again")


def dequantize(tensor, rows: slice | None = None, columns: slice | None = None) -> np.ndarray:
    """One GGUF tensor as float32 in NumPy's order: (out_features, in_features) for a weight matrix.

    Float tensors and every block-quantized type that `gguf.quants` can dequantize are accepted (Q4_0 ... Q6_K,
    the IQ* codebooks, ...); integer tensors and the few types gguf cannot unpack (e.g. Q8_1, Q8_K, which llama.cpp
    only uses for activations) are refused with one clear line.

    rows / columns: only that part of a matrix, rows only of a vector (a tensor-parallel rank's shard,
    parallel/plan.py). Quantization blocks run along a row (the inputs), so any rows can be cut from the stored
    bytes before dequantizing; columns only at block boundaries (32 values for Q4_1 and Q8_0, 256 for the
    K-quants). Columns that cut a block are taken from the whole tensor dequantized first: for that tensor the load
    briefly holds all of it as float32 (out x in x 4 bytes) instead of 1/N of it.
    """
    import gguf.quants

    kind = tensor.tensor_type.name
    shape = tuple(int(n) for n in reversed(tensor.shape))           # GGUF lists dims fastest-first
    if kind.startswith("I") and kind[1:].isdigit():
        raise ModelFileError(f"tensor {tensor.name} is an integer tensor ({kind}); weights must be float or "
                             "block-quantized")
    data, columns_left = _stored_part(tensor, shape, rows, columns)
    try:
        values = gguf.quants.dequantize(data, tensor.tensor_type)
    except NotImplementedError:
        raise ModelFileError(f"tensor {tensor.name} uses quantization type {kind}, which the gguf package "
                             "cannot dequantize; re-quantize the model to e.g. Q4_1, Q8_0 or F16") from None
    array: np.ndarray = np.asarray(values, dtype=np.float32)
    if rows is None and columns is None:
        array = array.reshape(shape)
    else:
        array = array.reshape(data.shape[0], -1)                        # (rows, columns) of the part
        if columns_left is not None:
            array = array[:, columns_left]
        if len(shape) == 1:
            array = array.reshape(-1)                                   # a vector's part (a bias's heads)
    # F32 tensors come back as read-only views of the memory-mapped file: copy those so no weight keeps it open.
    return array if array.flags.writeable else array.copy()


def _stored_part(tensor, shape: tuple[int, ...], rows: slice | None, columns: slice | None):
    """(the stored data to dequantize, the columns still to cut from its float32 values or None).

    tensor.data is (out, in) values for a float tensor and (out, bytes per row) for a quantized one, where each
    row is in / block_size blocks of type_size bytes; a column range on block boundaries is a byte range.
    """
    import gguf

    data = tensor.data
    if rows is None and columns is None:
        return data, None
    data = data.reshape(shape[0], -1)[rows if rows is not None else slice(None)]      # (rows, stored per row)
    if columns is None:
        return data, None
    start, stop, _ = columns.indices(shape[-1])
    block, type_size = gguf.GGML_QUANT_SIZES[tensor.tensor_type]
    if data.dtype != np.uint8:                       # float storage: one value per column
        return data[:, start:stop], None
    if start % block == 0 and stop % block == 0:     # whole blocks: cut the bytes, dequantize only those
        return data[:, start // block * type_size:stop // block * type_size], None
    return data, slice(start, stop)                  # a block is cut: dequantize whole rows, then slice
