"""Per-frame task progress for LeRobot's RA-BC sample weights, from a demoforge export's exact sub-task labels.

    .venv/bin/python docs/examples/rabc_progress.py DATASET_DIR            # writes DATASET_DIR/sarm_progress.parquet
    lerobot-train --dataset.root=DATASET_DIR --dataset.repo_id=local/x --policy.type=act ... \
        --sample_weighting.type=rabc --sample_weighting.progress_path=DATASET_DIR/sarm_progress.parquet \
        --sample_weighting.head_mode=dense

LeRobot's RA-BC weights (``lerobot/rewards/sarm/rabc.py``) read a parquet of per-frame progress
(``index``, ``episode_index``, ``progress_sparse``, ``progress_dense``), normally predicted by a trained SARM
model. A demoforge export carries the labels SARM is trained to predict (each sub-task's frames and the
dataset's temporal proportions), so the progress can be computed exactly, with LeRobot's own functions
(``find_stage_and_tau``: the stage and the progress within it; ``normalize_stage_tau``: the stage's share
from the temporal proportions), and no model is downloaded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata
from lerobot.rewards.sarm.sarm_utils import find_stage_and_tau, normalize_stage_tau


def progress_table(root: Path) -> pd.DataFrame:
    meta = LeRobotDatasetMetadata("local/progress", root=root)
    episodes = meta.episodes.to_pandas()
    rows: dict[str, list] = {"index": [], "episode_index": [], "progress_sparse": [], "progress_dense": []}
    for mode in ("sparse", "dense"):
        proportions = json.loads((root / "meta" / f"temporal_proportions_{mode}.json").read_text())
        names = list(proportions)
        for _, episode in episodes.iterrows():
            length, first = int(episode["length"]), int(episode["dataset_from_index"])
            for frame in range(length):
                combined = find_stage_and_tau(frame, length, list(episode[f"{mode}_subtask_names"]),
                                              list(episode[f"{mode}_subtask_start_frames"]),
                                              list(episode[f"{mode}_subtask_end_frames"]), names, proportions,
                                              return_combined=True)
                rows[f"progress_{mode}"].append(float(normalize_stage_tau(combined, temporal_proportions=proportions,
                                                                          subtask_names=names)))
                if mode == "sparse":
                    rows["index"].append(first + frame)
                    rows["episode_index"].append(int(episode["episode_index"]))
    return pd.DataFrame(rows)


def main() -> None:
    root = Path(sys.argv[1])
    table = progress_table(root)
    out = root / "sarm_progress.parquet"
    table.to_parquet(out, index=False)
    print(f"{len(table)} frames of {table['episode_index'].nunique()} episodes -> {out}")


if __name__ == "__main__":
    main()
