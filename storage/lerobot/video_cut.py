"""Cutting episodes out of a LeRobot mp4 without re-encoding them: packets are copied as they are.

A LeRobot v3.0 video file holds several episodes one after another; an episode is the frames shown in
``[from_timestamp, to_timestamp)``. Keeping some of them means copying their packets into a new file, each
episode's timestamps shifted so it sits where its new metadata says. That is lossless when the copied packets
need no frame outside them: the episode starts on a keyframe, and no frame before its end refers to one after
it. demoforge writes every episode as its own encode (so does LeRobot's recorder), so both always hold.

Files that were re-encoded as one stream (LeRobot's own ``delete_episodes`` / ``split_dataset`` do that) can
have an episode start between keyframes. Then only the frames up to the episode's first keyframe are decoded
and re-encoded (a *smart cut*), with the encoder settings the feature's ``info`` records, and the rest is
copied; likewise the frames after the last keyframe when the stream reorders frames across the episode's end.
The re-encoded frames must share the file's stream headers (``extradata``): when the encoder's differ, the cut
is refused (nothing is written) rather than made with headers that would decode the copied packets wrongly.

:func:`copy_spans` writes kept episodes into one new file (an edit); :func:`copy_episodes` writes each episode
into a file of its own (LeRobot v2.1), reading the source once.

Timestamps: a copied run keeps its own decode delay (dts below pts); every run of a file is placed so that the
file's decode timestamps only increase (runs with less delay are decoded a little earlier).
"""

from __future__ import annotations

import bisect
import contextlib
import io
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, NamedTuple

import av

from demoforge.storage.lerobot.publish import ExportError
from demoforge.storage.video import open_encoder


class VideoCutError(ExportError):
    """An episode's frames cannot be cut out of its video file as its metadata describes (nothing was written)."""


@dataclass(frozen=True)
class Span:
    """One episode in a source video file: its ``length`` frames are shown in ``[from_s, to_s)``."""

    label: str  # names the episode in errors ("episode 3")
    from_s: float
    to_s: float
    length: int


@dataclass(frozen=True)
class SpanCut:
    """How an episode's frames are carried over: ``head`` and ``tail`` frames re-encoded around ``copied``."""

    head: int
    copied: int
    tail: int

    @property
    def reencoded(self) -> int:
        return self.head + self.tail


class _Packet(NamedTuple):  # (a tuple: files hold many thousands, made in a loop)
    order: int  # position in decode order
    frame: int  # presentation position, in frames from time 0
    key: bool
    pts: int
    dts: int  # pts when the container records none


@dataclass
class _Segment:
    """Packets that go into the output in one piece: copied from the source, or re-encoded (in memory)."""

    first: int  # the first frame, in the source's frames
    frames: int
    copied: bool
    packets: list[Any] = field(default_factory=list)  # re-encoded only (av.Packet); copied ones are read as written
    orders: frozenset[int] = frozenset()  # copied: which source packets (decode positions)
    time_base: Fraction = Fraction(1)
    first_pts: int = 0  # in time_base
    first_dts: int = 0


@dataclass(frozen=True)
class _Plan:
    cut: SpanCut
    first_frame: int  # frame A of the span
    segments: tuple[_Segment, ...]


