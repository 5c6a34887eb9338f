"""One pass over an RGB frame's pixels that adds them to LeRobot's running sums, in C (``rgb_sums.c``).

LeRobot's camera statistics are per channel float32 sums of the values and of their squares, taken one pixel
after another, and counts of the 256 values (``storage/lerobot_stats.py``). numpy has no fused, ordered
reduction: it converts the frame to float32, squares it, runs ``np.add.accumulate`` twice (the only numpy
reduction that keeps the order) and ``np.bincount`` three times: seven passes holding the interpreter lock,
0.6 ms for a 120x160 sample. The C loop does the same float32 operations in the same order in one pass,
without the lock, in 0.05 ms.

Why C and not numba, which compiles the same loop to the same speed: numba costs 0.6-0.8 s of CPU in every
process that calls it, even with its on-disk cache (importing it, then loading the compiled code), and the
recorder's encoder process is started for each job: on a 360-frame job that is more than the loop saves. The
C loop is built by ``pip install`` (setuptools, the gcc that tools/setup.sh installs; a second checkout sharing a
venv builds its own with ``setup.py build_ext --inplace``) and loaded with ``ctypes`` in about a millisecond.
"""

from __future__ import annotations

import ctypes
import importlib.util

import numpy as np

_LIBRARY = "demoforge.storage._rgb_sums"


def _load() -> ctypes._NamedFuncPointer:
    spec = importlib.util.find_spec(_LIBRARY)
    if spec is None or spec.origin is None:
        raise ImportError(f"{_LIBRARY} (storage/rgb_sums.c) is not built: run `bash tools/setup.sh` from the "
                          "repository root (it needs gcc); in a second checkout that shares another's venv, "
                          "`.venv/bin/python setup.py build_ext --inplace` builds it there")
    function = ctypes.CDLL(spec.origin).demoforge_add_rgb_pixels  # CDLL: the call releases the interpreter lock
    size = ctypes.c_ssize_t
    function.argtypes = [ctypes.c_void_p, size, size, size, size, size, ctypes.c_void_p, ctypes.c_void_p,
                         ctypes.c_void_p]
    function.restype = None
    return function


_add_rgb_pixels = _load()


def add_pixels(image: np.ndarray, total: np.ndarray, total_sq: np.ndarray, counts: np.ndarray) -> None:
    """Add the pixels of ``image`` (h, w, 3) uint8, any strides, row after row, to ``total`` and ``total_sq``
    (float32 (3,), updated in place: one sequential sum per channel) and ``counts`` (int64 (3, 256))."""
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"RGB sums take (h, w, 3) uint8 pixels, not {image.shape} {image.dtype}")
    for name, array, dtype, shape in (("total", total, np.float32, (3,)), ("total_sq", total_sq, np.float32, (3,)),
                                      ("counts", counts, np.int64, (3, 256))):
        if array.dtype != dtype or array.shape != shape or not array.flags.c_contiguous or not array.flags.writeable:
            raise ValueError(f"RGB sums: {name} must be a writeable C-contiguous {np.dtype(dtype)} {shape} array")
    height, width, _ = image.shape
    rows, columns, channels = image.strides
    _add_rgb_pixels(image.ctypes.data, height, width, rows, columns, channels, total.ctypes.data,
                    total_sq.ctypes.data, counts.ctypes.data)
