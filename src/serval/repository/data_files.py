"""One sample of a tensor from a data file in a folder of the model's own, as Triton reads
model_warmup's input_data_file (`warmup/`) and an initial state's data_file
(`initial_state/`): row-major little-endian values, BYTES as 4-byte length + bytes. Never a
file outside that folder, and never more than MAX_FILE_BYTES."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from serval.errors import ConfigError, InvalidInput
from serval.protocol.bytes_tensor import tensor_from_raw

MAX_FILE_BYTES = 1 << 30  # one sample's data file
WARMUP_FOLDER = "warmup"  # as Triton: beside the version folders
INITIAL_STATE_FOLDER = "initial_state"
DATA_FOLDERS = (WARMUP_FOLDER, INITIAL_STATE_FOLDER)  # a load reads them: an edit reloads


def read_sample(model_dir: Path, folder_name: str, file: str, datatype: str,
                dims: list[int], where: str) -> np.ndarray:
    """The file's sample, shaped `dims`; ConfigError naming `where`, the file and what is
    wrong (missing, outside the folder, too large, or not `dims` of `datatype`)."""
    folder = (model_dir / folder_name).resolve()
    path = (folder / file).resolve()
    if folder not in path.parents or not path.is_file():
        raise ConfigError(f"{where} '{file}': no such file in the model's {folder_name}/ "
                          "folder")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise ConfigError(f"{where} '{file}' has {size} bytes; at most {MAX_FILE_BYTES} are "
                          "read")
    data = path.read_bytes()
    try:
        return tensor_from_raw(data, 0, len(data), datatype, tuple(dims), "x",
                               size_source="it has")
    except InvalidInput as exc:  # "input 'x': what is wrong"
        raise ConfigError(f"{where} '{file}': {exc.message.split(': ', 1)[1]} (one sample "
                          f"of dims {dims})") from None
