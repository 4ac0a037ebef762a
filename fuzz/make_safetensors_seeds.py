#!/usr/bin/env python3
# Writes the seed corpus of fuzz_safetensors (fuzz/corpus/fuzz_safetensors/). Each seed's
# first byte picks the mode of fuzz/fuzz_safetensors.cpp: 0x00 = a .safetensors file,
# 0x01 = a model.safetensors.index.json (the fuzzer's temp folder holds
# model-0000{1,2,3}-of-00003.safetensors). Run from anywhere; needs only Python 3.
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus", "fuzz_safetensors")
ROOT = os.path.join(HERE, "..", "..")
SIZES = {"F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I32": 4, "I64": 8, "U8": 1, "BOOL": 1}


def safetensors(tensors, metadata=None, pad_to=8):
    """tensors: [(name, dtype, shape)]; data is a byte ramp."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape in tensors:
        n = SIZES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + n]}
        data += bytes((len(data) + i) & 0xFF for i in range(n))
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad_to:
        text += b" " * (-(8 + len(text)) % pad_to)
    return struct.pack("<Q", len(text)) + text + data


def write(name, mode, body):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(bytes([mode]) + body)


os.makedirs(OUT, exist_ok=True)
write("file-f32-2x2", 0, safetensors([("w", "F32", [2, 2])], {"format": "pt"}))
write("file-every-dtype", 0, safetensors([(f"t.{d}", d, [3]) for d in SIZES] + [("scalar", "F32", []), ("empty", "F16", [0, 3])]))
# An unpadded header: tensors land unaligned and are copied (SafetensorsFile::aligned_copies_).
write("file-unaligned", 0, safetensors([("a", "U8", [1]), ("b", "BF16", [2, 3]), ("c", "I64", [2])], pad_to=0))
write("file-rank4", 0, safetensors([("x", "F32", [1, 2, 1, 3]), ("y", "I32", [2, 1, 1, 1, 1])]))
# The shipped model's header (names, dtypes, ranks) with every dimension shrunk to 1..3.
with open(os.path.join(ROOT, "models/specula-byte-6m/model.safetensors"), "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    real = json.loads(f.read(n))
shrunk = [(k, v["dtype"], [min(d, 2 + i % 2) for i, d in enumerate(v["shape"])]) for k, v in real.items()
          if k != "__metadata__"]
write("file-specula-byte-6m-shrunk", 0, safetensors(shrunk[:24], real.get("__metadata__")))
write("file-truncated", 0, safetensors([("w", "F32", [4, 4])])[:-10])
write("file-header-too-long", 0, struct.pack("<Q", 1 << 40) + b"{}")
write("file-bad-offsets", 0, struct.pack("<Q", 62) + b'{"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}        ' + bytes(8))
write("file-unknown-dtype", 0, safetensors([("w", "U8", [2])]).replace(b'"U8"', b'"Q4"'))
write("file-too-many-dims", 0, safetensors([("w", "U8", [1] * 10)]))
write("file-empty-header", 0, struct.pack("<Q", 2) + b"{}")

shards = ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"]
def index(weight_map, **extra):
    return json.dumps({"metadata": {"total_size": 23}, "weight_map": weight_map, **extra}, indent=1).encode()
write("index-two-shards", 1, index({"a": shards[0], "shared": shards[0], "b": shards[1]}))
write("index-duplicate-tensor", 1, index({"a": shards[0], "shared": shards[2]}))
write("index-missing-shard", 1, index({"a": "model-00009-of-00009.safetensors"}))
write("index-no-weight-map", 1, b'{"metadata": {}, "weight_map": ["a"]}')
