"""Offscreen MuJoCo rendering shared by the built-in tasks: several envs in one process, depth in metres.

gymnasium's ``MujocoRenderer`` makes its GL context current only when it is created. With several envs in one
process (vector rows, suite members, tests) another env's context may be current, so each render makes its
own current first; and closing frees the GL objects in their own context (left to the garbage collector they
are freed in whatever context is current then, which deletes another live env's framebuffer).

Rendering is serialised within a process (:data:`GL_LOCK`): with two env threads (``--workers 2`` of the thread
executor) rendering at once through two EGL contexts, MuJoCo's offscreen renderer crashed the process
(SIGSEGV in ``mjr_render``, reproduced with fetch-pick-place). The lock is the process's, as the GL driver is;
on CPU (Mesa llvmpipe) a render already uses the cores through the driver's own threads, so one at a time
costs little; separate processes (``--executor process``) render in parallel.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np


def offscreen_viewer(renderer: Any) -> Any:
    """The ``OffScreenViewer`` of a gymnasium ``MujocoRenderer`` for ``rgb_array``, or None before the first
    render."""
    return getattr(renderer, "_viewers", {}).get("rgb_array") or getattr(renderer, "viewer", None)


#: The option every built-in MuJoCo task takes: multisample anti-aliasing of its cameras (on, as the simulators
#: ship and LeRobot's envs render). Off, Mesa's CPU renderer draws a frame about 2x faster at the sizes tests and
#: small policies use (ALOHA 64x64: 40 -> 15 ms a step; fetch 21 -> 10 ms); only edge pixels change.
ANTIALIAS = "antialias"


def set_antialias(model: Any, on: bool) -> None:
    """Turn off multisampling of ``model``'s offscreen renders when ``on`` is false; must run before the first
    render makes the GL context (its sample count is fixed then)."""
    if not on:
        model.vis.quality.offsamples = 0


#: One GL user at a time in this process (see the module docstring).
GL_LOCK = threading.RLock()


@contextmanager
def own_context(renderer: Any) -> Iterator[None]:
    """Hold :data:`GL_LOCK` with a gymnasium ``MujocoRenderer``'s context current (once it has a viewer)."""
    with GL_LOCK:
        viewer = offscreen_viewer(renderer)
        if viewer is not None:
            viewer.make_context_current()
        yield


#: Renderers :func:`close_renderer` closed. gymnasium keeps a closed viewer and renders through it again (its GL
#: context gone: another context's pixels, and a fresh context nobody frees before MuJoCo's EGL display is
#: terminated at exit); a render of one of these is refused instead.
_CLOSED: weakref.WeakSet[Any] = weakref.WeakSet()


def render_rgb(renderer: Any, camera_id: int | None = None) -> np.ndarray:
    """One RGB frame (a copy) of a gymnasium ``MujocoRenderer``, from ``camera_id`` if given, rendered in its own
    GL context."""
    if renderer in _CLOSED:
        raise RuntimeError("render of a closed env (its GL context is freed): the caller holds an env it closed")
    with own_context(renderer):
        if camera_id is not None:
            renderer.camera_id = camera_id
        return np.array(renderer.render("rgb_array"), dtype=np.uint8, copy=True)


def close_renderer(renderer: Any) -> None:
    """Free a gymnasium ``MujocoRenderer``'s GL objects while its own context is current (the env's own close
    then destroys the context); a later :func:`render_rgb` of it is refused."""
    _CLOSED.add(renderer)
    with GL_LOCK:
        viewer = offscreen_viewer(renderer)
        if viewer is not None:
            viewer.make_context_current()
            viewer.con.free()


class DepthCamera:
    """Depth in metres per pixel through MuJoCo's own ``mujoco.Renderer`` (its own GL context; MuJoCo converts
    its reversed-Z buffer to metres), for a named camera or a viewer's ``MjvCamera``."""

    def __init__(self, model: Any, height: int, width: int) -> None:
        import mujoco

        with GL_LOCK:
            self._renderer = mujoco.Renderer(model, height=height, width=width)
            self._renderer.enable_depth_rendering()

    def render(self, data: Any, camera: Any, scene_option: Any = None) -> np.ndarray:
        with GL_LOCK:
            if scene_option is None:
                self._renderer.update_scene(data, camera=camera)
            else:
                self._renderer.update_scene(data, camera=camera, scene_option=scene_option)
            return np.array(self._renderer.render(), dtype=np.float32, copy=True)

    def close(self) -> None:
        with GL_LOCK:
            self._renderer.close()  # frees its own GL context
