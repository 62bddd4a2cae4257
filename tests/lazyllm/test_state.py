"""lazyllm.state: the per-layer KV store and the Aux Cache, on tensors small enough to check by hand."""

from __future__ import annotations

import pytest
import torch

from lazyllm.state import GenerationState, LayerKV


def test_layer_kv_appends_in_order_and_grows_past_capacity() -> None:
    kv = LayerKV(capacity=2)
    k1, v1 = torch.ones(1, 2, 2, 4), torch.full((1, 2, 2, 4), 2.0)
    keys, values = kv.append(k1, v1, torch.tensor([0, 3]))
    assert keys is k1 and values is v1  # the first append hands the inputs back (prefill fast path)
    keys, values = kv.append(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4), torch.tensor([5]))
    assert keys.shape == (1, 2, 3, 4) and kv.keys is not None and kv.keys.shape[2] >= 3  # doubled
    assert torch.equal(keys[:, :, :2], k1) and torch.equal(values[:, :, 2], torch.zeros(1, 2, 4))
    assert kv.slot_positions().tolist() == [0, 3, 5]
    with pytest.raises(RuntimeError, match="empty"):
        LayerKV(1).slot_positions()


def test_aux_cache_parks_revives_once_and_counts_peaks() -> None:
    state = GenerationState(3, 4, torch.device("cpu"), store_kv=True, keep_aux=True)
    hidden = torch.arange(6.0).reshape(2, 3)
    state.park(1, torch.tensor([0, 2]), hidden)
    assert state.aux_entries == 2 and state.aux_peak_bytes == 2 * 3 * 4
    assert torch.equal(state.revive(1, torch.tensor([2])), hidden[1:])
    assert state.aux_entries == 1 and state.aux_peak_entries == 2
    with pytest.raises(RuntimeError, match="lacks positions \\[2\\]"):
        state.revive(1, torch.tensor([2]))  # revived already: a second revival is an engine bug
    state.ensure_capacity(9)  # tables grow, parked entries stay
    assert state.capacity >= 9 and torch.equal(state.revive(1, torch.tensor([0])), hidden[:1])


def test_record_computed_maps_positions_to_slots() -> None:
    state = GenerationState(2, 8, torch.device("cpu"), store_kv=True, keep_aux=False)
    state.record_computed(0, torch.tensor([1, 4, 6]), first_slot=0)
    state.record_computed(0, torch.tensor([7]), first_slot=3, newest=7)
    assert state.slot_of[0].tolist() == [-1, 0, -1, -1, 1, -1, 2, 3]
    assert state.slot_of[1].tolist() == [-1] * 8 and not state.keep_aux
