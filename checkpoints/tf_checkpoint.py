"""Read and write TensorFlow checkpoints (TensorBundle V2) with NumPy alone, no TensorFlow.

A checkpoint with prefix P is two files:

    P.index                  an SSTable (LevelDB's table format) mapping each tensor name to a serialized
                             BundleEntryProto {dtype, shape, shard_id, offset, size, crc32c}; the empty
                             key holds a BundleHeaderProto {num_shards, endianness, version}
    P.data-00000-of-00001    the tensors' raw little-endian bytes, at the offsets the entries give

The SSTable is a sequence of blocks, each followed by a 5-byte trailer (compression type, then the
masked CRC-32C of the block and the type byte); a 48-byte footer at the end of the file points at
the index block, whose entries point at the data blocks holding the key/value pairs. TensorFlow
writes bundle indexes uncompressed (tensor_bundle.cc sets kNoCompression), so a compressed block is
reported as unsupported rather than decoded.

`TFCheckpoint(prefix)` lists and reads tensors (float32 and float16, returned as stored), checking
every block's and every tensor's checksum; `write_tf_checkpoint(prefix, tensors)` writes the same
format, the way TensorFlow's BundleWriter lays it out. Anything truncated, corrupt or unsupported
raises CheckpointError (a ValueError) naming the file.
"""

import functools
import math
import operator
import os

import numpy as np

from checkpoints.atomic import replace_when_done


class CheckpointError(ValueError):
    """A checkpoint file is missing pieces, corrupt, or in a form this reader does not support."""


# ---------------------------------------------------------------- CRC-32C (Castagnoli), masked as in LevelDB

CASTAGNOLI = 0x82F63B78  # the reflected polynomial
CRC_MASK_DELTA = 0xA282EAD8


def _crc_tables():
    """BYTE: the classic 256-entry table. LOW/HIGH: one 32-bit word in two 16-bit lookups."""
    byte = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        byte = np.where(byte & 1, (byte >> 1) ^ np.uint32(CASTAGNOLI), byte >> 1).astype(np.uint32)
    followed = [byte]  # followed[k][v]: the register after byte v and then k zero bytes
    for _ in range(3):
        followed.append((followed[-1] >> 8) ^ byte[followed[-1] & 0xFF])
    v = np.arange(65536, dtype=np.uint32)
    low = followed[3][v & 0xFF] ^ followed[2][v >> 8]  # the word's first two bytes
    high = followed[1][v & 0xFF] ^ followed[0][v >> 8]  # its last two
    return byte, low, high


CRC_BYTE, CRC_LOW, CRC_HIGH = _crc_tables()
CRC_BYTE_LIST = CRC_BYTE.tolist()
MAX_LANES = 65536  # independent CRC streams NumPy advances side by side
MIN_LANE_BYTES = 256
SMALL_INPUT = 16384  # below this many bytes a plain Python loop is fast enough


def _apply(images, register):
    """Apply a linear map on 32-bit CRC registers (an int or a uint32 array), given the images of its bits."""
    if isinstance(register, int):
        return functools.reduce(operator.xor, (image for bit, image in enumerate(images) if register >> bit & 1), 0)
    result = np.zeros_like(register)
    for bit, image in enumerate(images):
        result ^= (register >> bit & 1) * np.uint32(image)
    return result


def _zero_shifts(max_power=48):
    """shifts[k]: the linear map 'feed 2**k zero bytes' on a raw CRC register, by repeated squaring.

    CRC is linear over GF(2): crc(A + B) = shift_len(B)(crc(A)) ^ crc(B) for registers started at 0.
    """
    shifts = [[CRC_BYTE_LIST[(1 << bit) & 0xFF] ^ ((1 << bit) >> 8) for bit in range(32)]]  # one zero byte
    for _ in range(max_power):
        shifts.append([_apply(shifts[-1], image) for image in shifts[-1]])
    return shifts


ZERO_SHIFTS = _zero_shifts()


