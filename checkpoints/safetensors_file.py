"""Hugging Face's safetensors format, read with NumPy alone.

Layout: an 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets: [begin,
end]}} (plus an optional "__metadata__"), then the tensors' raw little-endian bytes.
"""

import json
import math
import os

import numpy as np

from checkpoints.tf_checkpoint import CheckpointError

SAFETENSORS_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}  # BF16: raw bits
MAX_SAFETENSORS_HEADER = 100 << 20


class SafetensorsFile:
    """The tensors of a .safetensors file: `shapes` lists them, `read(name)` loads one as float32.

    Layout: an 8-byte little-endian header length, a JSON header {name: {dtype, shape,
    data_offsets: [begin, end]}} (plus an optional "__metadata__"), then the tensors' bytes.
    """

    def __init__(self, path):
        self.path = str(path)
        with open(self.path, "rb") as f:
            self.file_size = os.fstat(f.fileno()).st_size
            header_size = int.from_bytes(f.read(8), "little")
            if self.file_size < 8 or header_size > min(MAX_SAFETENSORS_HEADER, self.file_size - 8):
                raise CheckpointError(f"{self.path}: truncated or not a safetensors file")
            try:
                header = json.loads(f.read(header_size))
            except (UnicodeDecodeError, json.JSONDecodeError) as error:
                raise CheckpointError(f"{self.path}: the safetensors header is not valid JSON ({error})") from None
        if not isinstance(header, dict):
            raise CheckpointError(f"{self.path}: the safetensors header is not a JSON object")
        self.data_start = 8 + header_size
        header.pop("__metadata__", None)
        self.entries = {name: self._check_entry(name, entry) for name, entry in header.items()}
        self.shapes = {name: tuple(entry["shape"]) for name, entry in self.entries.items()}

    def _check_entry(self, name, entry):
        try:
            dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            if not all(isinstance(size, int) and size >= 0 for size in shape) or not 0 <= begin <= end:
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{self.path}: malformed header entry for {name!r}") from None
        if dtype in SAFETENSORS_DTYPES and end - begin != math.prod(shape) * SAFETENSORS_DTYPES[dtype].itemsize:
            raise CheckpointError(f"{self.path}: tensor {name!r} of shape {shape} spans bytes {begin}..{end}")
        if self.data_start + end > self.file_size:
            raise CheckpointError(f"{self.path}: truncated (tensor {name!r} ends past the end of the file)")
        return {"dtype": dtype, "shape": shape, "begin": begin}

    def read(self, name):
        entry = self.entries[name]
        if entry["dtype"] not in SAFETENSORS_DTYPES:  # checked here: unused buffers may have other types
            raise CheckpointError(f"{self.path}: tensor {name!r} has dtype {entry['dtype']}; "
                                  f"supported: {', '.join(SAFETENSORS_DTYPES)}")
        array = np.empty(entry["shape"], SAFETENSORS_DTYPES[entry["dtype"]])
        with open(self.path, "rb") as f:
            f.seek(self.data_start + entry["begin"])
            if f.readinto(memoryview(array.reshape(-1).view(np.uint8))) != array.nbytes:
                raise CheckpointError(f"{self.path}: truncated while reading {name!r}")
        if array.dtype == np.dtype("<u2"):  # bfloat16 is the top half of a float32
            return (array.astype(np.uint32) << 16).view(np.float32)
        return array.astype(np.float32, copy=False)


def safetensors_bytes(tensors, dtype=np.float16):  # {name: array} -> the bytes of a .safetensors file
    """Every tensor in `dtype` (float16 or float32), laid out one after another in the order given."""
    names = {np.dtype(np.float16): "F16", np.dtype(np.float32): "F32"}
    header, data, offset = {}, [], 0
    for name, array in tensors.items():
        raw = np.ascontiguousarray(array, dtype=np.dtype(dtype).newbyteorder("<")).tobytes()
        header[name] = {"dtype": names[np.dtype(dtype)], "shape": list(np.shape(array)),
                        "data_offsets": [offset, offset + len(raw)]}
        data.append(raw)
        offset += len(raw)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the format pads the header with spaces to 8 bytes
    return len(encoded).to_bytes(8, "little") + encoded + b"".join(data)
