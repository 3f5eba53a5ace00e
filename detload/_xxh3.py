"""XXH3-64 with a seed (xxHash's ``XXH3_64bits_withSeed``) computed in NumPy uint64 arithmetic: one
hash per integer or per byte string, without a Python call per value. Inputs of up to 240 bytes are
hashed here; longer ones go to the xxhash library one value at a time (rare in feature columns).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["MIDSIZE_MAX", "hash_bytes", "hash_words"]

_MASK = (1 << 64) - 1
_U = np.uint64

_P64_1 = _U(0x9E3779B185EBCA87)
_P64_2 = _U(0xC2B2AE3D27D4EB4F)
_P64_3 = _U(0x165667B19E3779F9)
_MX1 = _U(0x165667919E3779F9)
_MX2 = _U(0x9FB21C651E98DF25)

# XXH3's default secret (192 bytes); only the first 136 are read for inputs up to 240 bytes.
_SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e"
)

#: The longest input hashed here; longer ones are hashed by the xxhash library.
MIDSIZE_MAX = 240

_S8, _S24, _S28, _S29, _S32 = _U(8), _U(24), _U(28), _U(29), _U(32)
_S33, _S35, _S37 = _U(33), _U(35), _U(37)
_LO32 = _U(0xFFFFFFFF)


def _s64(off: int) -> int:
    return int.from_bytes(_SECRET[off:off + 8], "little")


def _s32(off: int) -> int:
    return int.from_bytes(_SECRET[off:off + 4], "little")


def _rotl(h: np.ndarray, r: int) -> np.ndarray:
    return (h << _U(r)) | (h >> _U(64 - r))


def _avalanche_xxh64(h: np.ndarray) -> np.ndarray:
    h ^= h >> _S33
    h *= _P64_2
    h ^= h >> _S29
    h *= _P64_3
    h ^= h >> _S32
    return h


def _avalanche(h: np.ndarray) -> np.ndarray:
    h ^= h >> _S37
    h *= _MX1
    h ^= h >> _S32
    return h


def _rrmxmx(h: np.ndarray, length: Any) -> np.ndarray:
    h ^= _rotl(h, 49) ^ _rotl(h, 24)
    h *= _MX2
    h ^= (h >> _S35) + length
    h *= _MX2
    h ^= h >> _S28
    return h


def _mul128_fold64(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The low 64 bits xor the high 64 bits of the 128-bit product a * b, from 32-bit halves
    (xxHash's portable XXH_mult64to128: no partial sum overflows 64 bits)."""
    lower = a * b  # the low 64 bits, as the wrapping product
    a_lo, a_hi = a & _LO32, a >> _S32
    b_lo, b_hi = b & _LO32, b >> _S32
    cross = a_lo * b_lo
    cross >>= _S32
    np.multiply(a_hi, b_lo, out=b_lo)  # b_lo: hi * lo
    np.multiply(a_lo, b_hi, out=a_lo)  # a_lo: lo * hi
    np.multiply(a_hi, b_hi, out=a_hi)  # a_hi: hi * hi
    np.bitwise_and(b_lo, _LO32, out=b_hi)
    cross += b_hi
    cross += a_lo
    cross >>= _S32  # the carry into the high word
    b_lo >>= _S32
    a_hi += b_lo
    a_hi += cross  # the high 64 bits
    lower ^= a_hi
    return lower


#: Rows hashed at a time: every temporary array then stays in the CPU's cache (3x faster than
#: whole columns of a million rows, whose temporaries go to memory at every step).
CHUNK = 32768


def hash_words(words: np.ndarray, seed: int) -> np.ndarray:
    """XXH3-64 of each uint64's 8 little-endian bytes (the 4-to-8-byte path at length 8)."""
    v = np.asarray(words, dtype=_U)
    if v.ndim != 1:
        return hash_words(v.reshape(-1), seed).reshape(v.shape)
    if v.size > CHUNK:
        out = np.empty(v.size, dtype=_U)
        for a in range(0, v.size, CHUNK):
            out[a:a + CHUNK] = _hash_words(v[a:a + CHUNK], seed)
        return out
    return _hash_words(v, seed)


