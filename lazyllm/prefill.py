"""Pruned prefills ready for batched decoding: one prompt alone, or several as one padded batch.

:func:`prefill_row` is :meth:`LazyLLM.generate`'s prefill of one prompt, its stores kept.
:func:`prefill_rows` prefills several prompts of one engine. For a schedule whose decoding is
``frozen`` (:func:`decodes_frozen`) and whose scoring rule reads the last position alone (window
``w = 1``: LazyLLM's default rule, ``gemfilter``, any pooling, head reduction or ``stage`` averaging),
the prompts run **as one batch** through every layer:

* the rows' active tokens are packed left-padded into ``[B, L_l, hidden]`` (``L_l``: the most tokens
  any row keeps active at layer ``l``), each with its original positions (rotary embeddings and
  sliding windows by position), under a ``[B, 1, L_l, L_l]`` mask: a query sees the row's active keys
  at or before its position (and inside its window); a padding query sees only itself, so no row of
  the softmax is empty and padding stays finite (a real query gives it probability exactly 0);
* at a layer that scores, every row's newest token sits in the last slot, so one ``[B, H, L_l]``
  score of the last queries serves every row; each row then goes through its own selector and
  rounding rule on its own active count (rows of different lengths prune different numbers of
  tokens), exactly as the single-row pass does, and the survivors are packed again;
* each layer's post-rotary keys/values of each row are stored in the row's own
  :class:`~lazyllm.state.GenerationState`, so the result is the same :class:`RowPrefill` a lone
  prefill gives (teacher forcing and decoding continue from it unchanged).

The arithmetic is the lone prefill's on padded tensors: a batched matmul may sum in another order,
so scores and logits agree up to float rounding, and a token can change only where two scores tie
to rounding. A schedule that revives tokens while decoding (``dynamic``, ``budget:N``), a rule with a
query window ``w > 1``, or prompts of which only some carry a captured prefix, prefill one prompt
after the other (:func:`prefill_row`) with identical results. Batches are capped at
:data:`PREFILL_BATCH_TOKENS` padded tokens (shortest prompts together).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lazyllm.attention import CALL_KWARG, AttentionCall, lazyllm_layers
from lazyllm.engine import LazyLLM, PromptPrefix, select_survivors
from lazyllm.importance import MASKED_LOGIT
from lazyllm.schedule import num_pruned

PREFILL_BATCH_TOKENS = 8192
"""Most padded tokens (rows x longest prompt) in one batched prefill: its masks grow as ``B x L^2``,
and a long prompt's prefill keeps the device busy alone."""

KV = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""One layer's stored keys ``[1, KVH, m, D]``, values (the same) and slot positions ``[m]``."""


def decodes_frozen(engine: LazyLLM) -> bool:
    """Whether ``engine``'s decoding steps prune and revive nothing (what a batch needs)."""
    schedule = engine.schedule
    return not schedule.revival.revives or not any(schedule.percentiles)


def prefills_together(engine: LazyLLM) -> bool:
    """Whether :func:`prefill_rows` runs ``engine``'s prompts as one batch (see the module docstring)."""
    return decodes_frozen(engine) and engine.schedule.scoring.window == 1


@dataclass
class RowPrefill:
    """One prompt's pruned prefill, ready to decode in a batch.

    Attributes:
        gen: the engine's state of the generation (its stores; for teacher forcing after it).
        logits: ``[1, vocab]`` float32 next-token logits after the prompt.
        n: prompt tokens (the first generated token sits at position ``n``).
        cache: per layer, what the prefill stored there (:data:`KV`): ``C_l``'s keys, values, positions.
    """

    gen: Any
    logits: torch.Tensor
    n: int
    cache: list[KV]

    @property
    def per_layer(self) -> list[float]:
        """Share of the prompt each layer computed."""
        state = self.gen.state
        return list((state.slot_of[:, : self.n] >= 0).float().mean(dim=1).tolist())

    @property
    def computed(self) -> float:
        """Share of (prompt token, layer) pairs computed."""
        return float(self.gen.prompt_pairs / (self.n * len(self.cache)))


