"""Token streams and batches from the corpus built by tools/corpus.

A split is stored as UTF-8 documents joined by NUL bytes; as tokens every
document becomes BOS, its bytes, EOS (ids 256, 257; bytes are their own ids).
"""

import lzma
from pathlib import Path

import numpy as np
import torch

from model import BOS, EOS


def load_split(corpus: str, split: str) -> np.ndarray:
    raw = lzma.decompress(Path(corpus, f"{split}.bin.xz").read_bytes())
    arr = np.frombuffer(raw, dtype=np.uint8).astype(np.int32)
    seps = np.flatnonzero(arr == 0)
    arr[seps] = EOS                      # each separator ends a document
    starts = np.concatenate([[0], seps + 1])
    out = np.insert(arr, starts, BOS)    # BOS before every document
    return np.append(out, EOS)


def split_docs(stream: np.ndarray):
    """The documents of a stream as lists of byte ids (BOS/EOS removed)."""
    ends = np.flatnonzero(stream == EOS)
    docs, start = [], 0
    for e in ends:
        docs.append(stream[start + 1:e])
        start = e + 1
    return docs


class Batches:
    """Random windows of seq+1 tokens, in an order fixed by the seed."""

    def __init__(self, stream: np.ndarray, batch: int, seq: int, seed: int, device):
        self.stream = torch.as_tensor(stream, dtype=torch.long, device=device)
        self.batch, self.seq = batch, seq
        self.rng = np.random.default_rng(seed)
        self.offsets = torch.arange(seq + 1, device=device)

    def next(self):
        starts = self.rng.integers(0, len(self.stream) - self.seq - 1, size=self.batch)
        idx = torch.as_tensor(starts, device=self.offsets.device)[:, None] + self.offsets
        w = self.stream[idx]
        return w[:, :-1], w[:, 1:]


def val_windows(stream: np.ndarray, seq: int):
    """Consecutive windows (stride seq, overlapping by one token) so that
    every token after the first is predicted exactly once; the last window
    may be shorter. Returns a list of int64 arrays."""
    out = []
    for i in range(0, len(stream) - 1, seq):
        out.append(np.asarray(stream[i:i + seq + 1], dtype=np.int64))
    return out


@torch.no_grad()
def evaluate(model, windows, device, batch=64, autocast=True):
    """Returns dict(loss per token, bits per byte, counts). Bits per byte
    charges all predicted tokens (bytes, EOS, BOS) to the byte count."""
    model.eval()
    nll, n_tok, n_byte = 0.0, 0, 0
    full = [w for w in windows if len(w) == len(windows[0])]
    rest = [w for w in windows if len(w) != len(windows[0])]
    groups = [full[i:i + batch] for i in range(0, len(full), batch)] + [[w] for w in rest]
    for g in groups:
        x = torch.as_tensor(np.stack(g), device=device)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(x[:, :-1])[0]
        y = x[:, 1:]
        nll += torch.nn.functional.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum").item()
        n_tok += y.numel()
        n_byte += int((y < 256).sum())
    model.train()
    return {"loss": nll / n_tok, "bpb": nll / n_byte / np.log(2),
            "tokens": n_tok, "bytes": n_byte}
