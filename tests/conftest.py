import os
import sys
from pathlib import Path

# Offscreen MuJoCo rendering on CPU must be chosen before mujoco is imported anywhere.
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))
