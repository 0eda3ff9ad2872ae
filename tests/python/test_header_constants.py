"""The Python constants and declarations must match include/peerkv.h."""

import re

from conftest import HEADER

import peerkv
from peerkv import _lib, errors, node


def _defines() -> dict[str, int]:
    text = HEADER.read_text()
    pattern = re.compile(r"^#define\s+(PEERKV_\w+)\s+\(?(-?\d+)\)?", re.MULTILINE)
    return {name: int(value) for name, value in pattern.findall(text)}


def _declared_functions() -> set[str]:
    text = re.sub(r"/\*.*?\*/", "", HEADER.read_text(), flags=re.DOTALL)
    return set(re.findall(r"\b(peerkv_\w+)\s*\(", text))


def test_status_codes_equal_header():
    defines = _defines()
    codes = {name: value for name, value in defines.items() if "_ERR_" in name or name == "PEERKV_OK"}
    assert len(codes) == 14
    for name, value in codes.items():
        python_name = name.removeprefix("PEERKV_")
        assert getattr(errors, python_name) == value, name


def test_every_error_code_has_its_own_exception_class():
    defines = _defines()
    for name, value in defines.items():
        if "_ERR_" not in name:
            continue
        exc = errors.error_for(value, "boom")
        assert type(exc) is not errors.PeerKVError, name
        assert exc.code == value
        assert exc.message == "boom"
        assert isinstance(exc, peerkv.PeerKVError)


def test_enum_constants_equal_header():
    defines = _defines()
    for name in (
        "LOOKUP_MISS",
        "LOOKUP_HIT",
        "LOOKUP_HIT_PENDING",
        "LOOKUP_RETRY",
        "POLICY_BLOCK_LEVEL",
        "POLICY_REQUEST_LEVEL",
        "INBOUND_EVALUATE",
        "INBOUND_FINISH",
    ):
        assert getattr(node, name) == defines["PEERKV_" + name], name
    assert _lib.ABI_MAJOR == defines["PEERKV_ABI_VERSION_MAJOR"]
    assert _lib.ABI_MINOR == defines["PEERKV_ABI_VERSION_MINOR"]


def test_lookup_values_equal_vllm_enum():
    from vllm.v1.kv_offload.base import LookupResult

    assert LookupResult.MISS.value == node.LOOKUP_MISS
    assert LookupResult.HIT.value == node.LOOKUP_HIT
    assert LookupResult.HIT_PENDING.value == node.LOOKUP_HIT_PENDING
    assert LookupResult.RETRY.value == node.LOOKUP_RETRY


def test_every_header_function_is_declared_for_ctypes():
    declared = _declared_functions()
    assert "peerkv_create" in declared and len(declared) >= 19
    assert declared == set(_lib.SIGNATURES)


def test_job_result_struct_layout():
    # int64, int32, int32, int64, double: 32 bytes, no padding surprises.
    assert _lib.JobResultStruct.seconds.offset == 24
    assert _lib.ctypes.sizeof(_lib.JobResultStruct) == 32
