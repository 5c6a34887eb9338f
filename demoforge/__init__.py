"""demoforge: segment-aware, crash-proof robot demonstration generation.

The code lives in the top-level folders of the repository (``pipeline/``, ``stages/``, ``storage/``), which
are installed as ``demoforge.pipeline``, ``demoforge.stages`` and ``demoforge.storage``.
"""

__version__ = "0.1.0"
