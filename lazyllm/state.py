"""Per-generation caches of the LazyLLM engine: one KV store and one Aux Cache per layer.

For each decoder layer ``l`` the state holds

* ``C_l``: the set of original positions layer ``l`` has computed so far in this generation, with
  their keys/values in a :class:`LayerKV` (one *slot* per computed token, in the order computed);
  ``slot_of[l, pos]`` is the slot of ``pos`` or -1;
* the **Aux Cache** ``aux[l]``: the output hidden state of layer ``l`` for every token in
  ``C_l \\ C_{l+1}``, i.e. computed at layer ``l`` but not (yet) at ``l + 1``. A token chosen for
  layer ``l + 1`` in a later step resumes from there instead of running layers ``0..l`` again; once
  it is computed at ``l + 1`` its entry here is dropped.

Invariants: ``C_{l+1} ⊆ C_l``; a (position, layer) pair is computed at most once per generation
(tests check it on the trace ``LazyLLM.generate(..., trace=True)`` returns).

Bookkeeping that the hot path needs on the host (Aux Cache size, pairs computed) is kept as Python
counts from tensor shapes, so it never waits for the device.
"""

from __future__ import annotations

import torch


class LayerKV:
    """Keys/values one layer computed, one slot per token, with room for ``capacity`` tokens.

    Buffers are ``[1, KVH, capacity, D]``; they grow by doubling if a generation runs past capacity.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.length = 0
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None  # [capacity] original position of each slot

    def append(
        self, key: torch.Tensor, value: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``key``/``value`` ``[1, KVH, q, D]`` for ``positions`` ``[q]``; return all stored so far."""
        q = key.shape[2]
        if self.keys is None or self.values is None or self.positions is None:
            shape = (key.shape[0], key.shape[1], max(self.capacity, q), key.shape[3])
            self.keys = key.new_empty(shape)
            self.values = value.new_empty(shape)
            self.positions = torch.empty(shape[2], dtype=torch.long, device=key.device)
        elif self.length + q > self.keys.shape[2]:
            grow = max(self.keys.shape[2], q)
            self.keys = torch.cat(
                [self.keys, self.keys.new_empty(*self.keys.shape[:2], grow, self.keys.shape[3])], 2
            )
            self.values = torch.cat(
                [self.values, self.values.new_empty(*self.values.shape[:2], grow, self.values.shape[3])], 2
            )
            self.positions = torch.cat([self.positions, self.positions.new_empty(grow)])
        start, end = self.length, self.length + q
        self.keys[:, :, start:end] = key
        self.values[:, :, start:end] = value
        self.positions[start:end] = positions
        self.length = end
        if start == 0:  # nothing earlier: hand back the inputs themselves (contiguous, the prefill fast path)
            return key, value
        return self.keys[:, :, :end], self.values[:, :, :end]

    def slot_positions(self) -> torch.Tensor:
        """``[length]`` original position of each stored slot."""
        if self.positions is None:
            raise RuntimeError("LayerKV is empty")
        return self.positions[: self.length]


class GenerationState:
    """Everything the engine keeps between the steps of one generation (see the module docstring).

    Args:
        num_layers: decoder layers.
        capacity: positions to make room for (prompt + new tokens); grows if exceeded.
        store_kv: keep keys/values for later steps (False for a prefill-only call).
        keep_aux: park pruned tokens' outputs in the Aux Cache (only useful if later steps revive).
    """

    def __init__(
        self, num_layers: int, capacity: int, device: torch.device, *, store_kv: bool, keep_aux: bool
    ) -> None:
        self.num_layers = num_layers
        self.capacity = capacity
        self.device = device
        self.store_kv = store_kv
        self.keep_aux = store_kv and keep_aux
        self.kv = [LayerKV(capacity) for _ in range(num_layers)]
        self.slot_of = torch.full((num_layers, capacity), -1, dtype=torch.long, device=device)
        self.aux: list[torch.Tensor | None] = [None] * num_layers  # [capacity, hidden] per layer, lazily
        self.aux_has = torch.zeros(num_layers, capacity, dtype=torch.bool, device=device)
        self.aux_entries = 0
        self.aux_peak_entries = 0
        self.aux_peak_bytes = 0

    def ensure_capacity(self, n_positions: int) -> None:
        """Grow the per-position tables to hold ``n_positions`` positions."""
        if n_positions <= self.capacity:
            return
        extra = max(n_positions, 2 * self.capacity) - self.capacity

        def widen(t: torch.Tensor, fill: float | bool) -> torch.Tensor:
            return torch.cat([t, t.new_full((t.shape[0], extra), fill)], 1)

        self.slot_of = widen(self.slot_of, -1)
        self.aux_has = widen(self.aux_has, False)
        self.aux = [None if a is None else torch.cat([a, a.new_zeros(extra, a.shape[1])]) for a in self.aux]
        self.capacity += extra

    def record_computed(
        self, layer: int, positions: torch.Tensor, first_slot: int, newest: int | None = None
    ) -> None:
        """Layer ``layer`` just computed ``positions`` ``[q]`` into slots ``first_slot..first_slot+q-1``.

        ``newest``: the single position computed, when the caller knows it on the host (a decoding
        step's new token); written without a device index.
        """
        if newest is not None:
            self.slot_of[layer, newest] = first_slot
            return
        self.slot_of[layer, positions] = torch.arange(
            first_slot, first_slot + positions.shape[0], device=positions.device
        )

    def park(self, layer: int, positions: torch.Tensor, hidden: torch.Tensor) -> None:
        """Put the layer-``layer`` outputs ``hidden`` ``[m, hidden]`` of pruned ``positions`` in the Aux Cache."""
        aux = self.aux[layer]
        if aux is None:
            aux = self.aux[layer] = hidden.new_zeros(self.capacity, hidden.shape[-1])
        aux[positions] = hidden
        self.aux_has[layer, positions] = True
        self.aux_entries += positions.shape[0]  # pruned positions leave a layer once: never parked twice
        if self.aux_entries > self.aux_peak_entries:
            self.aux_peak_entries = self.aux_entries
            self.aux_peak_bytes = self.aux_entries * hidden.shape[-1] * hidden.element_size()

    def revive(self, layer: int, positions: torch.Tensor) -> torch.Tensor:
        """Take the layer-``layer`` outputs of ``positions`` ``[m]`` out of the Aux Cache: ``[m, hidden]``."""
        aux = self.aux[layer]
        if aux is None or not bool(self.aux_has[layer, positions].all()):
            raise RuntimeError(
                f"Aux Cache of layer {layer} lacks positions {positions.tolist()} (engine bug)"
            )
        self.aux_has[layer, positions] = False
        self.aux_entries -= positions.shape[0]
        return aux[positions]
