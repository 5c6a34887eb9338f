"""Settings the stages read from a job: how cameras are encoded, when a job of failing episodes gives up.

The job (pipeline/job.py) carries them; they live here so that the stages need nothing from the floor above.
"""

from __future__ import annotations

from dataclasses import dataclass

from demoforge.storage.schema import CameraSpec, VideoIdentity

CODEC_ALIASES = {"av1": "libsvtav1", "libx264": "h264", "x264": "h264"}
SUPPORTED_CODECS = ("libsvtav1", "h264", "hevc", "libaom-av1")

DEFAULT_MAX_CONSECUTIVE_ABANDONED = 20
"""A healthy task abandons an episode only when all its attempts fail: with 3 attempts at even a 20% success
rate per attempt, 20 given episodes are all abandoned with probability 0.512**20, about 1.5e-6; a broken task
(a crashing env, a wrong option) reaches it within minutes instead of running until stopped."""
#: A job whose cameras have at least this many pixels per frame (all cameras together) runs each worker's
#: encoders in a process of their own unless told otherwise (stages/encoder_process.py): there it takes 4-10 % off a
#: real task's wall time (docs/performance.md, "The recorder out of the simulator's process"), while for small
#: frames the process's start (about half a second of CPU) costs more than it saves.
ENCODER_PROCESS_MIN_PIXELS = 128 * 128


class JobConfigError(ValueError):
    """A job setting is out of range or unknown."""


def encoder_placement(process: bool | None, idle: bool | None,
                      cameras: tuple[CameraSpec, ...]) -> tuple[bool, bool]:
    """Where a job's workers encode and how: (in a process of their own, that process at idle priority).
    ``process`` None: by frame size, or always when idle priority is asked for (only a process of their own can
    take it); ``idle`` None: idle wherever the encoders run in a process of their own."""
    apart = encoders_apart(process, cameras, idle is True)
    return apart, apart and idle is not False


def encoders_apart(choice: bool | None, cameras: tuple[CameraSpec, ...], idle: bool = False) -> bool:
    """Whether a job's workers encode in a process of their own: ``choice`` if given (None: by frame size, or
    always when the encoders are to run at idle priority, which only a process of their own can)."""
    if choice is not None:
        return choice and bool(cameras)
    return bool(cameras) and (idle or sum(c.width * c.height for c in cameras) >= ENCODER_PROCESS_MIN_PIXELS)


@dataclass(frozen=True)
class VideoSettings:
    """Camera encoding; the defaults are LeRobot 0.6.1's (SVT-AV1, yuv420p, g=2, crf=30, preset 12)."""

    codec: str = "libsvtav1"
    crf: int | None = 30
    preset: int | str | None = None
    g: int = 2
    pix_fmt: str = "yuv420p"
    encoder_threads: int | None = None

    def __post_init__(self) -> None:
        codec = CODEC_ALIASES.get(self.codec, self.codec)
        if codec not in SUPPORTED_CODECS:
            raise JobConfigError(f"unsupported codec {self.codec!r}; choose one of {', '.join(SUPPORTED_CODECS)}")
        object.__setattr__(self, "codec", codec)
        if self.preset is None:
            object.__setattr__(self, "preset", {"libsvtav1": 12, "h264": "veryfast", "hevc": "veryfast"}.get(codec))
        if self.g < 1:
            raise JobConfigError(f"g (keyframe interval) must be >= 1, got {self.g}")

    def codec_options(self) -> dict[str, str]:
        """PyAV codec options, mapped as LeRobot 0.6.1's ``VideoEncoderConfig.get_codec_options`` maps them.

        Written out here because importing lerobot pulls in torch (seconds of start-up per process); a test
        checks this mapping against lerobot's own for every supported codec.
        """
        opts: dict[str, str] = {"g": str(self.g)}
        if self.crf is not None:
            opts["crf"] = str(self.crf)
        if self.preset is not None:
            opts["preset"] = str(self.preset)
        if self.codec == "libsvtav1":
            params = ["fast-decode=0"]
            if self.encoder_threads is not None:
                params.append(f"lp={self.encoder_threads}")
            opts["svtav1-params"] = ":".join(params)
        elif self.codec in ("h264", "hevc") and self.encoder_threads is not None:
            opts["threads"] = str(self.encoder_threads)
        elif self.codec == "libaom-av1" and self.encoder_threads is not None:
            opts["threads"] = str(self.encoder_threads)
            opts["row-mt"] = "1"
        return opts

    def identity(self) -> VideoIdentity:
        """The settings that change the bytes of the stored video (threads do not)."""
        return VideoIdentity(codec=self.codec, crf=self.crf, preset=self.preset, g=self.g, pix_fmt=self.pix_fmt)
