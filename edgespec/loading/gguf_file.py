"""Read a GGUF file (llama.cpp's format) with NumPy, dequantizing the block types MLX cannot read.

`mx.load` reads GGUF files whose tensors are F32 / F16 / Q4_0 / Q4_1 / Q8_0 and refuses the
k-quants ("[load_gguf] gguf_tensor_to_f16 failed" for Q4_K / Q6_K, which a Q4_K_M file mixes with
Q5_0 and Q8_0). This module reads the file itself: header, metadata, tensor table, and every tensor
dequantized to float32 from its block layout.

Layout (GGUF v2/v3, little-endian): magic "GGUF", u32 version, u64 tensor count, u64 metadata
count; metadata as (string key, u32 type, value); tensor infos as (string name, u32 n_dims,
u64 dims[n_dims], u32 type, u64 offset); the data section starts at the next multiple of
`general.alignment` (default 32). dims[0] is the innermost (contiguous) dimension, so a tensor
with dims [640, 1024] is a NumPy array of shape (1024, 640).

Block layouts (ggml-common.h of ggml-org/llama.cpp; values per block / bytes per block):
  Q8_0 32/34: f16 d, i8 q[32]                      x = d * q
  Q4_0 32/18: f16 d, u8 q[16]                      x = d * (nibble - 8)
  Q4_1 32/20: f16 d, f16 m, u8 q[16]               x = d * nibble + m
  Q5_0 32/22: f16 d, u32 qh, u8 q[16]              x = d * (nibble | high bit << 4) - 16 d
  Q5_1 32/24: f16 d, f16 m, u32 qh, u8 q[16]       x = d * (nibble | high bit << 4) + m
  Q4_K 256/144: f16 d, f16 dmin, u8 scales[12], u8 q[128]: 8 sub-blocks of 32, each with a 6-bit
                scale s and min m:  x = d * s * nibble - dmin * m
  Q5_K 256/176: as Q4_K plus u8 qh[32] (one high bit per value)
  Q6_K 256/210: u8 ql[128], u8 qh[64], i8 scales[16], f16 d: 16 sub-blocks of 16,
                x = d * scale * (low 4 bits | high 2 bits << 4) - 32 d * scale
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from edgespec.errors import ModelLoadError

MAGIC = b"GGUF"
# metadata value types -> struct format (8 = string, 9 = array are handled apart)
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q"}
_SCALAR |= {11: "<q", 12: "<d"}
_NP_SCALAR = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1"}
_NP_SCALAR |= {10: "<u8", 11: "<i8", 12: "<f8"}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the table: its NumPy shape (outermost first), ggml type and data offset."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int

    @property
    def n_values(self) -> int:
        return int(np.prod(self.shape))


class GGUFFile:
    """A GGUF file opened for reading: `metadata` (plain Python values), `tensors` (name ->
    TensorInfo) and `dequantize(name)` (float32 NumPy array). The data section is memory-mapped."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                self.metadata, self.tensors, start = _read_header(f)
        except (OSError, struct.error, UnicodeDecodeError, ValueError) as e:
            raise ModelLoadError(f"cannot read GGUF file {self.path}: {e}") from None
        self._data = np.memmap(self.path, dtype=np.uint8, mode="r", offset=start)

    def type_name(self, name: str) -> str:
        """The ggml type's name of tensor `name` ("Q4_K", "F32", ...)."""
        t = self.tensors[name].ggml_type
        return TYPES[t][0] if t in TYPES else f"type {t}"

    def affine(self, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, int] | None:
        """(codes [rows, cols] uint8, scales and biases [rows, cols / 32] float32, code bits)
        for a tensor whose blocks are affine groups of 32 (Q4_0 / Q4_1 / Q5_x / Q8_0 / Q4_K /
        Q5_K: x = scale * code + bias exactly), else None (Q6_K, floats)."""
        info = self.tensors[name]
        if info.ggml_type not in AFFINE or len(info.shape) != 2:
            return None
        codes, scales, biases = AFFINE[info.ggml_type](self._blocks(info))
        rows, cols = info.shape
        return (
            codes.reshape(rows, cols),
            scales.reshape(rows, cols // GROUP),
            biases.reshape(rows, cols // GROUP),
            CODE_BITS[info.ggml_type],
        )

    def dequantize(self, name: str) -> np.ndarray:
        """Tensor `name` as a float32 array of its shape; an unsupported type raises one line."""
        info = self.tensors[name]
        blocks = self._blocks(info)
        values = TYPES[info.ggml_type][3](blocks)
        return values.astype(np.float32, copy=False).reshape(info.shape)

    def _blocks(self, info: TensorInfo) -> np.ndarray:
        """The tensor's bytes as [n_blocks, bytes per block]; one-line errors for an unknown
        type, rows that are not whole blocks, or a file cut short."""
        if info.ggml_type not in TYPES:
            raise ModelLoadError(
                f"{self.path.name}: tensor {info.name} has ggml type "
                f"{info.ggml_type}, which EdgeSpec cannot dequantize"
            )
        _, per_block, nbytes, _ = TYPES[info.ggml_type]
        if info.shape[-1] % per_block:
            raise ModelLoadError(f"{self.path.name}: tensor {info.name} rows are not whole blocks")
        n_blocks = info.n_values // per_block
        raw = self._data[info.offset : info.offset + n_blocks * nbytes]
        if raw.size != n_blocks * nbytes:
            raise ModelLoadError(
                f"{self.path.name}: tensor {info.name} runs past the end of the file"
            )
        return np.asarray(raw).reshape(n_blocks, nbytes)


def _read_header(f: BinaryIO) -> tuple[dict[str, Any], dict[str, TensorInfo], int]:
    if f.read(4) != MAGIC:
        raise ValueError("not a GGUF file (bad magic)")
    version, n_tensors, n_kv = struct.unpack("<IQQ", f.read(20))
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} is not supported (2 or 3)")
    meta = {}
    for _ in range(n_kv):
        key = _string(f)
        meta[key] = _value(f, struct.unpack("<I", f.read(4))[0])
    tensors = {}
    for _ in range(n_tensors):
        name = _string(f)
        (n_dims,) = struct.unpack("<I", f.read(4))
        dims = struct.unpack(f"<{n_dims}Q", f.read(8 * n_dims))
        ggml_type, offset = struct.unpack("<IQ", f.read(12))
        tensors[name] = TensorInfo(name, tuple(int(d) for d in reversed(dims)), ggml_type, offset)
    align = int(meta.get("general.alignment", 32))
    pos = f.tell()
    return meta, tensors, (pos + align - 1) // align * align


def _string(f: BinaryIO) -> str:
    (n,) = struct.unpack("<Q", f.read(8))
    return f.read(n).decode("utf-8")


def _value(f: BinaryIO, kind: int) -> Any:
    if kind == 8:
        return _string(f)
    if kind == 9:
        elem, n = struct.unpack("<IQ", f.read(12))
        if elem in _NP_SCALAR:  # numeric arrays (scores, token types) in one read
            arr = np.frombuffer(f.read(n * np.dtype(_NP_SCALAR[elem]).itemsize), _NP_SCALAR[elem])
            return arr.astype(bool).tolist() if elem == 7 else arr.tolist()
        return [_value(f, elem) for _ in range(n)]
    if kind not in _SCALAR:
        raise ValueError(f"unknown metadata value type {kind}")
    fmt = _SCALAR[kind]
    return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]


