"""bench.growth's figures that are not timings: the bytes a window wrote."""

import os

from bench.growth import written_bytes


def test_bytes_written_are_those_handed_to_write_calls_not_the_page_cache_folios_dirtied(tmp_path):
    """The window's bytes written count what the process hands to write calls (``wchar``): a 4 KiB page written
    into a file region cached as one large folio counts 4 KiB there, where ``write_bytes`` counts the whole folio
    on kernels with large folios (2 MiB here: 512 times the page)."""
    path = tmp_path / "pages.bin"
    handle = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        os.pwrite(handle, b"x" * (2 << 20), 0)  # one large write: cached in large folios where the kernel can
        os.fsync(handle)
        before, dirtied = written_bytes(), written_bytes("write_bytes")
        for page in range(16):
            os.pwrite(handle, b"y" * 4096, page * (128 << 10))
        os.fsync(handle)
        handed = written_bytes() - before
        assert 16 * 4096 <= handed < 16 * 4096 + (64 << 10), handed
        assert written_bytes("write_bytes") - dirtied >= 0  # the folios' bytes: 16 x 4 KiB up to 2 MiB
    finally:
        os.close(handle)
