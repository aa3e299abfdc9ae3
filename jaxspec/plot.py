"""A loss curve as a PNG with nothing but numpy, zlib and struct (no matplotlib on the GPU image)."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

from jaxspec.files import write_atomic

# 3x5 digit glyphs for the axis labels (rows top to bottom, 3 bits each).
_GLYPHS = {"0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
           "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001001001001",
           "8": "111101111101111", "9": "111101111001111", ".": "000000000000010", "-": "000000111000000",
           "e": "000111111100111", " ": "000000000000000"}


def write_png(path: str | Path, rgb: np.ndarray) -> None:
    """rgb [H, W, 3] uint8 -> an 8-bit RGB PNG at `path`, written whole (`files.write_atomic`)."""
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
    write_atomic(path, png)


def label(v: float, width: int = 7) -> str:
    """`v` in at most `width` characters of the glyphs above (no "+"), with as many significant digits as fit (3 at
    most): 1.234e-05 -> "1.23e-5", 1.5e+10 -> "1.5e10"."""
    for digits in (3, 2, 1):
        for form in (f"{v:.{digits}g}", f"{v:.{digits - 1}e}"):
            mant, _, exp = form.partition("e")
            s = mant + (f"e{int(exp)}" if exp else "")
            if len(s) <= width:
                return s
    return s


def _text(img, x, y, s, color, scale=2):
    for ch in s:
        g = _GLYPHS.get(ch, _GLYPHS[" "])
        for r in range(5):
            for c in range(3):
                if g[r * 3 + c] == "1":
                    img[y + r * scale:y + (r + 1) * scale, x + c * scale:x + (c + 1) * scale] = color
        x += 4 * scale


def loss_curve_png(path: str | Path, losses, *, width: int = 640, height: int = 400, smooth: int = 0) -> None:
    """Plot `losses` (one per step) with a moving average (window `smooth`, default ~2% of the steps):
    raw in light blue, smoothed in dark blue, y labels min/max, x label the number of steps."""
    y = np.asarray(losses, np.float64)
    img = np.full((height, width, 3), 255, np.uint8)
    left, right, top, bottom = 60, 10, 10, 30
    pw, ph = width - left - right, height - top - bottom
    img[top:top + ph + 1, left] = 0
    img[top + ph, left:left + pw + 1] = 0
    if len(y):
        y = np.where(np.isfinite(y), y, np.nan)
        lo, hi = np.nanmin(y), np.nanmax(y)
        hi = hi if hi > lo else lo + 1.0

        def draw(vals, color):
            xs = np.linspace(0, pw, len(vals)) if len(vals) > 1 else np.zeros(1)
            ys = ph - (vals - lo) / (hi - lo) * ph
            prev = None
            for xv, yv in zip(xs, ys):
                if not np.isfinite(yv):
                    prev = None
                    continue
                cur = (int(round(xv)) + left, int(round(yv)) + top)
                if prev is not None:
                    n = max(abs(cur[0] - prev[0]), abs(cur[1] - prev[1]), 1)
                    for t in np.linspace(0, 1, n + 1):
                        px, py = int(round(prev[0] + t * (cur[0] - prev[0]))), int(round(prev[1] + t * (cur[1] - prev[1])))
                        img[max(py - 0, 0):py + 1, px:px + 1] = color
                else:
                    img[cur[1], cur[0]] = color
                prev = cur

        draw(y, (160, 190, 240))
        k = smooth or max(1, len(y) // 50)
        if k > 1 and len(y) > k:
            sm = np.convolve(np.nan_to_num(y, nan=float(np.nanmean(y))), np.ones(k) / k, mode="valid")
            draw(np.concatenate([np.full(k - 1, np.nan), sm]), (20, 40, 160))
        _text(img, 2, top, label(hi), (0, 0, 0))
        _text(img, 2, top + ph - 10, label(lo), (0, 0, 0))
        _text(img, left + pw - 60, top + ph + 8, str(len(y)), (0, 0, 0))
        _text(img, left, top + ph + 8, "0", (0, 0, 0))
    write_png(path, img)