class VideoFile:
    """One source mp4, demuxed once (packet timestamps and keyframe flags only; nothing decoded)."""

    HOLD_BYTES = 64 << 20  # a file up to this size keeps its packets from the first demux (no second read)

    def __init__(self, path: Path, fps: int, *, hold: bool = False) -> None:
        """``hold``: keep the packets (when the file is at most HOLD_BYTES) for :func:`copy_spans`."""
        self.path, self.fps = path, fps
        self.held: list[Any] | None = [] if hold and path.stat().st_size <= self.HOLD_BYTES else None
        try:
            with av.open(str(path)) as container:
                stream = container.streams.video[0]
                if stream.time_base is None:
                    raise VideoCutError(f"{path}: the video stream has no time base")
                self.time_base = Fraction(stream.time_base)
                self.extradata = bytes(stream.codec_context.extradata or b"")
                self.codec = stream.codec_context.name
                packets: list[_Packet] = []
                for packet in container.demux(stream):
                    if packet.pts is None or not packet.size:
                        continue
                    packets.append(_Packet(len(packets), self.frame_of(packet.pts), bool(packet.is_keyframe),
                                           int(packet.pts), int(packet.pts if packet.dts is None else packet.dts)))
                    if self.held is not None:
                        self.held.append(packet)
        except (av.FFmpegError, IndexError) as exc:
            raise VideoCutError(f"cannot read {path}: {exc}") from None
        self.packets = packets
        self.by_frame = {p.frame: p for p in packets}
        if len(self.by_frame) != len(packets):
            raise VideoCutError(f"{path}: two packets are shown at the same frame time; not a constant-frame-rate "
                                "LeRobot video")
        self.keyframes = sorted(p.frame for p in packets if p.key)
        self.last_frame = max(self.by_frame, default=-1)

    def frame_of(self, pts: int) -> int:
        exact = pts * self.time_base.numerator * self.fps  # / time_base.denominator, rounded half up
        return (2 * exact + self.time_base.denominator) // (2 * self.time_base.denominator)

    def _frames(self, span: Span) -> tuple[int, int]:
        first, end = round(span.from_s * self.fps), round(span.to_s * self.fps)
        held = sum(1 for f in range(first, end) if f in self.by_frame)
        if end - first != span.length or held != span.length:
            raise VideoCutError(f"{self.path}: {span.label} is shown in [{span.from_s:.4f}, {span.to_s:.4f}) s, "
                                f"where the file holds {held} frame(s); its metadata says {span.length}")
        return first, end

    def _gop_end(self, key: int) -> int:
        at = bisect.bisect_right(self.keyframes, key)
        return self.keyframes[at] if at < len(self.keyframes) else self.last_frame + 1

    def _prefix_ok(self, key: int, end: int) -> bool:
        """Whether, in the GOP starting at ``key``, the packets of frames before ``end`` all come before the
        others in decode order (then none of them refers to a frame at or after ``end``)."""
        members = (self.by_frame.get(f) for f in range(key, self._gop_end(key)))
        gop = sorted((p for p in members if p is not None), key=lambda p: p.order)
        wanted = sum(1 for p in gop if p.frame < end)
        return all(p.frame < end for p in gop[:wanted])

    def cut(self, span: Span) -> SpanCut:
        """What carrying ``span`` over costs: frames re-encoded before and after the copied packets."""
        first, end = self._frames(span)
        start, stop = self._copy_range(first, end)
        return SpanCut(start - first, stop - start, end - stop)

    def _copy_range(self, first: int, end: int) -> tuple[int, int]:
        """The frames ``[start, stop)`` of ``[first, end)`` whose packets can be copied (start == stop: none)."""
        inside = self.keyframes[bisect.bisect_left(self.keyframes, first):bisect.bisect_left(self.keyframes, end)]
        if not inside:
            return first, first
        start = inside[0]
        last = inside[-1]
        if self._gop_end(last) <= end or self._prefix_ok(last, end):
            return start, end
        return start, last  # the last GOP reorders frames across the episode's end: re-encode its frames

    # ------------------------------------------------------------------------------------------ planning
    def plan(self, span: Span, info: Mapping[str, Any] | None) -> _Plan:
        first, end = self._frames(span)
        start, stop = self._copy_range(first, end)
        segments: list[_Segment] = []
        if start > first:
            segments.append(self._reencode(span, first, start, info))
        if stop > start:
            run = [self.by_frame[f] for f in range(start, stop)]
            segments.append(_Segment(start, stop - start, True, orders=frozenset(p.order for p in run),
                                     time_base=self.time_base, first_pts=min(p.pts for p in run),
                                     first_dts=min(p.dts for p in run)))
        if end > stop:
            segments.append(self._reencode(span, stop, end, info))
        return _Plan(SpanCut(start - first, stop - start, end - stop), first, tuple(segments))

    def _reencode(self, span: Span, first: int, end: int, info: Mapping[str, Any] | None) -> _Segment:
        from demoforge.storage.video import decode_span_frames

        earlier = [k for k in self.keyframes if k <= first]
        if not earlier:
            raise VideoCutError(f"{self.path}: {span.label} starts before the file's first keyframe; its frames "
                                "cannot be decoded")
        frames = decode_span_frames(self.path, first / self.fps, end / self.fps, self.fps)
        if len(frames) != end - first:
            raise VideoCutError(f"{self.path}: decoding {span.label}'s frames {first}-{end - 1} gave {len(frames)}")
        packets, time_base, extradata = _encode(frames, self.fps, info)
        if extradata != self.extradata:
            raise VideoCutError(
                f"{self.path}: {span.label} does not start on a keyframe, and re-encoding its first frames with the "
                f"encoder settings in meta/info.json gives stream headers that differ from the file's (encoded by "
                "another encoder or other settings), so they cannot share the file; nothing was written")
        return _Segment(first, end - first, False, packets=packets, time_base=time_base,
                        first_pts=min(p.pts for p in packets),
                        first_dts=min(p.pts if p.dts is None else p.dts for p in packets))


