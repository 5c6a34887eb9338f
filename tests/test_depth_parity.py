"""demoforge's depth settings, quantizer and dequantizer (``storage/depth.py``, written without importing
lerobot, whose import costs seconds of torch in every depth process) equal LeRobot 0.6.1's own, bit for bit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from demoforge.storage import depth as depth_video
from demoforge.storage.schema import DepthVideoIdentity

DEFAULT = depth_video.lerobot_depth_identity()
OTHER = dataclasses.replace(DEFAULT, depth_min=0.2, depth_max=3.0, shift=0.5)
LINEAR = dataclasses.replace(DEFAULT, use_log=False)


def _config(identity: DepthVideoIdentity):
    from lerobot.configs.video import DepthEncoderConfig

    return DepthEncoderConfig(vcodec=identity.codec, pix_fmt=identity.pix_fmt, g=identity.g, crf=identity.crf,
                              preset=identity.preset, extra_options=dict(identity.extra_options),
                              depth_min=identity.depth_min, depth_max=identity.depth_max, shift=identity.shift,
                              use_log=identity.use_log)


def test_the_default_identity_is_lerobots_depth_encoder_with_quiet_x265():
    from lerobot.configs.video import DEPTH_QMAX, DepthEncoderConfig

    theirs = DepthEncoderConfig()
    extra = dict(theirs.extra_options)
    extra["x265-params"] = f"{extra['x265-params']}:{depth_video.QUIET_X265}"
    assert DEFAULT == DepthVideoIdentity(
        codec=theirs.vcodec, pix_fmt=theirs.pix_fmt, g=theirs.g, crf=theirs.crf, preset=theirs.preset,
        extra_options=extra, depth_min=float(theirs.depth_min), depth_max=float(theirs.depth_max),
        shift=float(theirs.shift), use_log=bool(theirs.use_log))
    assert depth_video.DEPTH_QMAX == DEPTH_QMAX


@pytest.mark.parametrize("identity", [DEFAULT, dataclasses.replace(DEFAULT, preset="fast", crf=None, g=5),
                                      dataclasses.replace(DEFAULT, codec="h264", pix_fmt="gray10le", extra_options={"g": "9", "x": 1})])
def test_codec_options_are_lerobots(identity):
    assert depth_video.codec_options(identity) == _config(identity).get_codec_options(as_strings=True)


def _depths(rng: np.random.Generator) -> list[np.ndarray]:
    scene = (rng.random((37, 53)) * 12.0).astype(np.float32)  # below depth_min, inside, beyond depth_max
    scene[0, :6] = [0.0, 0.01, 10.0, 10.5, 1e-7, 3.0]
    return [scene, scene[..., None], scene[None], (rng.random((1, 5)) * 2).astype(np.float32),
            rng.random((8, 8)).astype(np.float64)]


@pytest.mark.parametrize("identity", [DEFAULT, OTHER, LINEAR], ids=["default", "other", "linear"])
def test_quantized_codes_and_frames_are_lerobots_bit_for_bit(identity):
    from lerobot.datasets.depth_utils import quantize_depth

    kwargs = dict(depth_min=identity.depth_min, depth_max=identity.depth_max, shift=identity.shift,
                  use_log=identity.use_log, pix_fmt=identity.pix_fmt, input_unit="m")
    for depth in _depths(np.random.default_rng(5)):
        ours = depth_video.quantize_codes(depth, identity)
        theirs = quantize_depth(depth, video_backend=None, **kwargs)
        assert ours.dtype == theirs.dtype == np.uint16 and ours.shape == theirs.shape
        np.testing.assert_array_equal(ours, theirs)
        frame, their_frame = depth_video.quantize(depth, identity), quantize_depth(depth, video_backend="pyav",
                                                                                   **kwargs)
        assert (frame.format.name, frame.width, frame.height) == (their_frame.format.name, their_frame.width,
                                                                   their_frame.height)
        np.testing.assert_array_equal(frame.to_ndarray(format=identity.pix_fmt),
                                      their_frame.to_ndarray(format=identity.pix_fmt))


@pytest.mark.parametrize("identity", [DEFAULT, OTHER, LINEAR], ids=["default", "other", "linear"])
def test_dequantized_metres_are_lerobots_bit_for_bit(identity):
    from lerobot.datasets.depth_utils import dequantize_depth

    codes = np.arange(depth_video.DEPTH_QMAX + 1, dtype=np.uint16).reshape(4, 32, 32)
    theirs = dequantize_depth(codes[..., None], depth_min=identity.depth_min, depth_max=identity.depth_max,
                              shift=identity.shift, use_log=identity.use_log, pix_fmt=identity.pix_fmt,
                              output_unit="m", output_tensor=False, output_channel_last=True)[..., 0]
    ours = depth_video.dequantize(codes, identity)
    assert ours.dtype == theirs.dtype == np.float32 and ours.shape == codes.shape
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(depth_video.dequantize(codes[1], identity), theirs[1])


def test_settings_lerobot_refuses_are_refused_by_name():
    bad = dataclasses.replace(DEFAULT, depth_min=0.1, shift=-0.2)
    for call in (lambda: depth_video.quantize_codes(np.ones((2, 2), np.float32), bad),
                 lambda: depth_video.dequantize(np.ones((2, 2), np.uint16), bad)):
        with pytest.raises(depth_video.DepthSettingsError, match="depth_min \\+ shift must be positive"):
            call()
    with pytest.raises(depth_video.DepthSettingsError, match="'libsvtav1'"):
        depth_video.codec_options(dataclasses.replace(DEFAULT, codec="libsvtav1"))