def _row(gen: Any, logits: torch.Tensor, n: int) -> RowPrefill:
    cache = []
    for kv in gen.state.kv:
        if kv.keys is None or kv.values is None:
            raise RuntimeError("a prefill left a layer's KV store empty (engine bug)")
        m = kv.length
        cache.append((kv.keys[:, :, :m], kv.values[:, :, :m], kv.slot_positions().clone()))
    return RowPrefill(gen=gen, logits=logits, n=n, cache=cache)


@torch.inference_mode()
def prefill_row(
    engine: LazyLLM, ids: torch.Tensor, *, prefix: PromptPrefix | None = None, room: int = 0
) -> RowPrefill:
    """The pruned prefill of ``ids`` ``[1, n]`` alone (exactly :meth:`LazyLLM.generate`'s), with room
    for ``room`` more tokens in its own stores (for teacher forcing or decoding from it)."""
    n = ids.shape[1]
    gen = engine.begin(ids, n + room, store_kv=True, trace=False)
    logits = engine.forward_pass(gen, ids, 0, prefix=prefix)
    return _row(gen, logits, n)


def prefill_rows(
    engine: LazyLLM,
    prompts: Sequence[torch.Tensor],
    *,
    prefixes: Sequence[PromptPrefix | None] | None = None,
    rooms: Sequence[int] | None = None,
    max_tokens: int = PREFILL_BATCH_TOKENS,
) -> list[RowPrefill]:
    """The pruned prefill of each prompt ``[1, n_b]`` (one engine), in order: as batches where the
    schedule allows (see the module docstring), else one after the other.

    The prompts are batched shortest first, a batch growing while ``B x L`` (rows times its longest
    prompt: the padded tokens) stays within ``max_tokens``; a longer prompt prefills alone.
    """
    given: list[PromptPrefix | None] = list(prefixes) if prefixes is not None else [None] * len(prompts)
    room = list(rooms) if rooms is not None else [0] * len(prompts)
    if len(given) != len(prompts) or len(room) != len(prompts):
        raise ValueError("give one prefix (or None) and one room per prompt")
    mixed = any(p is None for p in given) and any(p is not None for p in given)
    if len(prompts) == 1 or mixed or not prefills_together(engine):
        return [prefill_row(engine, ids, prefix=p, room=r) for ids, p, r in zip(prompts, given, room)]
    out: list[RowPrefill | None] = [None] * len(prompts)
    for group in _groups([ids.shape[1] for ids in prompts], max_tokens):
        if len(group) == 1:
            (i,) = group
            done = [prefill_row(engine, prompts[i], prefix=given[i], room=room[i])]
        else:
            pick = [prompts[i] for i in group], [given[i] for i in group], [room[i] for i in group]
            done = _Batch(engine, *pick).run()
        for i, row in zip(group, done):
            out[i] = row
    return [r for r in out if r is not None]


