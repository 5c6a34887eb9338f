"""Offscreen MuJoCo rendering shared by the built-in tasks: several envs in one process, depth in metres.

gymnasium's ``MujocoRenderer`` makes its GL context current only when it is created. With several envs in one
process (vector rows, suite members, tests) another env's context may be current, so each render makes its
own current first; and closing frees the GL objects in their own context (left to the garbage collector they
are freed in whatever context is current then, which deletes another live env's framebuffer).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def offscreen_viewer(renderer: Any) -> Any:
    """The ``OffScreenViewer`` of a gymnasium ``MujocoRenderer`` for ``rgb_array``, or None before the first
    render."""
    return getattr(renderer, "_viewers", {}).get("rgb_array") or getattr(renderer, "viewer", None)


def render_rgb(renderer: Any, camera_id: int | None = None) -> np.ndarray:
    """One RGB frame (a copy) of a gymnasium ``MujocoRenderer``, from ``camera_id`` if given, rendered in its own
    GL context."""
    viewer = offscreen_viewer(renderer)
    if viewer is not None:
        viewer.make_context_current()
    if camera_id is not None:
        renderer.camera_id = camera_id
    return np.array(renderer.render("rgb_array"), dtype=np.uint8, copy=True)


def close_renderer(renderer: Any) -> None:
    """Free a gymnasium ``MujocoRenderer``'s GL objects while its own context is current."""
    viewer = offscreen_viewer(renderer)
    if viewer is not None:
        viewer.make_context_current()
        viewer.con.free()


class DepthCamera:
    """Depth in metres per pixel through MuJoCo's own ``mujoco.Renderer`` (its own GL context; MuJoCo converts
    its reversed-Z buffer to metres), for a named camera or a viewer's ``MjvCamera``."""

    def __init__(self, model: Any, height: int, width: int) -> None:
        import mujoco

        self._renderer = mujoco.Renderer(model, height=height, width=width)
        self._renderer.enable_depth_rendering()

    def render(self, data: Any, camera: Any, scene_option: Any = None) -> np.ndarray:
        if scene_option is None:
            self._renderer.update_scene(data, camera=camera)
        else:
            self._renderer.update_scene(data, camera=camera, scene_option=scene_option)
        return np.array(self._renderer.render(), dtype=np.float32, copy=True)

    def close(self) -> None:
        self._renderer.close()  # frees its own GL context
