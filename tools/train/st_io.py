"""Minimal safetensors reader/writer.

The format is an 8-byte little-endian header length, a JSON header naming
each tensor's dtype, shape and byte range, then the raw bytes. Writing it
ourselves keeps the tools usable where the `safetensors` package is missing
(the CPU machine); the device run checks the files with the real package.
"""

import json
import struct

import numpy as np
import torch

_NAMES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32",
          torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL"}
_NP = {"F16": np.float16, "F32": np.float32, "I64": np.int64, "I32": np.int32,
       "U8": np.uint8, "BOOL": np.bool_}


def _raw(t: torch.Tensor) -> bytes:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:      # numpy has no bfloat16: move the bits
        return t.view(torch.int16).numpy().tobytes()
    if t.dtype == torch.bool:
        return t.to(torch.uint8).numpy().tobytes()
    return t.numpy().tobytes()


def save(tensors: dict, path, metadata: dict = None):
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    for name in sorted(tensors):
        t = tensors[name]
        b = _raw(t)
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)          # keep the data 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load(path) -> dict:
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        buf = data[base + a: base + b]
        if info["dtype"] == "BF16":
            t = torch.from_numpy(np.frombuffer(buf, dtype=np.int16).copy()).view(torch.bfloat16)
        else:
            t = torch.from_numpy(np.frombuffer(buf, dtype=_NP[info["dtype"]]).copy())
        out[name] = t.reshape(info["shape"])
    return out


def metadata(path) -> dict:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)).get("__metadata__", {})