def _groups(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Indices of ``lengths`` in batches, shortest first, each with ``rows x longest <= max_tokens``
    (a prompt longer than ``max_tokens`` alone).

    >>> _groups([9, 31, 17, 24], 60)
    [[0, 2], [3], [1]]
    """
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if groups and (len(groups[-1]) + 1) * lengths[i] <= max_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


@dataclass
class _LastQueryScores(AttentionCall):
    """The attention call of a batched prefill layer: stores nothing itself (``keys`` keeps what the
    layer computed) and scores each row's keys by its last query (the rows' newest tokens)."""

    key_allowed: torch.Tensor | None = None  # [B, K] keys each row's last query may see
    keys: tuple[torch.Tensor, torch.Tensor] | None = None

    def score(self, query: torch.Tensor, key: torch.Tensor, scaling: float, softcap: float | None) -> None:
        """``scores`` ``[B, H, K]`` float32 from ``query`` ``[B, H, q, D]`` and ``key`` ``[B, KVH, K, D]``
        (:func:`~lazyllm.importance.window_scores` with ``w = 1``, row by row)."""
        batch, heads, _, dim = query.shape
        kv_heads = key.shape[1]
        q = query[:, :, -1, :].reshape(batch, kv_heads, heads // kv_heads, dim).float()  # [B, KVH, G, D]
        logits = torch.einsum("bkgd,bknd->bkgn", q, key.float()) * scaling  # [B, KVH, G, K]
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        allowed = None if self.key_allowed is None else self.key_allowed[:, None, None, :]
        if self.values == "softmax":
            if allowed is not None:
                logits = logits.masked_fill(~allowed, float("-inf"))
            scores = torch.softmax(logits, dim=-1)
        else:
            scores = logits if allowed is None else logits.masked_fill(~allowed, MASKED_LOGIT)
        self.scores = scores.reshape(batch, heads, -1)

    def keep(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys = (key, value)
        return key, value


class _Batch:
    """One batched pruned prefill: the rows' active sets, packed hidden states and per-row states."""

    def __init__(
        self,
        engine: LazyLLM,
        prompts: list[torch.Tensor],
        prefixes: list[PromptPrefix | None],
        rooms: list[int],
    ) -> None:
        self.engine = engine
        self.stack = engine.stack
        self.layers, self.inner = lazyllm_layers(engine.model, self.stack.layers)
        self.device = engine.device
        self.prompts = prompts
        self.prefixes = prefixes
        self.gens = [
            engine.begin(ids, ids.shape[1] + r, store_kv=True, trace=False) for ids, r in zip(prompts, rooms)
        ]
        self.active = [torch.arange(ids.shape[1], device=self.device) for ids in prompts]  # A_l per row
        self.hidden = torch.empty(0)
        self.pos = torch.empty(0)
        self.valid = torch.empty(0)
        self.mask = torch.empty(0)
        self.embeddings: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def _pack(self, rows: list[torch.Tensor]) -> None:
        """Pack the rows' hidden states ``[m_b, hidden]`` (positions ``self.active``) left-padded, with
        their positions, validity, mask and rotary embeddings."""
        width = max(r.shape[0] for r in rows)
        first = rows[0]
        self.hidden = first.new_zeros(len(rows), width, first.shape[-1])
        self.pos = torch.zeros(len(rows), width, dtype=torch.long, device=self.device)
        self.valid = torch.zeros(len(rows), width, dtype=torch.bool, device=self.device)
        for b, (h, a) in enumerate(zip(rows, self.active)):
            self.hidden[b, width - h.shape[0] :] = h
            self.pos[b, width - h.shape[0] :] = a
            self.valid[b, width - h.shape[0] :] = True
        self.embeddings = self.stack.position_embeddings(self.hidden, self.pos)
        self._masks: dict[int | None, torch.Tensor] = {}

    def _mask(self, window: int | None) -> torch.Tensor:
        """``[B, 1, L, L]`` additive mask for layers with this sliding ``window`` (None: full)."""
        if window not in self._masks:
            q, k = self.pos[:, :, None], self.pos[:, None, :]
            allowed = self.valid[:, None, :] & (k <= q)
            if window is not None:
                allowed &= (q - k) < window
            eye = torch.eye(self.pos.shape[1], dtype=torch.bool, device=self.device)[None]
            allowed |= eye & ~self.valid[:, :, None]  # a padding query sees itself alone
            mask = torch.zeros(allowed.shape, dtype=self.hidden.dtype, device=self.device)
            mask.masked_fill_(~allowed, torch.finfo(self.hidden.dtype).min)
            self._masks[window] = mask[:, None]
        return self._masks[window]

    def _resume(self) -> int:
        """Take the layers before the schedule first differs from the captured prefixes (if any)."""
        prefix = self.prefixes[0]
        if prefix is None:
            return 0
        first = self.engine.resume_depth(self.gens[0], prefix)
        for gen, p, active in zip(self.gens, self.prefixes, self.active):
            assert p is not None
            for index in range(first):
                gen.state.kv[index].append(p.keys[index], p.values[index], active)
                gen.state.record_computed(index, active, 0)
                gen.prompt_pairs += active.shape[0]
        return first

    @torch.inference_mode()
    def run(self) -> list[RowPrefill]:
        first = self._resume()
        if first:
            rows = [p.inputs[first][0] for p in self.prefixes if p is not None]
        else:
            rows = [self.stack.embed(ids)[0] for ids in self.prompts]
        self._pack(rows)
        percentiles = self.engine.schedule.percentiles
        last = len(self.layers) - 1
        for index in range(first, last + 1):
            counts = [a.shape[0] for a in self.active]
            prunes = [num_pruned(percentiles[index], m) for m in counts]
            observes = [gen.selector.observes(index) for gen in self.gens]
            call = self._attend(index, any(prunes) or any(observes))
            width = self.hidden.shape[1]
            for b, (gen, m) in enumerate(zip(self.gens, counts)):
                assert call.keys is not None
                key, value = call.keys
                gen.state.kv[index].append(
                    key[b : b + 1, :, width - m :], value[b : b + 1, :, width - m :], self.active[b]
                )
                gen.state.record_computed(index, self.active[b], 0)
                gen.prompt_pairs += m
            if index == last or percentiles[index] == 0:
                if any(observes):
                    self._scores(call, counts, observes, [0] * len(counts), index)
                continue
            survivors = self._scores(call, counts, observes, prunes, index)
            if any(prunes):
                rows = [
                    self.hidden[b, width - m + keep] for b, (m, keep) in enumerate(zip(counts, survivors))
                ]
                self.active = [a[keep] for a, keep in zip(self.active, survivors)]
                self._pack(rows)
        logits = self.stack.logits(self.hidden[:, -1:]).float()  # [B, vocab]: the last slot is each row's t
        return [
            _row(gen, logits[b : b + 1], ids.shape[1])
            for b, (gen, ids) in enumerate(zip(self.gens, self.prompts))
        ]

    def _attend(self, index: int, want_scores: bool) -> _LastQueryScores:
        """Run layer ``index`` on the packed batch; the call holds its keys/values (and scores)."""
        window = self.stack.windows[index]
        allowed = self.valid
        if window is not None:
            allowed = allowed & ((self.pos[:, -1:] - self.pos) < window)
        call = _LastQueryScores(
            inner=self.inner,
            want_scores=want_scores,
            values=self.engine.schedule.scoring.values,
            key_allowed=allowed,
        )
        call.store = call.keep
        self.hidden = self.layers[index](
            self.hidden,
            attention_mask=self._mask(window),
            position_ids=self.pos,
            position_embeddings=self.embeddings[self.stack.layer_types[index]],
            **{CALL_KWARG: call},
        )
        return call

    def _scores(
        self, call: _LastQueryScores, counts: list[int], observes: list[bool], prunes: list[int], index: int
    ) -> list[torch.Tensor]:
        """Per row: score its active tokens, let its selector observe them, and return the indices
        (into ``A_l``) of the survivors."""
        width = self.hidden.shape[1]
        scoring = self.engine.schedule.scoring
        survivors = []
        for b, (gen, m) in enumerate(zip(self.gens, counts)):
            keep_all = torch.arange(m, device=self.device)
            if not (prunes[b] or observes[b]):
                survivors.append(keep_all)
                continue
            if call.scores is None:
                raise RuntimeError(f"layer {index} did not call the attention interface; cannot score tokens")
            scores = scoring.token_scores(call.scores[b][:, width - m :])
            if observes[b]:
                gen.selector.observe(index, scores, self.active[b])
            if not prunes[b]:
                survivors.append(keep_all)
                continue
            ranks = gen.selector.rank(index, scores, self.active[b])
            survivors.append(select_survivors(ranks, prunes[b]))
        return survivors
