"""Sequence batching against hostile ids and careless models, below the server: string ids
bounded in bytes, integer ids checked against the CORRID control's range."""

from __future__ import annotations

import pytest

from serval.batching.sequence_policy import MAX_STRING_ID_BYTES, sequence_flags
from serval.batching.sequence_tensors import check_corrid
from serval.errors import InvalidInput
from serval.model_config import SequenceBatchingConfig, SequenceControl

pytestmark = pytest.mark.unit


def test_a_string_id_is_at_most_1024_bytes_of_utf8() -> None:
    assert sequence_flags({"sequence_id": "a" * MAX_STRING_ID_BYTES}, "m").id == "a" * 1024
    assert sequence_flags({"sequence_id": "é" * 512}, "m").id == "é" * 512
    for too_long in ("a" * 1025, "é" * 513, "\ud800" * 342):  # a lone surrogate is 3 bytes
        with pytest.raises(InvalidInput, match="at most 1024 bytes") as caught:
            sequence_flags({"sequence_id": too_long}, "m")
        assert too_long[:16] not in str(caught.value)


@pytest.mark.parametrize(("datatype", "largest"), [
    ("INT32", 2**31 - 1), ("UINT32", 2**32 - 1), ("INT64", 2**63 - 1), ("UINT64", 2**64 - 1),
    ("INT16", 2**15 - 1)])
def test_an_integer_id_fits_the_corrid_datatype(datatype: str, largest: int) -> None:
    settings = SequenceBatchingConfig(controls=[SequenceControl(
        name="CORRID", kind="corrid", datatype=datatype)])
    check_corrid(settings, largest, "m")
    with pytest.raises(InvalidInput, match=f"ids 1 to {largest}"):
        check_corrid(settings, largest + 1, "m")


def test_a_float_or_string_corrid_takes_any_integer_id() -> None:
    for datatype in ("FP32", "BYTES"):
        settings = SequenceBatchingConfig(controls=[SequenceControl(
            name="CORRID", kind="corrid", datatype=datatype)])
        check_corrid(settings, 2**64 - 1, "m")