def _hash_words(v: np.ndarray, seed: int) -> np.ndarray:
    seed2 = seed ^ (int.from_bytes((seed & 0xFFFFFFFF).to_bytes(4, "little"), "big") << 32)
    bitflip = _U(((_s64(8) ^ _s64(16)) - seed2) & _MASK)
    # input1 = the low 4 bytes, input2 = the high 4: input2 + (input1 << 32) is v rotated by 32.
    keyed = _rotl(v, 32)
    keyed ^= bitflip
    return _rrmxmx(keyed, _S8)


class _Reader:
    """Unaligned little-endian reads at byte offsets of one contiguous byte buffer."""

    def __init__(self, values: np.ndarray) -> None:
        buf = np.ascontiguousarray(values, dtype=np.uint8).reshape(-1)
        if buf.size < 8:  # every read lies inside one value; this only makes the views below exist
            buf = np.concatenate([buf, np.zeros(8, dtype=np.uint8)])
        self.buf = buf
        self.u64 = np.ndarray((buf.size - 7,), dtype="<u8", buffer=buf, strides=(1,))
        self.u32 = np.ndarray((buf.size - 3,), dtype="<u4", buffer=buf, strides=(1,))

    def le64(self, pos: np.ndarray) -> np.ndarray:
        return self.u64[pos].astype(_U, copy=False)  # no copy where little-endian is native

    def le32(self, pos: np.ndarray) -> np.ndarray:
        return self.u32[pos].astype(_U)

    def mix16(self, pos: np.ndarray, off: int, seed: int) -> np.ndarray:
        lo = self.le64(pos)
        lo ^= _U((_s64(off) + seed) & _MASK)
        hi = self.le64(pos + 8)
        hi ^= _U((_s64(off + 8) - seed) & _MASK)
        return _mul128_fold64(lo, hi)


# Length classes: 0, 1-3, 4-8, 9-16, 17-128, 129-240, longer.
_CLASSES = ((0, 0), (1, 3), (4, 8), (9, 16), (17, 128), (129, MIDSIZE_MAX), (MIDSIZE_MAX + 1, None))
# The class of every length up to MIDSIZE_MAX + 1 (longer lengths are clipped to it).
_CLASS_OF = np.repeat(np.arange(len(_CLASSES), dtype=np.uint8),
                      [1, 3, 5, 8, 112, MIDSIZE_MAX - 128, 1])


def hash_bytes(values: np.ndarray, offsets: np.ndarray, seed: int) -> np.ndarray:
    """XXH3-64 (``seed``) of each byte string ``values[offsets[i]:offsets[i + 1]]``, as uint64."""
    offsets = np.asarray(offsets, dtype=np.int64)
    n = offsets.size - 1
    out = np.empty(max(n, 0), dtype=_U)
    if n <= 0:
        return out
    rd = _Reader(values)
    for a in range(0, n, CHUNK):
        out[a:a + CHUNK] = _hash_chunk(rd, offsets[a:a + CHUNK + 1], seed)
    return out


def _hash_chunk(rd: _Reader, offsets: np.ndarray, seed: int) -> np.ndarray:
    out = np.empty(offsets.size - 1, dtype=_U)
    starts = offsets[:-1]
    lengths = np.diff(offsets)
    lmin, lmax = int(lengths.min()), int(lengths.max())
    cls = None
    for k, (lo, hi) in enumerate(_CLASSES):
        if lmax < lo or (hi is not None and lmin > hi):
            continue
        if lmin >= lo and (hi is None or lmax <= hi):
            s, ln = starts, lengths  # every value is in this class
            idx: Any = slice(None)
        else:
            if cls is None:
                cls = _CLASS_OF[np.minimum(lengths, MIDSIZE_MAX + 1)]
            idx = np.flatnonzero(cls == k)
            s, ln = starts[idx], lengths[idx]
        out[idx] = _CLASS_FNS[k](rd, s, ln, seed)
    return out