def _lane_crcs(words):  # [n_lanes, n_words] uint32 -> [n_lanes] raw CRC of each row, started from 0
    n_lanes, n_words = words.shape
    register = np.zeros(n_lanes, np.uint32)
    low_half, high_half = register.view(np.uint16)[0::2], register.view(np.uint16)[1::2]  # little-endian
    looked_up_low, looked_up_high = np.empty_like(register), np.empty_like(register)
    for block_start in range(0, n_words, 16):  # transpose 16 words at a time: each step reads contiguous memory
        for column in np.ascontiguousarray(words[:, block_start:block_start + 16].T):
            register ^= column
            np.take(CRC_LOW, low_half, out=looked_up_low)
            np.take(CRC_HIGH, high_half, out=looked_up_high)
            np.bitwise_xor(looked_up_low, looked_up_high, out=register)
    return register


def _extend(register, data):  # the raw CRC register after feeding `data` (a uint8 array) to it
    while len(data) >= SMALL_INPUT:
        # The largest power-of-two prefix, split into equal lanes CRC'd side by side; neighbouring
        # lanes then merge pairwise (shift the left one past the right one's bytes, xor).
        chunk_power = len(data).bit_length() - 1
        lane_power = max(MIN_LANE_BYTES.bit_length() - 1, chunk_power - (MAX_LANES.bit_length() - 1))
        lanes = _lane_crcs(data[:1 << chunk_power].view("<u4").reshape(-1, (1 << lane_power) // 4))
        for power in range(lane_power, chunk_power):
            lanes = _apply(ZERO_SHIFTS[power], lanes[0::2]) ^ lanes[1::2]
        register = _apply(ZERO_SHIFTS[chunk_power], register) ^ int(lanes[0])
        data = data[1 << chunk_power:]
    for byte in data.tobytes():
        register = CRC_BYTE_LIST[(register ^ byte) & 0xFF] ^ (register >> 8)
    return register


def crc32c(data):
    """CRC-32C of bytes-like data, as TensorFlow and LevelDB compute it."""
    return _extend(0xFFFFFFFF, np.frombuffer(data, np.uint8)) ^ 0xFFFFFFFF


def masked_crc32c(data):
    """LevelDB stores CRCs rotated and offset, so a CRC of data that contains CRCs stays well mixed."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + CRC_MASK_DELTA) & 0xFFFFFFFF


# ---------------------------------------------------------------- protobuf wire format (the fields we need)

VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5


def read_varint(buffer, position, where):
    """(value, position after it) of the base-128 varint at `position`; `where` names the file for errors."""
    value = 0
    for shift in range(0, 70, 7):
        if position >= len(buffer):
            raise CheckpointError(f"{where}: truncated varint")
        byte = buffer[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
    raise CheckpointError(f"{where}: varint longer than 10 bytes")


def parse_message(buffer, where):
    """{field number: [values]} of a serialized message: ints for numeric fields, bytes for the rest."""
    fields, position = {}, 0
    while position < len(buffer):
        key, position = read_varint(buffer, position, where)
        field, wire_type = key >> 3, key & 7
        if wire_type == VARINT:
            value, position = read_varint(buffer, position, where)
        elif wire_type in (FIXED32, FIXED64, LENGTH_DELIMITED):
            if wire_type == LENGTH_DELIMITED:
                length, position = read_varint(buffer, position, where)
            else:
                length = 4 if wire_type == FIXED32 else 8
            if position + length > len(buffer):
                raise CheckpointError(f"{where}: truncated protobuf field {field}")
            value = buffer[position:position + length]
            if wire_type != LENGTH_DELIMITED:
                value = int.from_bytes(value, "little")
            position += length
        else:
            raise CheckpointError(f"{where}: unsupported protobuf wire type {wire_type}")
        fields.setdefault(field, []).append(value)
    return fields


def encode_varint(value):
    value &= (1 << 64) - 1  # negative int64s are written as ten-byte two's complement, as protobuf does
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_field(field, value, wire_type=VARINT):
    """One field, omitted when it holds proto3's default (0), as protobuf's serializer does for scalars."""
    if wire_type == LENGTH_DELIMITED:
        return encode_varint(field << 3 | wire_type) + encode_varint(len(value)) + value
    if value == 0:
        return b""
    if wire_type == FIXED32:
        return encode_varint(field << 3 | wire_type) + value.to_bytes(4, "little")
    return encode_varint(field << 3 | wire_type) + encode_varint(value)


# ---------------------------------------------------------------- SSTable (LevelDB table format)

TABLE_MAGIC = 0xDB4775248B80FB57
FOOTER_SIZE = 48  # two block handles padded to 40 bytes, then the 8-byte magic number
BLOCK_TRAILER_SIZE = 5  # compression type byte + masked CRC-32C
NO_COMPRESSION = 0
BLOCK_SIZE = 262144  # TensorFlow's table options: start a new data block past this many bytes
RESTART_INTERVAL = 16  # a full key (no prefix sharing) every 16 entries in data blocks


def read_block(table, handle, where):
    """The contents of the block at handle (offset, size), its trailer checked."""
    offset, size = handle
    end = offset + size + BLOCK_TRAILER_SIZE
    if end > len(table):
        raise CheckpointError(f"{where}: truncated (a block ends at byte {end}, the file has {len(table)})")
    contents, compression = table[offset:offset + size], table[offset + size]
    stored_crc = int.from_bytes(table[offset + size + 1:end], "little")
    if masked_crc32c(table[offset:offset + size + 1]) != stored_crc:
        raise CheckpointError(f"{where}: corrupt (checksum mismatch in the block at byte {offset})")
    if compression != NO_COMPRESSION:
        raise CheckpointError(f"{where}: compressed blocks (type {compression}) are not supported; "
                              "TensorFlow writes checkpoint indexes uncompressed")
    return contents


def block_entries(block, where):
    """The (key, value) pairs of a block: prefix-compressed keys, then restart offsets, then their count."""
    if len(block) < 4:
        raise CheckpointError(f"{where}: corrupt (a block of {len(block)} bytes)")
    n_restarts = int.from_bytes(block[-4:], "little")
    entries_end = len(block) - 4 * (n_restarts + 1)
    if entries_end < 0:
        raise CheckpointError(f"{where}: corrupt (a block claims {n_restarts} restart points)")
    entries, key, position = [], b"", 0
    while position < entries_end:
        shared, position = read_varint(block, position, where)
        unshared, position = read_varint(block, position, where)
        value_length, position = read_varint(block, position, where)
        value_start = position + unshared
        if shared > len(key) or value_start + value_length > entries_end:
            raise CheckpointError(f"{where}: corrupt block entry at byte {position}")
        key = key[:shared] + bytes(block[position:value_start])
        position = value_start + value_length
        entries.append((key, bytes(block[value_start:position])))
    return entries


def decode_handle(encoded, where):
    offset, position = read_varint(encoded, 0, where)
    size, _ = read_varint(encoded, position, where)
    return offset, size


def read_table(table, where):
    """All (key, value) pairs of an SSTable held in memory, in key order."""
    if len(table) < FOOTER_SIZE:
        raise CheckpointError(f"{where}: truncated ({len(table)} bytes, shorter than the table footer)")
    footer = table[-FOOTER_SIZE:]
    if int.from_bytes(footer[-8:], "little") != TABLE_MAGIC:
        raise CheckpointError(f"{where}: not a TensorFlow checkpoint index (bad table magic number; truncated?)")
    _metaindex_offset, position = read_varint(footer, 0, where)  # the metaindex block is empty in bundles
    _metaindex_size, position = read_varint(footer, position, where)
    index_handle = decode_handle(footer[position:], where)
    entries = []
    for _separator, handle in block_entries(read_block(table, index_handle, where), where):
        entries += block_entries(read_block(table, decode_handle(handle, where), where), where)
    return entries


class BlockBuilder:
    """Accumulates sorted key/value pairs into one block, sharing each key's prefix with the previous key."""

    def __init__(self, restart_interval):
        self.restart_interval = restart_interval
        self.buffer, self.restarts, self.count, self.last_key = bytearray(), [0], 0, b""

    def add(self, key, value):
        if self.count == self.restart_interval:  # store the next key whole, so readers can seek here
            self.restarts.append(len(self.buffer))
            self.count, self.last_key = 0, b""
        shared = len(os.path.commonprefix([self.last_key, key]))
        self.buffer += encode_varint(shared) + encode_varint(len(key) - shared) + encode_varint(len(value))
        self.buffer += key[shared:] + value
        self.count, self.last_key = self.count + 1, key

    def size_estimate(self):
        return len(self.buffer) + 4 * len(self.restarts) + 4

    def finish(self):
        return bytes(self.buffer) + b"".join(r.to_bytes(4, "little") for r in self.restarts) + \
            len(self.restarts).to_bytes(4, "little")


def shortest_separator(key, next_key):
    """A short key k with key <= k < next_key, for the index block (as LevelDB's bytewise comparator)."""
    n_common = len(os.path.commonprefix([key, next_key]))
    if n_common < min(len(key), len(next_key)) and key[n_common] + 1 < next_key[n_common]:
        return key[:n_common] + bytes([key[n_common] + 1])
    return key


def short_successor(key):
    """A short key >= key: the first byte that can be incremented, incremented, and the rest dropped."""
    for i, byte in enumerate(key):
        if byte != 0xFF:
            return key[:i] + bytes([byte + 1])
    return key


def build_table(entries):
    """The bytes of an uncompressed SSTable holding the sorted (key, value) pairs."""
    table, index_block = bytearray(), BlockBuilder(restart_interval=1)

    def write_block(block):  # -> the block's encoded handle
        contents = block.finish()
        handle = encode_varint(len(table)) + encode_varint(len(contents))
        table.extend(contents + bytes([NO_COMPRESSION]))
        table.extend(masked_crc32c(contents + bytes([NO_COMPRESSION])).to_bytes(4, "little"))
        return handle

    data_block, pending_handle, last_key = BlockBuilder(RESTART_INTERVAL), None, b""
    for key, value in entries:
        if pending_handle is not None:  # index the finished block under a key between it and this one
            index_block.add(shortest_separator(last_key, key), pending_handle)
            pending_handle = None
        data_block.add(key, value)
        last_key = key
        if data_block.size_estimate() >= BLOCK_SIZE:
            pending_handle, data_block = write_block(data_block), BlockBuilder(RESTART_INTERVAL)
    if data_block.count:
        pending_handle = write_block(data_block)
    metaindex_handle = write_block(BlockBuilder(RESTART_INTERVAL))  # empty, as TensorFlow writes it
    if pending_handle is not None:
        index_block.add(short_successor(last_key), pending_handle)
    index_handle = write_block(index_block)
    footer = (metaindex_handle + index_handle).ljust(FOOTER_SIZE - 8, b"\0") + TABLE_MAGIC.to_bytes(8, "little")
    return bytes(table + footer)


# ---------------------------------------------------------------- TensorBundle: BundleHeaderProto, BundleEntryProto

DTYPES = {1: np.dtype("<f4"), 19: np.dtype("<f2")}  # TensorFlow's DT_FLOAT and DT_HALF enum values
TF_DTYPES = {np.dtype(dtype): enum for enum, dtype in DTYPES.items()}
BUNDLE_VERSION = 1  # kTensorBundleVersion: the producer version TensorFlow's writer records


def data_path(prefix, shard=0, n_shards=1):
    return f"{prefix}.data-{shard:05d}-of-{n_shards:05d}"


def first(fields, number, default=0):
    return fields.get(number, [default])[-1]  # protobuf: the last occurrence of a scalar field wins


class TFCheckpoint:
    """The tensors of the checkpoint with the given prefix; `shapes` lists them, `read(name)` loads one.

    Only the small index is read up front; each tensor's bytes are read, and their CRC-32C checked,
    when asked for, so a 6 GB checkpoint is never held twice.
    """

    def __init__(self, prefix):
        self.prefix, self.path = str(prefix), f"{prefix}.index"
        try:
            with open(self.path, "rb") as f:
                table = memoryview(f.read())
        except OSError as error:
            raise CheckpointError(f"{self.path}: cannot read the checkpoint index ({error.strerror})") from None
        entries = dict(read_table(table, self.path))
        if b"" not in entries:
            raise CheckpointError(f"{self.path}: no bundle header; not a TensorFlow V2 checkpoint")
        header = parse_message(entries.pop(b""), self.path)
        self.n_shards = first(header, 1)
        if first(header, 2) != 0:
            raise CheckpointError(f"{self.path}: big-endian checkpoints are not supported")
        self.entries = {}
        for key, value in entries.items():
            name = key.decode("utf-8", errors="replace")
            self.entries[name] = self._parse_entry(name, parse_message(value, self.path))
        self.shapes = {name: entry["shape"] for name, entry in self.entries.items()}  # in key order

    def _parse_entry(self, name, fields):
        shape = []
        for dim in parse_message(first(fields, 2, b""), self.path).get(2, []):
            size = first(parse_message(dim, self.path), 1)
            if size >= 1 << 63:
                raise CheckpointError(f"{self.path}: tensor {name!r} has an unknown dimension")
            shape.append(size)
        entry = {"dtype": first(fields, 1), "shape": tuple(shape), "shard": first(fields, 3),
                 "offset": first(fields, 4), "size": first(fields, 5), "crc32c": first(fields, 6)}
        if 7 in fields:
            raise CheckpointError(f"{self.path}: tensor {name!r} is saved in slices, which is not supported")
        if entry["shard"] >= self.n_shards:
            raise CheckpointError(f"{self.path}: tensor {name!r} is in shard {entry['shard']} of {self.n_shards}")
        return entry

    def dtype_name(self, name):
        enum = self.entries[name]["dtype"]
        return DTYPES[enum].name if enum in DTYPES else f"TensorFlow DataType {enum}"

    def read(self, name):
        """The tensor as stored (float32 or float16), after checking its size and CRC-32C."""
        if name not in self.entries:
            raise CheckpointError(f"{self.path}: no tensor named {name!r}")
        entry = self.entries[name]
        if entry["dtype"] not in DTYPES:
            raise CheckpointError(f"{self.path}: tensor {name!r} has unsupported type {self.dtype_name(name)}")
        dtype, path = DTYPES[entry["dtype"]], data_path(self.prefix, entry["shard"], self.n_shards)
        n_bytes, start = math.prod(entry["shape"]) * dtype.itemsize, entry["offset"]
        if entry["size"] != n_bytes:
            raise CheckpointError(f"{self.path}: tensor {name!r} of shape {list(entry['shape'])} takes {n_bytes} "
                                  f"bytes, the index says {entry['size']}")
        try:
            with open(path, "rb") as f:
                if start + n_bytes > os.fstat(f.fileno()).st_size:  # checked before allocating the array
                    raise CheckpointError(f"{path}: truncated (tensor {name!r} needs bytes {start} to "
                                          f"{start + n_bytes}, the file ends first)")
                array = np.empty(entry["shape"], dtype)
                f.seek(start)
                f.readinto(memoryview(array.reshape(-1).view(np.uint8)))
        except OSError as error:
            raise CheckpointError(f"{path}: cannot read the checkpoint data ({error.strerror})") from None
        if masked_crc32c(array.reshape(-1).view(np.uint8)) != entry["crc32c"]:
            raise CheckpointError(f"{path}: corrupt (checksum mismatch in tensor {name!r})")
        return array.astype(dtype.newbyteorder("="), copy=False)  # no copy on little-endian machines


def encode_entry(array, offset, crc):
    shape = b"".join(encode_field(2, encode_field(1, size), LENGTH_DELIMITED) for size in array.shape)
    return (encode_field(1, TF_DTYPES[array.dtype]) + encode_field(2, shape, LENGTH_DELIMITED) +
            encode_field(4, offset) + encode_field(5, array.nbytes) + encode_field(6, crc, FIXED32))


def write_tf_checkpoint(prefix, tensors):
    """Write {name: float32 or float16 array} as `prefix.index` + `prefix.data-00000-of-00001`.

    Tensors are stored in name order, as TensorFlow's BundleWriter stores what TensorFlow's savers
    hand it. Both files are written under temporary names beside their final ones and renamed only
    once complete, the data file first, so a reader never sees an index without its data.
    """
    arrays = {}
    for name, array in tensors.items():
        array = np.asarray(array)
        if array.dtype not in (np.float32, np.float16):
            raise ValueError(f"tensor {name!r}: only float32 and float16 can be written, not {array.dtype}")
        arrays[name.encode("utf-8")] = np.asarray(array, dtype=array.dtype.newbyteorder("<"), order="C")
    header = encode_field(1, 1) + encode_field(3, encode_field(1, BUNDLE_VERSION), LENGTH_DELIMITED)
    index_entries, offset = [(b"", header)], 0
    with replace_when_done(data_path(prefix)) as data_file:
        for key in sorted(arrays):
            raw = arrays[key].reshape(-1).view(np.uint8)
            data_file.write(raw)
            index_entries.append((key, encode_entry(arrays[key], offset, masked_crc32c(raw))))
            offset += len(raw)
    with replace_when_done(f"{prefix}.index") as index_file:
        index_file.write(build_table(index_entries))
