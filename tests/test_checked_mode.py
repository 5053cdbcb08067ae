"""Checked mode (kernels/checked.py): block tables and lengths read on the host before a paged-decode launch, the bad
entry named. NumPy inputs are always checked; CuPy inputs in checked mode, which the tests run in (conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest

from minitransformer.core.errors import DeviceError, InputError
from minitransformer.kernels import attention, paged_decode
from minitransformer.kernels.checked import CHECKED_ENV, check_block_tables, checked_mode

BLOCK = 4


def paged_inputs(seq_lens, num_blocks=12, H=2, K=1, d=64, seed=0):
    """q (B, H, d), a pool (num_blocks, BLOCK, K, d) twice, shuffled tables (B, max_blocks) int32, lens (B,) int32."""
    rng = np.random.default_rng(seed)
    max_blocks = max(-(-n // BLOCK) for n in seq_lens)
    ids = rng.permutation(num_blocks)[:len(seq_lens) * max_blocks].reshape(len(seq_lens), max_blocks)
    k_cache, v_cache = rng.standard_normal((2, num_blocks, BLOCK, K, d)).astype(np.float32)
    q = rng.standard_normal((len(seq_lens), H, d)).astype(np.float32)
    return q, k_cache, v_cache, ids.astype(np.int32), np.array(seq_lens, dtype=np.int32)


class DeviceStandIn:
    """Holds an array the way a CuPy array does for the check: readable only through `.get()` (a host copy)."""

    def __init__(self, array):
        self._array, self.copies = array, 0

    def get(self):
        self.copies += 1
        return self._array.copy()


def test_the_tests_run_in_checked_mode_and_the_variable_reads_as_a_switch(monkeypatch):
    assert checked_mode()                                               # conftest.py
    for value, on in (("1", True), ("yes", True), ("0", False), ("off", False), ("", False), (" False ", False)):
        monkeypatch.setenv(CHECKED_ENV, value)
        assert checked_mode() is on, value
    monkeypatch.delenv(CHECKED_ENV)
    assert not checked_mode()


def test_a_bad_block_id_is_named_with_its_sequence_slot_and_the_pool_size():
    q, k_cache, v_cache, tables, lens = paged_inputs([5, 11, 3])        # sequence 1 reads slots 0, 1, 2
    tables[1, 2] = 12                                                   # one past the last block of 12
    with pytest.raises(InputError) as error:
        paged_decode(q, k_cache, v_cache, tables, lens)
    assert str(error.value) == ("block_tables[1, 2] = 12 is not a block of the pool: sequence 1 (length 11) reads "
                                "table slot 2, and the pool has 12 blocks (ids 0..11)")
    tables[0, 0], tables[2, 0] = -1, 40
    with pytest.raises(InputError, match=r"^block_tables\[0, 0\] = -1 .*; 2 more bad block ids$"):
        paged_decode(q, k_cache, v_cache, tables, lens)


def test_a_bad_length_is_named():
    q, k_cache, v_cache, tables, lens = paged_inputs([5, 11, 3])
    lens[2] = 13                                                        # 3 slots x 4 = 12 tokens at most
    with pytest.raises(InputError, match=r"^seq_lens\[2\] = 13 lies outside \[0, 12\] \(the table's 3 slots x "
                                         r"block_size 4\)$"):
        paged_decode(q, k_cache, v_cache, tables, lens)


def test_slots_past_a_length_may_hold_anything():
    """The kernel never reads them (test_kernels.py plants absurd ids there), so the check does not either."""
    _, _, _, tables, lens = paged_inputs([5, 11, 3])
    tables[0, 2], tables[2, 1:] = 2**30, -7                             # beyond lengths 5 and 3
    check_block_tables(tables, lens, BLOCK, 12)
    lens[0] = 9                                                         # now slot 2 of sequence 0 is read
    with pytest.raises(InputError, match=r"^block_tables\[0, 2\] = 1073741824 "):
        check_block_tables(tables, lens, BLOCK, 12)


def test_device_arrays_are_copied_to_the_host_and_checked():
    _, _, _, tables, lens = paged_inputs([5, 11, 3])
    tables[2, 0] = 99
    device_tables, device_lens = DeviceStandIn(tables), DeviceStandIn(lens)
    with pytest.raises(InputError, match=r"^block_tables\[2, 0\] = 99 .*sequence 2 \(length 3\)"):
        check_block_tables(device_tables, device_lens, BLOCK, 12)
    assert device_tables.copies == 1 and device_lens.copies == 1


def test_a_device_launch_is_checked_only_in_checked_mode(monkeypatch):
    """The call site in plan_paged_decode: NumPy arrays dressed as a device backend reach the check in checked mode
    and skip it otherwise (the kernel lookup, stubbed here, comes after the check)."""
    calls = []

    class KernelLookup(Exception):
        pass

    def no_kernel(*args, **kwargs):
        raise KernelLookup

    monkeypatch.setattr(attention, "backend_of", lambda array: "cupy")
    monkeypatch.setattr(attention, "device_sm_count", lambda backend: 132)   # no CuPy to ask for the SM count
    monkeypatch.setattr(attention, "check_block_tables", lambda *args: calls.append(args))
    monkeypatch.setattr(attention, "get_kernel", no_kernel)
    inputs = paged_inputs([5, 11, 3])
    with pytest.raises(KernelLookup):
        attention.plan_paged_decode(*inputs)
    assert len(calls) == 1 and calls[0][2:] == (BLOCK, 12)
    monkeypatch.setenv(CHECKED_ENV, "0")
    with pytest.raises(KernelLookup):
        attention.plan_paged_decode(*inputs)
    assert len(calls) == 1


def _cupy_or_none():
    try:
        import cupy
        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:  # ImportError or no CUDA driver
        return None


CUPY = _cupy_or_none()
gpu = pytest.mark.skipif(CUPY is None, reason="needs CuPy and an NVIDIA GPU (none on this machine)")


@gpu
def test_on_the_gpu_a_bad_block_id_is_named_before_the_launch():
    q, k_cache, v_cache, tables, lens = paged_inputs([5, 11, 3])
    expected = paged_decode(*(CUPY.asarray(a) for a in (q, k_cache, v_cache, tables, lens)))
    np.testing.assert_allclose(expected.get(), paged_decode(q, k_cache, v_cache, tables, lens), rtol=1e-5, atol=1e-5)
    tables[1, 2] = 1_000_000
    with pytest.raises(InputError, match=r"^block_tables\[1, 2\] = 1000000 .*the pool has 12 blocks"):
        paged_decode(*(CUPY.asarray(a) for a in (q, k_cache, v_cache, tables, lens)))
    CUPY.cuda.runtime.deviceSynchronize()                               # the context is still alive


@gpu
def test_on_the_gpu_checked_mode_refuses_a_graph_capture_with_its_reason():
    from minitransformer.serving.cuda_graph import GraphedStep
    q, k_cache, v_cache, tables, lens = (CUPY.asarray(a) for a in paged_inputs([5, 11, 3]))
    with pytest.raises(DeviceError, match="cannot record; unset MINITRANSFORMER_CHECKED"):
        GraphedStep(lambda t, n: paged_decode(q, k_cache, v_cache, t, n), tables, lens)