def _encode(frames: Sequence[av.VideoFrame], fps: int, info: Mapping[str, Any] | None
            ) -> tuple[list[Any], Fraction, bytes]:
    """``frames`` encoded as LeRobot's writer would with the feature's recorded settings, muxed into an
    in-memory mp4 and demuxed again (so packets and headers are in mp4 form): packets, their time base and
    the stream headers."""
    from lerobot.configs import encoder_config_from_video_info

    try:
        config = encoder_config_from_video_info(dict(info or {}))
    except ValueError as exc:
        raise VideoCutError(f"cannot re-encode with the settings in meta/info.json: {exc}") from None
    buffer = io.BytesIO()
    rate = Fraction(fps)
    with av.open(buffer, mode="w", format="mp4") as out:
        stream = out.add_stream(config.vcodec, rate=rate, options=config.get_codec_options(as_strings=True))
        stream.width, stream.height = frames[0].width, frames[0].height
        stream.pix_fmt = config.pix_fmt
        stream.time_base = Fraction(1, fps)
        open_encoder(stream)
        for i, frame in enumerate(frames):
            frame = frame.reformat(format=config.pix_fmt) if frame.format.name != config.pix_fmt else frame
            frame.pts, frame.time_base = i, Fraction(1, fps)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    with av.open(io.BytesIO(buffer.getvalue()), mode="r") as container:
        stream = container.streams.video[0]
        packets = [p for p in container.demux(stream) if p.size and p.pts is not None]
        headers = bytes(stream.codec_context.extradata or b"")
        time_base = Fraction(stream.time_base or Fraction(1, fps))
    return packets, time_base, headers


# -------------------------------------------------------------------------------------------- writing
@dataclass(frozen=True)
class CopyResult:
    spans: tuple[tuple[float, float], ...]  # each episode's [from_s, to_s) in the new file
    cuts: tuple[SpanCut, ...]

    @property
    def reencoded(self) -> int:
        return sum(c.reencoded for c in self.cuts)


def copy_spans(source: VideoFile, spans: Sequence[Span], out_path: Path,
               info: Mapping[str, Any] | None = None) -> CopyResult:
    """Write the episodes ``spans`` of ``source`` (in time order) into a new mp4 at ``out_path``, one after
    another from time 0, copying their packets (re-encoding only what :meth:`VideoFile.cut` reports)."""
    with _reading(source, spans, info, "to keep") as (plans, in_stream, packets):
        return _write(source, plans, spans, out_path, in_stream, packets)


def copy_episodes(source: VideoFile, spans: Sequence[Span], out_paths: Sequence[Path],
                  info: Mapping[str, Any] | None = None) -> tuple[CopyResult, ...]:
    """Each of ``spans`` (in time order) into an mp4 of its own (``out_paths``, in the same order), from time
    0, as :func:`copy_spans` copies them; the source is read once for all of them (LeRobot v2.1's one file per
    episode, from a v3.0 file holding many)."""
    if len(spans) != len(out_paths):
        raise ValueError("one output path per span")
    with _reading(source, spans, info, "to copy") as (plans, in_stream, packets):
        return tuple(_write(source, [plan], [span], path, in_stream, packets)
                     for plan, span, path in zip(plans, spans, out_paths))


