"""``cuda_copy.TimedCopies`` (CUDA only): the driver-API copies the fxcache upload queues with the
GIL held move the bytes they name, time every copy, and are the path ``add_fxcaches`` takes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fx_assets.core import cuda_copy
from fx_assets.core.device_store import DeviceStore
from fx_assets_tests.core.test_device_store import _quarter, _write_cache

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_timed_copies_move_the_named_bytes_and_time_each() -> None:
    src = torch.arange(3 << 20, dtype=torch.uint8).pin_memory()  # 3 MiB, a pattern
    dst = torch.zeros(4 << 20, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    assert cuda_copy.TimedCopies.available(stream.device.index)
    assert not cuda_copy.TimedCopies.available(
        stream.device.index + 1
    )  # another device's stream: torch's path
    tc = cuda_copy.TimedCopies(stream.cuda_stream)
    try:
        tc.copy(dst.data_ptr() + 1024, src.data_ptr(), 1 << 20)  # an offset into the destination
        tc.copy(dst.data_ptr() + (2 << 20), src.data_ptr() + (1 << 20), 2 << 20)
        stream.synchronize()
        busy, moved = tc.busy_seconds()
    finally:
        tc.close()
    assert moved == 3 << 20 and busy > 0
    out = dst.cpu()
    assert torch.equal(out[1024 : 1024 + (1 << 20)], src[: 1 << 20])
    assert torch.equal(out[2 << 20 :], src[1 << 20 :])
    assert not out[:1024].any() and not out[1024 + (1 << 20) : 2 << 20].any()


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_add_fxcaches_on_cuda_copies_through_the_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: str
) -> None:
    queued: list[int] = []
    real = cuda_copy.TimedCopies.copy
    monkeypatch.setattr(
        cuda_copy.TimedCopies, "copy", lambda self, d, s, n: (queued.append(n), real(self, d, s, n))[1]
    )
    ts, v = _quarter(3)
    path = _write_cache(tmp_path / "q.fxcache", ts, v, dtype)
    store = DeviceStore(device="cuda", staging_bytes=1 << 14, io_threads=4)
    store.add_fxcaches([("Q", path)])
    st = store.stats()
    assert len(queued) == st["chunks"] > 4 and sum(queued) == st["h2d_bytes"] and st["h2d_seconds"] > 0
    ref = DeviceStore(device="cpu", staging_bytes=1 << 14)
    ref.add_fxcaches([("Q", path)])
    got, want = store.concat_view(["Q"]), ref.concat_view(["Q"])
    np.testing.assert_array_equal(got.values.cpu().numpy(), want.values.numpy())
    np.testing.assert_array_equal(got.prices.cpu().numpy(), want.prices.numpy())