def _len0(rd: _Reader, s: np.ndarray, ln: np.ndarray, seed: int) -> np.ndarray:
    h = np.full(s.size, (seed ^ _s64(56) ^ _s64(64)) & _MASK, dtype=_U)
    return _avalanche_xxh64(h)


def _len1to3(rd: _Reader, s: np.ndarray, ln: np.ndarray, seed: int) -> np.ndarray:
    b = rd.buf
    c1 = b[s].astype(_U)
    c2 = b[s + (ln >> 1)].astype(_U)
    c3 = b[s + ln - 1].astype(_U)
    combined = (c1 << _U(16)) | (c2 << _S24) | c3 | (ln.astype(_U) << _S8)
    combined ^= _U(((_s32(0) ^ _s32(4)) + seed) & _MASK)
    return _avalanche_xxh64(combined)


def _len4to8(rd: _Reader, s: np.ndarray, ln: np.ndarray, seed: int) -> np.ndarray:
    seed2 = seed ^ (int.from_bytes((seed & 0xFFFFFFFF).to_bytes(4, "little"), "big") << 32)
    bitflip = _U(((_s64(8) ^ _s64(16)) - seed2) & _MASK)
    keyed = rd.le32(s + ln - 4) + (rd.le32(s) << _S32)
    keyed ^= bitflip
    return _rrmxmx(keyed, ln.astype(_U))


def _len9to16(rd: _Reader, s: np.ndarray, ln: np.ndarray, seed: int) -> np.ndarray:
    lo = rd.le64(s)
    lo ^= _U(((_s64(24) ^ _s64(32)) + seed) & _MASK)
    hi = rd.le64(s + ln - 8)
    hi ^= _U(((_s64(40) ^ _s64(48)) - seed) & _MASK)
    acc = ln.astype(_U) + lo.byteswap() + hi + _mul128_fold64(lo, hi)
    return _avalanche(acc)


def _len17to128(rd: _Reader, s: np.ndarray, ln: np.ndarray, seed: int) -> np.ndarray:
    acc = ln.astype(_U) * _P64_1
    acc += rd.mix16(s, 0, seed)
    acc += rd.mix16(s + ln - 16, 16, seed)
    # Longer values add pairs of 16-byte mixes from both ends (mod 2**64, so the order is free).
    for above, k in ((32, 1), (64, 2), (96, 3)):
        sub = np.flatnonzero(ln > above)
        if not sub.size:
            break
        ss, ll = s[sub], ln[sub]
        acc[sub] += rd.mix16(ss + 16 * k, 32 * k, seed) + rd.mix16(ss + ll - 16 * (k + 1), 32 * k + 16, seed)
    return _avalanche(acc)


def _len129to240(rd: _Reader, s: np.ndarray, ln: np.ndarray, seed: int) -> np.ndarray:
    acc = ln.astype(_U) * _P64_1
    for i in range(8):
        acc += rd.mix16(s + 16 * i, 16 * i, seed)
    acc = _avalanche(acc)
    acc_end = rd.mix16(s + ln - 16, 136 - 17, seed)
    rounds = ln // 16
    for i in range(8, MIDSIZE_MAX // 16):
        sub = np.flatnonzero(rounds > i)
        if not sub.size:
            break
        acc_end[sub] += rd.mix16(s[sub] + 16 * i, 16 * (i - 8) + 3, seed)
    return _avalanche(acc + acc_end)


def _long(rd: _Reader, s: np.ndarray, ln: np.ndarray, seed: int) -> np.ndarray:
    import xxhash

    data = rd.buf
    return np.fromiter((xxhash.xxh3_64_intdigest(data[a:a + b].tobytes(), seed) for a, b in zip(s.tolist(),
                                                                                               ln.tolist())),
                       dtype=_U, count=s.size)


_CLASS_FNS = (_len0, _len1to3, _len4to8, _len9to16, _len17to128, _len129to240, _long)
