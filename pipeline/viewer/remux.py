"""A staged camera stream (fragmented MP4 in Zarr) as a standalone mp4 a browser plays and seeks: the packets
are copied, never re-encoded, and shifted so the first frame is shown at time 0 (encoders that reorder frames
start presentation one frame late), which makes a frame's time ``index / fps`` as in an exported dataset."""

from __future__ import annotations

import io

import av


def remux_to_mp4(data: bytes) -> bytes:
    out_buf = io.BytesIO()
    with av.open(io.BytesIO(data), mode="r") as src:
        in_stream = src.streams.video[0]
        first_pts = min((p.pts for p in src.demux(in_stream) if p.pts is not None), default=0)
        src.seek(0)
        with av.open(out_buf, mode="w", format="mp4") as out:
            out_stream = out.add_stream_from_template(in_stream, opaque=True)
            for packet in src.demux(in_stream):
                if packet.dts is None and packet.pts is None:
                    continue  # the demuxer's end-of-stream marker
                if packet.pts is not None:
                    packet.pts -= first_pts
                if packet.dts is not None:
                    packet.dts -= first_pts
                packet.stream = out_stream
                out.mux(packet)
    return out_buf.getvalue()