# --- block decoders: [n_blocks, bytes] uint8 -> [n_blocks, values] float32 -----------------------


def _f16(b: np.ndarray, at: int) -> np.ndarray:
    """The fp16 at byte `at` of every block, as a float32 column [n, 1]."""
    return b[:, at : at + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(q: np.ndarray) -> np.ndarray:
    """[n, k] bytes -> [n, 2k] values: all low nibbles first, then all high nibbles (the order of
    Q4_0 / Q4_1 / Q5_x blocks and of each 32-byte run of Q4_K)."""
    return np.concatenate([q & 0x0F, q >> 4], axis=-1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """[n, 4] bytes of a little-endian u32 -> [n, 32] bits (bit j is value j's fifth bit)."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


# Affine types: every group of 32 values is x = scale * code + bias with unsigned integer codes.
# Their decoders return (codes [n, values], scales [n, groups], biases [n, groups]); see `Affine`.


def _q8_0(b: np.ndarray) -> Affine:
    d = _f16(b, 0)
    return (b[:, 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8), d, -128 * d


def _q4_0(b: np.ndarray) -> Affine:
    d = _f16(b, 0)
    return _nibbles(b[:, 2:]), d, -8 * d


def _q4_1(b: np.ndarray) -> Affine:
    return _nibbles(b[:, 4:]), _f16(b, 0), _f16(b, 2)


def _q5_0(b: np.ndarray) -> Affine:
    d = _f16(b, 0)
    return _nibbles(b[:, 6:]) | (_high_bits(b[:, 2:6]) << 4), d, -16 * d


def _q5_1(b: np.ndarray) -> Affine:
    return _nibbles(b[:, 8:]) | (_high_bits(b[:, 4:8]) << 4), _f16(b, 0), _f16(b, 2)


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 six-bit (scale, min) pairs packed in a Q4_K / Q5_K block's 12 bytes, each [n, 8].
    Sub-blocks 0-3 use the low 6 bits of bytes 0-3 (scale) and 4-7 (min); sub-blocks 4-7 take
    their low 4 bits from bytes 8-11 and their top 2 bits from the spare top bits of bytes 0-7."""
    s = s.astype(np.uint8)
    lo_sc, lo_m, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([lo_sc & 63, (hi & 0x0F) | ((lo_sc >> 6) << 4)], axis=-1)
    mn = np.concatenate([lo_m & 63, (hi >> 4) | ((lo_m >> 6) << 4)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _q4_k(b: np.ndarray) -> Affine:
    n = b.shape[0]
    sc, mn = _k_scales(b[:, 4:16])
    # 4 runs of 32 bytes; each gives two sub-blocks: its low nibbles, then its high nibbles
    q = _nibbles(b[:, 16:].reshape(n, 4, 32)).reshape(n, 256)
    return q, _f16(b, 0) * sc, -_f16(b, 2) * mn


def _q5_k(b: np.ndarray) -> Affine:
    n = b.shape[0]
    sc, mn = _k_scales(b[:, 4:16])
    low = _nibbles(b[:, 48:].reshape(n, 4, 32)).reshape(n, 8, 32)
    # qh[32]: bit k of byte l is the fifth bit of value l of sub-block k
    high = np.unpackbits(b[:, 16:48][:, None, :], axis=1, count=8, bitorder="little")
    return (low | (high << 4)).reshape(n, 256), _f16(b, 0) * sc, -_f16(b, 2) * mn


def _q6_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    ql = b[:, :128].reshape(n, 2, 64)  # two halves of 128 values
    qh = b[:, 128:192].reshape(n, 2, 32)
    scales = b[:, 192:208].view(np.int8).astype(np.float32).reshape(n, 16)
    # within a half: values l, l+32, l+64, l+96 take ql[l] low, ql[l+32] low, ql[l] high,
    # ql[l+32] high, and the 2-bit pairs 0-1, 2-3, 4-5, 6-7 of qh[l]
    low = np.concatenate(
        [ql[..., :32] & 0x0F, ql[..., 32:] & 0x0F, ql[..., :32] >> 4, ql[..., 32:] >> 4], axis=-1
    )
    high = np.concatenate([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=-1)
    q = (low | (high << 4)).astype(np.float32).reshape(n, 16, 16) - 32
    return (_f16(b, 208)[:, :, None] * scales[:, :, None] * q).reshape(n, 256)


def _plain(dtype: str) -> Callable[[np.ndarray], np.ndarray]:
    return lambda b: b.view(dtype).astype(np.float32)


def affine_values(codes: np.ndarray, scales: np.ndarray, biases: np.ndarray) -> np.ndarray:
    """x = scale * code + bias per group of 32 (the arithmetic of mx.dequantize): [n, values].

    >>> affine_values(np.arange(64, dtype=np.uint8)[None], np.array([[1.0, 2.0]]), np.array([[0.0, -1.0]]))[0, [0, 31, 32, 63]].tolist()
    [0.0, 31.0, 63.0, 125.0]
    """
    n, width = codes.shape
    q = codes.reshape(n, width // GROUP, GROUP).astype(np.float32)
    return (scales[:, :, None] * q + biases[:, :, None]).reshape(n, width)


def _values(affine: Callable[[np.ndarray], Affine]) -> Callable[[np.ndarray], np.ndarray]:
    return lambda b: affine_values(*affine(b))


GROUP = 32
Affine = tuple[np.ndarray, np.ndarray, np.ndarray]
# affine ggml types -> their code decoder (codes < 2**CODE_BITS[type])
AFFINE: dict[int, Callable[[np.ndarray], Affine]] = {
    2: _q4_0,
    3: _q4_1,
    6: _q5_0,
    7: _q5_1,
    8: _q8_0,
    12: _q4_k,
    13: _q5_k,
}
CODE_BITS = {2: 4, 3: 4, 6: 5, 7: 5, 8: 8, 12: 4, 13: 5}
# ggml type id -> (name, values per block, bytes per block, decoder to float32 values)
TYPES: dict[int, tuple[str, int, int, Callable[[np.ndarray], np.ndarray]]] = {
    0: ("F32", 1, 4, _plain("<f4")),
    1: ("F16", 1, 2, _plain("<f2")),
    2: ("Q4_0", 32, 18, _values(_q4_0)),
    3: ("Q4_1", 32, 20, _values(_q4_1)),
    6: ("Q5_0", 32, 22, _values(_q5_0)),
    7: ("Q5_1", 32, 24, _values(_q5_1)),
    8: ("Q8_0", 32, 34, _values(_q8_0)),
    12: ("Q4_K", 256, 144, _values(_q4_k)),
    13: ("Q5_K", 256, 176, _values(_q5_k)),
    14: ("Q6_K", 256, 210, _q6_k),
    30: ("BF16", 1, 2, lambda b: (b.view("<u2").astype(np.uint32) << 16).view(np.float32)),
}
