"""``demoforge convert``: a published dataset in the other formats people train from (storage/convert/)."""

from __future__ import annotations

import argparse
from pathlib import Path

from demoforge.pipeline.cli.common import EXIT_OK, add_command, make_console

# The format names, kept here so that `demoforge --help` does not import the writers (h5py, tensorflow).
FORMAT_CHOICES = ("lerobot-v2.1", "robomimic-hdf5", "rlds")


def add_convert_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "convert", help="write a published dataset as LeRobot v2.1, robomimic HDF5 or RLDS",
                    description="Write a published LeRobot v3.0 dataset (an export, or an edit or merge of one) in "
                                "another format, with its segments, success and seeds where the format can hold "
                                "them (docs/export.md, 'Other formats'). The result is published with one rename: "
                                "a killed conversion leaves only OUT.partial-*.",
                    example="demoforge convert runs/fetch-dataset --format robomimic-hdf5 --out runs/fetch.hdf5")
    p.add_argument("dataset", type=Path, metavar="DATASET_DIR", help="a published LeRobot v3.0 dataset")
    p.add_argument("--format", required=True, choices=FORMAT_CHOICES,
                   help="lerobot-v2.1 (one parquet and one mp4 per episode, what GR00T and older openpi read), "
                        "robomimic-hdf5 (robomimic, MimicGen, Isaac Lab Mimic) or rlds (TFDS episodes: OpenVLA, "
                        "Octo). Required")
    p.add_argument("--out", type=Path, required=True,
                   help="the new dataset (a folder; a file for robomimic-hdf5); must not exist. Required")
    p.set_defaults(fn=cmd_convert)


def cmd_convert(args: argparse.Namespace) -> int:
    from demoforge.storage.convert import convert

    report = convert(args.dataset, args.format, args.out)
    out = make_console()
    out.print(f"converted {report.episodes} episode(s), {report.frames} frames of {args.dataset} to {report.format} "
              f"at {report.out} ({report.bytes / 1e6:.1f} MB, {report.seconds:.1f} s)")
    for note in report.notes:
        out.print(f"  note: {note}")
    return EXIT_OK
