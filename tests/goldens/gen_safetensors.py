"""Writes tests/goldens/safetensors_dtypes.safetensors: one tensor per dtype the reader
converts, with values known to tests/test_safetensors.cpp.

Debian's torch 1.13 has no safetensors package, so the file is laid out by hand with
struct and json, the way the reference implementation does it (8-byte little-endian
header length, JSON header padded with spaces, row-major little-endian data). To check
that the reader sorts by offset rather than by name, the data section holds the tensors
in reverse name order and the header lists them in yet another order.
Run: /usr/bin/python3 tests/goldens/gen_safetensors.py
"""
import json
import os
import struct


def bf16(values):
    # bfloat16 is the upper half of a float32; every value below is exact in bfloat16.
    return b"".join(struct.pack("<f", v)[2:] for v in values)


# name -> (dtype, shape, raw little-endian bytes)
TENSORS = {
    "f32": ("F32", [2, 3], struct.pack("<6f", 0.0, 1.0, -2.5, 3.25, 1e-8, -1e30)),
    # 1, -2.5, largest half, smallest normal 2^-14, smallest subnormal 2^-24, -0, inf
    "f16": ("F16", [7], struct.pack("<7e", 1.0, -2.5, 65504.0, 2.0**-14, 2.0**-24, -0.0, float("inf"))),
    "bf16": ("BF16", [2, 2], bf16([1.0, -3.140625, 2.0**100, 2.0**-130])),
    "f64": ("F64", [3], struct.pack("<3d", 0.1, -1e10, 2.5)),
    "bn.num_batches_tracked": ("I64", [], struct.pack("<q", 12345)),
    "i64": ("I64", [3], struct.pack("<3q", -7, 0, 2**40)),
    "i32": ("I32", [2], struct.pack("<2i", -2**31, 123456)),
    "i16": ("I16", [2], struct.pack("<2h", -32768, 32767)),
    "i8": ("I8", [3], struct.pack("<3b", -128, 0, 127)),
    "u8": ("U8", [3], bytes([0, 200, 255])),
    "bool": ("BOOL", [4], bytes([1, 0, 0, 1])),
    "empty": ("F32", [2, 0], b""),
}
# Non-ASCII values exercise \u escapes, the emoji a surrogate pair.
METADATA = {"format": "pt", "note": "caf\u00e9 \"quoted\" \U0001F642"}


def main():
    header, blobs, offset = {}, [], 0
    for name in sorted(TENSORS, reverse=True):
        dtype, shape, raw = TENSORS[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header = dict(sorted(header.items(), key=lambda item: len(item[0])))  # neither name nor offset order
    header["__metadata__"] = METADATA
    text = json.dumps(header).encode()  # ensure_ascii: non-ASCII as \uXXXX
    text += b" " * (-len(text) % 8)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "safetensors_dtypes.safetensors")
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.write(b"".join(blobs))
    os.replace(path + ".tmp", path)
    print(f"wrote {path} ({len(TENSORS)} tensors, {offset} data bytes)")


if __name__ == "__main__":
    main()
