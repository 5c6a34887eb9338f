"""The one compiled part of demoforge; everything else is configured in pyproject.toml.

LeRobot's running sums of a camera's pixels in one pass (storage/rgb_sums.py says why it is C): a plain shared
library loaded with ctypes, no Python API. Contraction off and no fast-math: each float32 multiply and add
rounds on its own, as numpy's do. (pyproject.toml's ext-modules table is still experimental in setuptools.)
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("demoforge.storage._rgb_sums", ["storage/rgb_sums.c"],
                             extra_compile_args=["-O2", "-ffp-contract=off", "-fno-fast-math"])])
