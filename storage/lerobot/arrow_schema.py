"""The arrow schema of a data parquet file, as LeRobot's writer gives it.

LeRobot maps its features to ``datasets.Features`` (``lerobot.datasets.feature_utils.get_hf_features_from_features``)
and writes their ``arrow_schema``: the arrow types plus a ``huggingface`` metadata entry that ``datasets`` reads the
features back from. Written here with pyarrow alone, because importing ``lerobot.datasets`` (torch, torchvision,
``datasets``) costs about 8 CPU-s in every export, edit and verify process, several times what a small export
itself takes. The mapping covers what demoforge exports (scalars, vectors, LeRobot's language columns); a feature
of two or more dimensions, or a stored image, goes to LeRobot's own function. A test compares both schemas,
metadata included, for every task's features.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from demoforge.storage.lerobot.format import LANGUAGE_FEATURES

_STRING = {"dtype": "string", "_type": "Value"}
_TOOL_CALLS = {"feature": {"_type": "Json"}, "_type": "List"}


def _language_row(with_timestamp: bool) -> tuple[pa.DataType, dict[str, Any]]:
    names = ["role", "content", "style"] + (["timestamp"] if with_timestamp else []) + ["camera", "tool_calls"]
    arrow = {"timestamp": pa.float32(), "tool_calls": pa.list_(pa.json_())}
    hf = {"timestamp": {"dtype": "float32", "_type": "Value"}, "tool_calls": _TOOL_CALLS}
    row = pa.struct([pa.field(n, arrow.get(n, pa.string())) for n in names])
    return pa.list_(row), {"feature": {n: hf.get(n, _STRING) for n in names}, "_type": "List"}


#: ``language_persistent`` rows carry the time they start; ``language_events`` rows happen at their frame.
_LANGUAGE = {"language_persistent": _language_row(True), "language_events": _language_row(False)}


def _value_type(dtype: str) -> pa.DataType:
    if dtype == "string":
        return pa.string()
    if dtype == "bool":
        return pa.bool_()
    return pa.from_numpy_dtype(dtype)


def data_schema(features: Mapping[str, Mapping[str, Any]]) -> pa.Schema:
    """The data parquet's schema for LeRobot ``features`` (``info.json``'s): video features have no column."""
    if any(ft["dtype"] == "image" or (ft["dtype"] not in ("video", "language") and len(ft["shape"]) > 1)
           for ft in features.values()):
        return _lerobot_schema(features)
    fields: list[pa.Field] = []
    hf: dict[str, Any] = {}
    for key, ft in features.items():
        if key in LANGUAGE_FEATURES:
            typ, hf[key] = _LANGUAGE[key]
        elif ft["dtype"] == "video":
            continue
        elif tuple(ft["shape"]) == (1,):
            typ, hf[key] = _value_type(ft["dtype"]), {"dtype": ft["dtype"], "_type": "Value"}
        else:
            (length,) = ft["shape"]
            typ = pa.list_(_value_type(ft["dtype"]), int(length))
            hf[key] = {"feature": {"dtype": ft["dtype"], "_type": "Value"}, "length": int(length), "_type": "List"}
        fields.append(pa.field(key, typ))
    return pa.schema(fields, metadata={"huggingface": json.dumps({"info": {"features": hf}})})


def _lerobot_schema(features: Mapping[str, Mapping[str, Any]]) -> pa.Schema:
    from lerobot.datasets.feature_utils import get_hf_features_from_features

    return get_hf_features_from_features({k: {**v, "shape": tuple(v["shape"])} for k, v in features.items()}
                                         ).arrow_schema