@contextlib.contextmanager
def _reading(source: VideoFile, spans: Sequence[Span], info: Mapping[str, Any] | None,
             what: str) -> Iterator[tuple[list[_Plan], Any, _Packets]]:
    """The spans' cut plans, and the source open with the packets they copy, for one pass over the file."""
    if any(b.from_s < a.to_s - 0.5 / source.fps for a, b in zip(spans, spans[1:])):
        raise VideoCutError(f"{source.path}: the episodes {what} are not in time order in the file")
    plans = [source.plan(span, info) for span in spans]
    with av.open(str(source.path)) as src:
        in_stream = src.streams.video[0]
        yield plans, in_stream, _Packets(source, src, in_stream, _copied_orders(plans))


def _copied_orders(plans: Sequence[_Plan]) -> set[int]:
    return {o for plan in plans for s in plan.segments if s.copied for o in s.orders}


class _Packets:
    """The source packets a copy needs, by decode position: the held ones, or read in one pass over the file
    (a packet read past that a later segment needs, which frame reordering across an episode's end can cause,
    is kept until it is asked for)."""

    def __init__(self, source: VideoFile, container: Any, stream: Any, wanted: set[int]) -> None:
        self.source, self.wanted = source, wanted
        self.kept: dict[int, Any] = {}
        self.read = None if source.held is not None else _numbered(container, stream)

    def get(self, order: int) -> Any:
        if self.read is None:
            assert self.source.held is not None
            return self.source.held[order]
        packet = self.kept.pop(order, None)
        if packet is not None:
            return packet
        for number, packet in self.read:
            if number == order:
                return packet
            if number in self.wanted:
                self.kept[number] = packet
        raise VideoCutError(f"{self.source.path}: packet {order} was not found on a second read of the file "
                            "(it changed meanwhile?)")


def _write(source: VideoFile, plans: Sequence[_Plan], spans: Sequence[Span], out_path: Path, in_stream: Any,
           packets: _Packets) -> CopyResult:
    """The planned segments of ``spans`` into a new mp4 at ``out_path``, one after another from time 0."""
    fps = source.fps
    out_spans: list[tuple[float, float]] = []
    placed: list[tuple[_Segment, Fraction]] = []  # each segment with the output time of its first frame
    offset = 0
    for plan, span in zip(plans, spans):
        for segment in plan.segments:
            placed.append((segment, Fraction(offset + segment.first - plan.first_frame, fps)))
        out_spans.append((offset / fps, (offset + span.length) / fps))
        offset += span.length
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(out_path), mode="w", format="mp4") as out:
        out_stream = out.add_stream_from_template(in_stream, opaque=True)  # copy, never encode
        delay = max((s.first_pts - s.first_dts) * s.time_base for s, _ in placed)
        last_dts: Fraction | None = None  # in seconds, at the end of the previous segment
        for segment, start in placed:
            tb = segment.time_base
            lower = delay - (segment.first_pts - segment.first_dts) * tb  # decode this run earlier by this much
            pts_shift = start / tb - segment.first_pts  # in the segment's time base (whole for CFR streams)
            dts_shift = pts_shift - lower / tb
            whole = pts_shift.denominator == 1 and dts_shift.denominator == 1
            run = (packets.get(o) for o in sorted(segment.orders)) if segment.copied else iter(segment.packets)
            previous: int | None = None
            for packet in run:
                dts_in = packet.pts if packet.dts is None else packet.dts
                if whole:
                    pts, dts = packet.pts + int(pts_shift), dts_in + int(dts_shift)
                else:
                    pts, dts = round(packet.pts + pts_shift), round(dts_in + dts_shift)
                if (previous is None and last_dts is not None and dts * tb <= last_dts) or \
                        (previous is not None and dts <= previous):
                    raise VideoCutError(f"{source.path}: cannot order the decode timestamps of the kept episodes "
                                        "(the stream's frame reordering changes within the file)")
                previous = dts
                packet.pts, packet.dts = pts, dts
                packet.time_base = tb
                packet.stream = out_stream
                out.mux(packet)
            if previous is not None:
                last_dts = previous * tb
    return CopyResult(tuple(out_spans), tuple(p.cut for p in plans))


def _numbered(container: Any, stream: Any) -> Iterator[tuple[int, Any]]:
    """The stream's packets (those with a timestamp and data: what :class:`VideoFile` numbers) with their
    decode positions."""
    order = 0
    for packet in container.demux(stream):
        if packet.pts is None or not packet.size:
            continue
        yield order, packet
        order += 1
