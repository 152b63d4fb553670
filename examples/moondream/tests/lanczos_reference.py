#!/usr/bin/env python3
"""Writes Pillow's Lanczos resizes of generated images, the reference of tests/image.test.cpp.
Usage: lanczos_reference.py OUT.bin
Each case: int32 H, W, h, w, then H*W*3 input bytes (HWC, RGB), then h*w*3 output bytes: the input resized
to w x h with Image.LANCZOS (as the reference's fallback path, moondream-spec 6.3)."""
import struct
import sys

import numpy as np
from PIL import Image

rng = np.random.default_rng(7)
# (H, W) -> (h, w): md2's global crop of an 800x600 image, its local-crop canvas (tiling (2, 4): one side
# grows), a small image grown, a tall one shrunk hard, and a shape that keeps one side
cases = [((600, 800), (378, 378)), ((600, 800), (644, 1176)), ((200, 300), (378, 378)), ((1920, 1080), (378, 378)),
         ((257, 311), (257, 150))]
with open(sys.argv[1], "wb") as f:
    for (H, W), (h, w) in cases:
        y, x = np.mgrid[0:H, 0:W]
        smooth = np.stack([x * 255 // max(W - 1, 1), y * 255 // max(H - 1, 1), (x + y) * 255 // (H + W)], axis=-1)
        edges = ((x // 7 + y // 11) % 2) * 255  # hard edges: the lobes' overshoot must clip alike
        noise = rng.integers(0, 256, size=(H, W, 3))
        img = np.where((x < W // 3)[..., None], smooth, np.where((y < H // 2)[..., None], edges[..., None], noise)).astype(np.uint8)
        out = np.asarray(Image.fromarray(img, "RGB").resize((w, h), Image.LANCZOS))
        f.write(struct.pack("<4i", H, W, h, w))
        f.write(img.tobytes())
        f.write(out.tobytes())
