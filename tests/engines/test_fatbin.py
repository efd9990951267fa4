"""The .nv_fatbin reader on synthetic fatbins built from the documented header layout."""

from __future__ import annotations

import struct

import pytest

from manager.engines import fatbin
from tests.helpers.fatbins import FakeEntry, buffer, container, cubin, elf, fatbin_elf, pad8, sass


def parse(data: bytes, names: bool = True) -> fatbin.Fatbin:
    return fatbin.read(buffer(data), len(data), "x.so", names)


def test_each_container_is_one_tu_with_its_sass_and_ptx_and_name():
    fb = parse(fatbin_elf([
        ("cache_kernels_cu", sass(70, 80) + [FakeEntry("ptx", 80, payload=b"//ptx")]),
        ("marlin_cu", sass(75, 80)),
    ]))
    assert [c.tu for c in fb.containers] == ["cache_kernels_cu", "marlin_cu"]
    assert fb.containers[0].sass() == (70, 80) and fb.containers[0].ptx() == (80,)
    assert fb.containers[1].sass() == (75, 80) and fb.containers[1].ptx() == ()
    assert [e.compression for e in fb.entries] == ["none"] * 5


def test_flags_give_compression_and_arch_specific_code():
    fb = parse(fatbin_elf([("a_cu", [FakeEntry("sass", 90, 0x100011), FakeEntry("ptx", 80, 0x2011, b"x", 1, 9),
                                     FakeEntry("sass", 100, 0x8011, b"y", 1, 9)])]))
    e = fb.entries
    assert (e[0].arch, e[0].arch_specific) == ("sm_90a", True)
    assert (e[1].kind, e[1].compression) == ("ptx", "lz4")
    assert e[2].compression == "zstd"


def test_tu_name_is_read_from_an_lz4_compressed_cubin():
    lz4_block = pytest.importorskip("lz4.block")
    raw = cubin("topk_cu")
    packed = lz4_block.compress(raw, store_size=False)
    fb = parse(fatbin_elf([(None, [FakeEntry("sass", 70, 0x2011, packed, len(packed), len(raw))])]))
    assert fb.containers[0].tu == "topk_cu"


def test_tu_name_is_read_from_a_zstd_compressed_cubin():
    zstandard = pytest.importorskip("zstandard")
    raw = cubin("sampler_cu")
    packed = zstandard.ZstdCompressor().compress(raw)
    fb = parse(fatbin_elf([(None, [FakeEntry("sass", 75, 0x8011, packed, len(packed), len(raw))])]))
    assert fb.containers[0].tu == "sampler_cu"


def test_tu_name_needs_the_length_prefix_to_match():
    bogus = b"\x7fELF" + b"\0" * 60 + b"_ZN55_INTERNAL_1a2b3c4d_99_short_cu_7672d19fE\0"
    fb = parse(fatbin_elf([(None, [FakeEntry("sass", 70, payload=bogus)])]))
    assert fb.containers[0].tu is None


def test_names_false_reads_no_payload():
    fb = parse(fatbin_elf([("layernorm_kernels_cu", sass(70))]), names=False)
    assert fb.containers[0].tu is None and fb.containers[0].sass() == (70,)


def test_an_elf_without_the_section_has_no_device_code():
    assert parse(elf(None)).containers == ()


@pytest.mark.parametrize("data, message", [
    (b"MZ\0\0" + b"\0" * 100, "not an ELF"),
    (b"\x7fELF", "not an ELF"),
    (elf(pad8(container(sass(70)))[:-8] + b"\0" * 8)[:80], "truncated or malformed ELF section table"),
    (elf(struct.pack("<IHHQ", 0xBA55ED50, 1, 16, 1 << 40)), "runs past its section"),
    (elf(struct.pack("<IHHQ", 0xDEADBEEF, 1, 16, 0)), "bad fatbin container magic"),
    (elf(container([FakeEntry("sass", 70, payload=b"x" * 8)])[:-4] + b"\0" * 4 + b"\0" * 0), None),
])
def test_hostile_or_truncated_files_give_one_fatbin_error(data, message):
    if message is None:  # a payload size past the container's end
        sec = bytearray(container([FakeEntry("sass", 70, payload=b"x" * 8)]))
        struct.pack_into("<Q", sec, 16 + 8, 1 << 32)
        data, message = elf(bytes(sec)), "runs past its container"
    with pytest.raises(fatbin.FatbinError, match=message):
        parse(data)


def test_unknown_entry_kind_is_refused():
    sec = bytearray(container(sass(70)))
    struct.pack_into("<H", sec, 16, 7)
    with pytest.raises(fatbin.FatbinError, match="unknown fatbin entry kind 7"):
        parse(elf(bytes(sec)))


@pytest.mark.parametrize("sass_sms, ptx_sms, sm, expected", [
    ((70,), (), 70, "sass"),
    ((70,), (), 72, "sass"),  # same major, lower minor: binary compatible
    ((72,), (), 70, None),  # higher minor does not run on a lower one
    ((75,), (), 70, None),
    ((70,), (), 80, None),  # another major never
    ((80,), (), 86, "sass"),
    ((86,), (), 80, None),
    ((), (52,), 70, "ptx"),  # PTX of a lower virtual architecture is JIT-compiled by the driver
    ((), (80,), 70, None),
    ((75,), (70,), 70, "ptx"),
])
def test_runs_on_follows_cudas_binary_compatibility(sass_sms, ptx_sms, sm, expected):
    assert fatbin.runs_on(sass_sms, ptx_sms, sm) == expected


def test_a_missing_file_is_one_error():
    with pytest.raises(fatbin.FatbinError, match="cannot read"):
        fatbin.read_path("/nonexistent/x.so")


def test_containers_in_a_large_data_section_are_found_and_coincidental_magics_skipped():
    fake = struct.pack("<IHHQ", 0xBA55ED50, 7, 16, 5) + b"\x01" * 11  # a magic number in data, not a container
    real = container([FakeEntry("sass", 70, payload=cubin("fft_kernels_cu")), FakeEntry("ptx", 50, payload=b"//")])
    fb = parse(elf(b"\x13" * 37 + fake + real + b"\x00" * 9, name=".ldata"))
    assert [(c.tu, c.sass(), c.ptx()) for c in fb.containers] == [("fft_kernels_cu", (70,), (50,))]
