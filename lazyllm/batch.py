"""Decoding of many ``frozen`` generations as one batch: for scoring many of them cheaply, and for serving.

:meth:`LazyLLM.generate` decodes one sequence at a time, because a schedule that revives tokens
gives every sequence its own active set at every step. A schedule whose decoding steps prune and
revive nothing (``frozen`` revival, or a schedule that prunes nothing: the unpruned model) is
different: after its prefill, layer ``l`` of a decoding step attends exactly ``C_l`` (the tokens its
prefill computed there) plus the generated tokens, an ordinary KV-cached decode over per-layer caches
of different lengths. Such generations can share their decoding steps, whatever their prompts and
schedules, as long as they run on one model:

1. the prefills of the requests of one engine run as one padded batch, each row pruned by its own
   scores (:func:`lazyllm.prefill.prefill_rows`; one after the other where the schedule does not
   allow it), resuming from captured unpruned prefixes when given, and each picks its first token.
   A request may also ask for teacher-forced logits along a given answer (``forced``) or along its
   own answer once it is decoded (``force_own``), run from that same prefill (the fidelity's KL and
   reference); such a request's prefill runs alone, so that its scores are bit for bit the lone
   passes' whatever else is in the batch;
2. per layer, the requests' stored keys/values are stacked into one ``[B, KVH, L_l + T, D]`` cache,
   padded to the longest (``L_l``: the most tokens any request computed at layer ``l``), with a
   mask that blocks the padding and, on sliding-window layers, keys outside the window;
3. every step feeds each unfinished request's newest token at its own next position and writes
   its keys/values into the next free slot of the cache; a request leaves the batch when it stops
   (EOS, a stop string, or its ``max_new_tokens``).

A request whose schedule revives tokens while decoding (``dynamic``, ``budget:N``) cannot share
steps: it runs alone, exactly as :meth:`LazyLLM.generate`, after the batched ones (with one warning
per call), with the same callbacks, cancelling and timing.

Each request then has the tokens :meth:`LazyLLM.generate` would give it alone: the same keys are
attended with the same weights (keys are stored after their rotary embedding, so a slot's place in
the cache does not matter), and the logits agree up to float rounding (a batched matmul may sum in
another order), so an argmax can flip only where two logits tie to rounding.

**Sampling.** A request's ``sampling`` (None: greedy) chooses its tokens as ``generate`` does, with
its own :class:`~lazyllm.sampling.TokenPicker`: a private ``torch.Generator`` seeded with the
request's ``seed``, drawing once per token of that request only. So a sampled request draws the same
random numbers as ``LazyLLM.generate(..., seed=seed)`` alone, whatever else is in the batch; its
tokens are the same wherever the batched logits round like the lone ones (always at batch size 1).

**Callbacks and cancelling.** ``on_token(i, token_id)`` is called for each new token of request ``i``
(its index in ``requests``), in order, as soon as it is chosen: the first right after the request's
prefill, later ones after each batched step. It sees exactly the result's ``token_ids``. Returning
``False`` (``None`` counts as going on) cancels request ``i``: it leaves the batch before the next
step (no more compute for it), and its result has ``finish_reason == "cancelled"``, its tokens
those chosen so far (the refused one included).

**Timing.** Every time is measured from the start of the ``generate_batch`` call (``t0``), for
every request, whichever chunk of ``batch_size`` it runs in: ``ttft_s`` is ``t0`` to the request's
first token (so it includes the earlier chunks and the prefills run before its own), ``total_s``
``t0`` to its last token (or to its cancellation). These are what a caller who submitted all the
requests at ``t0`` waits; a request's own compute is not separable from its neighbours'.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lazyllm.attention import CALL_KWARG, AttentionCall, lazyllm_layers
from lazyllm.engine import GenerationResult, LazyLLM, PromptPrefix
from lazyllm.prefill import KV, RowPrefill, decodes_frozen, prefill_row, prefill_rows
from lazyllm.sampling import Sampling, TokenPicker
from lazyllm.text import StopCriteria, caller_stacklevel
from lazyllm.timing import synchronize

DEFAULT_BATCH_SIZE = 8

CANCELLED = "cancelled"
"""The ``finish_reason`` of a request whose ``on_token`` callback returned False."""

NOT_FINITE = "the model's next-token logits for this request are not finite (inf or NaN)"
"""The error of a row whose logits overflowed: it fails alone, its neighbours go on."""

OnToken = Callable[[int, int], bool | None]
"""``on_token(i, token_id)``: a new token of request ``i``; return False to cancel that request."""


@dataclass(frozen=True)
class BatchRequest:
    """One generation to decode together with others.

    Attributes:
        engine: the engine whose schedule prunes the prompt; every request of a batch must share
            its model. One whose decoding revives tokens (not :func:`decodes_frozen`) runs alone.
        input_ids: the prompt's token ids (already encoded; no chat template is applied).
        max_new_tokens: at most this many new tokens.
        stop_strings: stop once the decoded text contains one of these (the text is cut before it).
        prefix: the prompt's unpruned prefill (:meth:`LazyLLM.capture_prefix`), as for ``generate``.
        eos_token_id: stop at these ids (default, as for ``generate``: the model's generation
            config's EOS, else the tokenizer's; ``()`` never stops on a token).
        forced: an answer to teacher-force as well: the result's ``forced_logits`` are then
            :meth:`LazyLLM.forced_logits` of ``forced`` (the same passes, the same numbers), from the
            generation's own prefill, which so runs once for both.
        force_own: teacher-force the request's own answer once it is decoded (``forced_logits``
            along ``token_ids``, from the same prefill): the unpruned model's reference in one prefill.
        sampling: how tokens are chosen (:class:`~lazyllm.sampling.Sampling`; None: greedy).
        seed: seeds the request's own random generator, overriding ``sampling.seed`` (None: keep
            it); the same seed gives the draws of ``LazyLLM.generate(..., seed=seed)`` alone.
    """

    engine: LazyLLM
    input_ids: Sequence[int] | torch.Tensor
    max_new_tokens: int = 64
    stop_strings: tuple[str, ...] = ()
    prefix: PromptPrefix | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    forced: tuple[int, ...] | None = None
    force_own: bool = False
    sampling: Sampling | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens = {self.max_new_tokens}: must be >= 1")
        if self.forced is not None and not self.forced:
            raise ValueError("forced answer is empty: need at least one token (or None)")
        if self.forced is not None and self.force_own:
            raise ValueError("give forced or force_own, not both")
        if self.seed is not None:
            Sampling(seed=self.seed)  # validates it

    @property
    def decoding(self) -> Sampling:
        """The request's decoding strategy, its ``seed`` applied."""
        return Sampling.resolve(self.sampling, seed=self.seed)


@dataclass
class _Row:
    """One request while it decodes: its stopping rule, tokens so far and prefill facts."""

    index: int
    n: int  # prompt tokens: the first generated token sits at position n
    limit: int
    stop: StopCriteria
    t0: float
    ttft: float
    per_layer: list[float]
    computed: float
    revival: str
    scoring: str
    tokens: list[int]
    sampling: Sampling
    picker: TokenPicker | None  # None: greedy
    forced_logits: torch.Tensor | None = None
    own: tuple[LazyLLM, Any, torch.Tensor] | None = None  # engine, prefill state, logits: to force
    finish: str | None = None
    end: float | None = None  # when it stopped (perf_counter)


def generate_batch(
    requests: Sequence[BatchRequest],
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    on_token: OnToken | None = None,
) -> list[GenerationResult]:
    """The generation of every request, in order, decoded ``batch_size`` at a time (see the module
    docstring for sampling, ``on_token`` and timing). All requests must run on one model."""
    if batch_size < 1:
        raise ValueError(f"batch_size = {batch_size}: must be >= 1")
    if not requests:
        return []
    model = requests[0].engine.model
    if any(r.engine.model is not model for r in requests):
        raise ValueError("the requests of one batch must share one model; batch each model's apart")
    t0 = time.perf_counter()
    results: list[GenerationResult | None] = [None] * len(requests)
    together = [(i, r) for i, r in enumerate(requests) if decodes_frozen(r.engine)]
    for start in range(0, len(together), batch_size):
        for i, result in _decode_chunk(together[start : start + batch_size], t0, on_token):
            results[i] = result
    alone = [(i, r) for i, r in enumerate(requests) if not decodes_frozen(r.engine)]
    if alone:
        warnings.warn(
            f"{len(alone)} of {len(requests)} requests have schedules that revive tokens while decoding "
            "(dynamic or budget revival): they run one at a time, after the batched ones",
            stacklevel=caller_stacklevel(),
        )
    for i, request in alone:
        results[i] = _generate_alone(i, request, t0, on_token)
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


@dataclass(frozen=True)
class _Offering(StopCriteria):
    """A request's stopping rule that first hands each new token to ``on_token`` (False: cancelled)."""

    index: int = 0
    on_token: OnToken | None = None

    def check(self, generated: list[int]) -> str | None:
        if self.on_token is not None and self.on_token(self.index, generated[-1]) is False:
            return CANCELLED
        return super().check(generated)


def _generate_alone(
    index: int, request: BatchRequest, t0: float, on_token: OnToken | None
) -> GenerationResult:
    """A request whose decoding revives tokens: exactly :meth:`LazyLLM.generate`, timed from ``t0``."""
    engine, prep = request.engine, _Prepared.of(request)
    stop = _Offering(prep.stop.eos_ids, prep.stop.stop_strings, prep.stop.tokenizer, index, on_token)
    steps = engine.decode_steps(
        prep.ids, stop, t0, request.max_new_tokens, prep.sampling, False, False, prep.prefix
    )
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: GenerationResult = done.value
            break
    answer = (
        request.forced
        if request.forced is not None
        else tuple(result.token_ids)
        if request.force_own
        else None
    )
    if answer is None:
        return result
    return dataclasses.replace(
        result, forced_logits=engine.forced_logits(prep.ids, answer, prefix=prep.prefix)
    )


@torch.inference_mode()
def _decode_chunk(
    chunk: list[tuple[int, BatchRequest]], t0: float, on_token: OnToken | None
) -> list[tuple[int, GenerationResult]]:
    """Prefill the chunk's requests (those of one engine together, :func:`~lazyllm.prefill.prefill_rows`),
    hand out their first tokens, then decode the unfinished ones as one batch."""
    # (engine, alone) -> positions in the chunk, in order of first appearance
    groups: dict[tuple[int, bool], list[int]] = {}
    for k, (_, request) in enumerate(chunk):
        alone = request.forced is not None or request.force_own
        groups.setdefault((id(request.engine), alone), []).append(k)
    rows: list[_Row] = []
    prefills: list[RowPrefill] = []
    for (_, alone), positions in groups.items():
        members = [chunk[k] for k in positions]
        prepared = [_Prepared.of(request) for _, request in members]
        engine = members[0][1].engine
        if alone:  # teacher-forced logits are scores: bit for bit the lone passes, whatever the batch
            done = [prefill_row(engine, p.ids, prefix=p.prefix, room=p.room) for p in prepared]
        else:
            ids, given, rooms = (
                [p.ids for p in prepared],
                [p.prefix for p in prepared],
                [p.room for p in prepared],
            )
            done = prefill_rows(engine, ids, prefixes=given, rooms=rooms)
        synchronize(engine.device)
        for (index, request), prep, prefill in zip(members, prepared, done):
            row = _first_token(index, request, prep, prefill, t0)
            _offer(row, on_token)
            rows.append(row)
            if row.finish is None:
                prefills.append(prefill)
    live = [r for r in rows if r.finish is None]
    if live:
        decoder = FrozenDecoder(chunk[0][1].engine, prefills, room=max(r.limit for r in live) - 1)
        prefills.clear()  # the rows' own stores are no longer needed
        _decode_together(decoder, live, on_token)
    for row in rows:
        _force_own(row)
    return [(r.index, _result(r)) for r in rows]


def _offer(row: _Row, on_token: OnToken | None) -> None:
    """Hand the row's newest token to ``on_token`` and set ``row.finish`` if the row ends with it."""
    if on_token is not None and on_token(row.index, row.tokens[-1]) is False:
        row.finish = CANCELLED
    elif row.finish is None:
        row.finish = row.stop.check(row.tokens) or ("length" if len(row.tokens) >= row.limit else None)
    if row.finish is not None:
        row.end = time.perf_counter()


@dataclass(frozen=True)
class _Prepared:
    """A request's checked prompt ``[1, n]``, stopping rule, strategy and prefill room."""

    ids: torch.Tensor
    stop: StopCriteria
    sampling: Sampling
    prefix: PromptPrefix | None
    room: int  # slots after the prompt in the row's own stores (teacher forcing)

    @classmethod
    def of(cls, request: BatchRequest) -> _Prepared:
        engine = request.engine
        eos = request.eos_token_id
        ids, stop = engine.prepare(
            torch.as_tensor(request.input_ids),
            request.max_new_tokens,
            False,
            eos if eos is None or isinstance(eos, int) else list(eos),
            request.stop_strings,
        )
        prefix = request.prefix
        if prefix is not None and (prefix.ids.shape != ids.shape or not torch.equal(prefix.ids, ids)):
            raise ValueError("prefix was captured from another prompt; capture it from this one")
        room = request.max_new_tokens if request.force_own else len(request.forced or ())
        return cls(ids, stop, request.decoding, prefix, room)


def _first_token(index: int, request: BatchRequest, prep: _Prepared, prefill: RowPrefill, t0: float) -> _Row:
    """The request's row after its prefill: its first token chosen (and forced logits, if asked)."""
    sampling = prep.sampling
    picker = None if sampling.greedy else sampling.picker(prep.ids, request.max_new_tokens)
    logits = prefill.logits
    if not bool(torch.isfinite(logits).all()):
        raise FloatingPointError(NOT_FINITE)
    token = int(logits[0].argmax()) if picker is None else int(picker.pick(logits))
    row = _Row(
        index=index,
        n=prefill.n,
        limit=request.max_new_tokens,
        stop=prep.stop,
        t0=t0,
        ttft=time.perf_counter() - t0,
        per_layer=prefill.per_layer,
        computed=prefill.computed,
        revival=str(prefill.gen.revival),
        scoring=str(prefill.gen.scoring),
        tokens=[token],
        sampling=sampling,
        picker=picker,
    )
    engine = request.engine
    if request.forced:  # appends after the prefill's slots (room was made for it): its cache views stay
        row.forced_logits = engine.forced_rest(prefill.gen, logits, prefill.n, request.forced)
    elif request.force_own:  # once its answer is known (_force_own)
        row.own = (engine, prefill.gen, logits)
    return row


def _force_own(row: _Row) -> None:
    """Teacher-force the row's decoded answer from its kept prefill (which the batch copied)."""
    if row.own is not None:
        engine, gen, logits = row.own
        row.forced_logits = engine.forced_rest(gen, logits, row.n, row.tokens)
        row.own = None


def _pick(rows: list[_Row], logits: torch.Tensor) -> list[int]:
    """Each row's next token from the step's ``[B, vocab]`` float32 logits: the argmax for greedy
    rows, the row's own picker (its processors and random stream) for the others."""
    chosen: list[int] = logits.argmax(dim=-1).tolist()
    for b, row in enumerate(rows):
        if row.picker is not None:
            chosen[b] = int(row.picker.pick(logits[b : b + 1]))
    return chosen


def _decode_together(decoder: FrozenDecoder, rows: list[_Row], on_token: OnToken | None) -> None:
    """Decode ``rows`` (each with its first token) together until every one has stopped."""
    live = list(rows)
    while live:
        device = decoder.device
        logits = decoder.step(torch.tensor([r.tokens[-1] for r in live], device=device))
        keep = []
        for b, (row, token) in enumerate(zip(live, _pick(live, logits))):
            row.tokens.append(token)
            _offer(row, on_token)
            if row.finish is None:
                keep.append(b)
        if len(keep) < len(live):
            decoder.keep(keep)
            live = [live[b] for b in keep]


class FrozenDecoder:
    """Decoding steps of ``frozen`` prefills as one batch (the module docstring's steps 2 and 3), with
    TGI's two verbs on a running batch: :meth:`keep` (rows leave) and :meth:`extend` (rows join).

    Per layer ``l`` the rows' stores are stacked into one ``[B, KVH, S_l, D]`` cache: each row's
    prefill in slots ``0..m_b-1`` (``m_b``: what it computed at ``l``), then one slot per decoding
    step, written by every row at the layer's shared next slot; a validity mask ``[B, S_l]`` blocks
    the slots a row never wrote, and slot positions ``[B, S_l]`` carry each key's original position
    (keys are stored after their rotary embedding, so a slot's place does not matter). Each row has
    its own next position (its prompt length plus its tokens fed so far), so rows that joined at
    different steps decode side by side. The buffers double when full. The rows may come from
    engines with different schedules, on one model.

    Args:
        engine: any engine on the rows' model (its stack and attention kernel are used).
        prefills: the rows' prefills, in batch order (at least one).
        room: decoding steps to make room for up front.
    """

    def __init__(self, engine: LazyLLM, prefills: Sequence[RowPrefill], room: int = 0) -> None:
        self.stack = engine.stack
        self.layers, self.inner = lazyllm_layers(engine.model, self.stack.layers)
        self.device = engine.device
        self.room = max(room, 1)
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.positions: list[torch.Tensor] = []
        self.valid: list[torch.Tensor] = []
        self.slot: list[int] = []  # per layer: the slot the next step writes
        for li in range(len(self.layers)):
            parts = [p.cache[li] for p in prefills]
            longest = max(k.shape[2] for k, _, _ in parts)
            k_all, v_all, p_all, ok = self._stacked(parts, longest + self.room)
            self.keys.append(k_all)
            self.values.append(v_all)
            self.positions.append(p_all)
            self.valid.append(ok)
            self.slot.append(longest)
        self.next_pos = torch.tensor([p.n for p in prefills], device=self.device)  # [B]
        self.steps = 0

    def _stacked(
        self, parts: Sequence[KV], width: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rows' stores of one layer in slots ``0..m_b-1`` of ``width`` slots: keys, values
        ``[B, KVH, width, D]``, positions ``[B, width]`` and validity ``[B, width]``."""
        first = parts[0][0]
        shape = (len(parts), first.shape[1], width, first.shape[3])
        k_all, v_all = first.new_zeros(shape), first.new_zeros(shape)
        p_all = torch.zeros(shape[0], width, dtype=torch.long, device=self.device)
        ok = torch.zeros(shape[0], width, dtype=torch.bool, device=self.device)
        for b, (k, v, pos) in enumerate(parts):
            m = k.shape[2]
            k_all[b, :, :m], v_all[b, :, :m], p_all[b, :m], ok[b, :m] = k[0], v[0], pos, True
        return k_all, v_all, p_all, ok

    @property
    def batch_size(self) -> int:
        return int(self.next_pos.shape[0])

    def _grow(self, li: int, width: int) -> None:
        """Give layer ``li``'s buffers at least ``width`` slots (doubling)."""
        have = self.keys[li].shape[2]
        if width <= have:
            return
        extra = max(width, 2 * have) - have
        k, v, p, ok = self.keys[li], self.values[li], self.positions[li], self.valid[li]
        self.keys[li] = torch.cat([k, k.new_zeros(*k.shape[:2], extra, k.shape[3])], 2)
        self.values[li] = torch.cat([v, v.new_zeros(*v.shape[:2], extra, v.shape[3])], 2)
        self.positions[li] = torch.cat([p, p.new_zeros(p.shape[0], extra)], 1)
        self.valid[li] = torch.cat([ok, ok.new_zeros(ok.shape[0], extra)], 1)

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed each row's newest token ``tokens`` ``[B]`` at its next position; return ``[B, vocab]``
        float32 next-token logits."""
        stack, device = self.stack, self.device
        for li in range(len(self.layers)):
            self._grow(li, self.slot[li] + 1)
        pos = self.next_pos  # [B] where each row's newest token sits
        hidden = stack.embed(tokens[:, None])
        embeddings = stack.position_embeddings(hidden, pos[:, None])
        for index, layer in enumerate(self.layers):
            slot = self.slot[index]
            keys_l, values_l, pos_l, ok_l = (
                self.keys[index], self.values[index], self.positions[index], self.valid[index]
            )  # fmt: skip
            pos_l[:, slot] = pos
            ok_l[:, slot] = True
            allowed = ok_l[:, : slot + 1]
            window = stack.windows[index]
            if window is not None:
                allowed = allowed & ((pos[:, None] - pos_l[:, : slot + 1]) < window)
            mask = torch.zeros(allowed.shape, dtype=hidden.dtype, device=device)
            mask.masked_fill_(~allowed, torch.finfo(hidden.dtype).min)

            def store(
                key: torch.Tensor,
                value: torch.Tensor,
                k_l: torch.Tensor = keys_l,
                v_l: torch.Tensor = values_l,
                end: int = slot + 1,
            ) -> tuple[torch.Tensor, torch.Tensor]:
                k_l[:, :, end - 1] = key[:, :, 0]
                v_l[:, :, end - 1] = value[:, :, 0]
                return k_l[:, :, :end], v_l[:, :, :end]

            hidden = layer(
                hidden,
                attention_mask=mask[:, None, None],
                position_ids=pos[:, None],
                position_embeddings=embeddings[stack.layer_types[index]],
                **{CALL_KWARG: AttentionCall(inner=self.inner, store=store)},
            )
            self.slot[index] = slot + 1
        self.next_pos = self.next_pos + 1
        self.steps += 1
        return stack.logits(hidden).float()

    def keep(self, rows: Sequence[int]) -> None:
        """Keep only ``rows`` (indices into the current batch, in order); the others leave it."""
        at = torch.tensor(list(rows), dtype=torch.long, device=self.device)
        self.keys = [k.index_select(0, at) for k in self.keys]
        self.values = [v.index_select(0, at) for v in self.values]
        self.positions = [p.index_select(0, at) for p in self.positions]
        self.valid = [v.index_select(0, at) for v in self.valid]
        self.next_pos = self.next_pos.index_select(0, at)

    def compact(self) -> None:
        """Move every row's valid slots to the front of each layer's buffers, in their order, and drop
        the rest (slots of rows that left, and the steps before a row joined, which it never wrote):
        in a batch that rows keep joining, the shared next slot otherwise grows with every step since
        the batch formed, and so would the attention's width. Slot order does not matter (positions
        travel with the keys); each row keeps exactly its keys."""
        for li in range(len(self.layers)):
            used = self.slot[li]
            ok = self.valid[li][:, :used]  # [B, used]
            longest = int(ok.sum(dim=1).max())
            if longest == used:
                continue
            order = torch.sort((~ok).to(torch.int8), dim=1, stable=True).indices[:, :longest]  # valid first
            k, v = self.keys[li], self.values[li]
            take = order[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])
            width = longest + self.room
            keys, values = (
                k.new_zeros(*k.shape[:2], width, k.shape[3]),
                v.new_zeros(*v.shape[:2], width, v.shape[3]),
            )
            keys[:, :, :longest], values[:, :, :longest] = k.gather(2, take), v.gather(2, take)
            positions = self.positions[li].new_zeros(k.shape[0], width)
            valid = ok.new_zeros(k.shape[0], width)
            positions[:, :longest] = self.positions[li].gather(1, order)
            valid[:, :longest] = ok.gather(1, order)
            self.keys[li], self.values[li], self.positions[li], self.valid[li] = (
                keys,
                values,
                positions,
                valid,
            )
            self.slot[li] = longest

    def extend(self, prefills: Sequence[RowPrefill]) -> None:
        """Rows join the batch after the current ones (continuous batching): each row's prefill is
        stacked in slots ``0..m_b-1`` and its first decoding step writes the layer's shared next slot,
        which moves past the longest joining prefill where that one is longer (the slots between stay
        invalid for the rows already here). Each row then decodes exactly as in a batch of its own."""
        if not prefills:
            return
        for li in range(len(self.layers)):
            parts = [p.cache[li] for p in prefills]
            longest = max(k.shape[2] for k, _, _ in parts)
            slot = max(self.slot[li], longest)
            self._grow(li, slot + self.room)
            width = self.keys[li].shape[2]
            k_new, v_new, p_new, ok_new = self._stacked(parts, width)
            self.keys[li] = torch.cat([self.keys[li], k_new])
            self.values[li] = torch.cat([self.values[li], v_new])
            self.positions[li] = torch.cat([self.positions[li], p_new])
            self.valid[li] = torch.cat([self.valid[li], ok_new])
            self.slot[li] = slot
        joining = torch.tensor([p.n for p in prefills], device=self.device)
        self.next_pos = torch.cat([self.next_pos, joining])


@dataclass(frozen=True)
class Finished:
    """A request of a :class:`RunningBatch` that left it: its result, or why it failed (its own error).

    Attributes:
        key: the request's key, as given to :meth:`RunningBatch.add`.
        result: the generation (``finish_reason`` ``"cancelled"`` if ``on_token`` refused a token);
            None when it failed.
        error: one line saying why it failed (None when it did not).
    """

    key: int
    result: GenerationResult | None
    error: str | None = None


def _failure(key: int, exc: BaseException) -> Finished:
    message = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return Finished(key, None, f"{type(exc).__name__}: {message}")


class RunningBatch:
    """Frozen generations decoded as one batch that requests join and leave between steps: continuous
    batching, as TGI's router and vLLM's engine loop do it.

    :meth:`add` prefills new requests (those of one engine as one padded batch,
    :func:`~lazyllm.prefill.prefill_rows`), chooses their first tokens and joins the unfinished ones to
    the running :class:`FrozenDecoder` (``extend``); :meth:`step` feeds every row its newest token,
    chooses each row's next one (its own picker), and drops the rows that stopped (``keep``). Each
    request gets the tokens it gets alone (:meth:`LazyLLM.generate`, greedy or with its own seed),
    whenever it joined and whoever its neighbours are: the same keys with the same weights.

    **A request's failure is its own.** Its prompt, its sampling (a draw from inf/NaN probabilities),
    non-finite logits in its row, or an exception from ``on_token`` for it end that request alone, as a
    :class:`Finished` with ``error``; a batched prefill that raises is retried row by row so that only
    the failing prompt fails. Only an error of the shared decoding step itself (the device) escapes
    :meth:`step`: no row can be told apart from another there.

    Args:
        on_token: ``on_token(key, token_id)`` for each new token; False cancels that request.
    """

    COMPACT_EVERY = 64
    """Decoding steps between two :meth:`FrozenDecoder.compact` calls (each costs one host read per layer)."""

    def __init__(self, on_token: OnToken | None = None) -> None:
        self.on_token = on_token
        self.rows: list[_Row] = []
        self.decoder: FrozenDecoder | None = None

    @property
    def size(self) -> int:
        """Requests decoding now."""
        return len(self.rows)

    @torch.inference_mode()
    def add(self, requests: Sequence[tuple[int, BatchRequest]]) -> list[Finished]:
        """Prefill ``(key, request)`` pairs (every request's schedule :func:`decodes_frozen`, no
        teacher forcing) and join them; returns those that ended already (at their first token, or
        failed)."""
        t0 = time.perf_counter()
        finished: list[Finished] = []
        groups: dict[int, list[tuple[int, BatchRequest, _Prepared]]] = {}
        for key, request in requests:
            if not decodes_frozen(request.engine) or request.forced is not None or request.force_own:
                raise ValueError("RunningBatch decodes frozen generations without teacher forcing only")
            try:
                prepared = _Prepared.of(request)
            except Exception as exc:  # its own prompt or settings
                finished.append(_failure(key, exc))
                continue
            groups.setdefault(id(request.engine), []).append((key, request, prepared))
        joining: list[tuple[_Row, RowPrefill]] = []
        for members in groups.values():
            for (key, request, prep), prefill in zip(members, self._prefill(members, finished)):
                if prefill is None:
                    continue
                try:
                    row = _first_token(key, request, prep, prefill, t0)
                    _offer(row, self.on_token)
                except Exception as exc:
                    finished.append(_failure(key, exc))
                    continue
                if row.finish is None:
                    joining.append((row, prefill))
                else:
                    finished.append(Finished(key, _result(row)))
        if joining:
            prefills = [prefill for _, prefill in joining]
            if self.decoder is None:
                engine = next(iter(groups.values()))[0][1].engine
                self.decoder = FrozenDecoder(engine, prefills, room=max(r.limit for r, _ in joining))
            else:
                self.decoder.extend(prefills)
            self.rows += [row for row, _ in joining]
        return finished

    def _prefill(
        self, members: list[tuple[int, BatchRequest, _Prepared]], finished: list[Finished]
    ) -> list[RowPrefill | None]:
        """The members' prefills (one engine) as one batch; if that raises, one by one, so that a
        failing prompt fails alone (None in its place)."""
        engine = members[0][1].engine
        try:
            return list(prefill_rows(engine, [p.ids for _, _, p in members]))
        except Exception as exc:
            if len(members) == 1:
                finished.append(_failure(members[0][0], exc))
                return [None]
        out: list[RowPrefill | None] = []
        for key, _, prep in members:
            try:
                out.append(prefill_row(engine, prep.ids))
            except Exception as exc:
                finished.append(_failure(key, exc))
                out.append(None)
        return out

    @torch.inference_mode()
    def step(self) -> list[Finished]:
        """One decoding step of every row; returns the requests that ended with it (stopped,
        cancelled or failed). An error of the shared step itself is raised (the rows stay)."""
        if self.decoder is None or not self.rows:
            return []
        device = self.decoder.device
        if self.decoder.steps and self.decoder.steps % self.COMPACT_EVERY == 0:
            self.decoder.compact()
        logits = self.decoder.step(torch.tensor([r.tokens[-1] for r in self.rows], device=device))
        finite = torch.isfinite(logits).all(dim=-1).tolist()
        greedy = logits.argmax(dim=-1).tolist()
        keep: list[int] = []
        finished: list[Finished] = []
        for b, row in enumerate(self.rows):
            try:
                if not finite[b]:
                    raise FloatingPointError(NOT_FINITE)
                token = greedy[b] if row.picker is None else int(row.picker.pick(logits[b : b + 1]))
                row.tokens.append(token)
                _offer(row, self.on_token)
            except Exception as exc:
                finished.append(_failure(row.index, exc))
                continue
            if row.finish is None:
                keep.append(b)
            else:
                finished.append(Finished(row.index, _result(row)))
        if len(keep) < len(self.rows):
            self.rows = [self.rows[b] for b in keep]
            if keep:
                self.decoder.keep(keep)
            else:
                self.decoder = None
        return finished

    def clear(self) -> list[int]:
        """Drop every row (the shared step failed, or the server stops); returns their keys."""
        keys = [row.index for row in self.rows]
        self.rows, self.decoder = [], None
        return keys


def _result(row: _Row) -> GenerationResult:
    total = (row.t0 + row.ttft if row.end is None else row.end) - row.t0
    assert row.finish is not None
    return GenerationResult(
        token_ids=list(row.tokens),
        text=row.stop.text(row.tokens),
        prompt_tokens=row.n,
        ttft_s=row.ttft,
        total_s=total,
        finish_reason=row.finish,
        prompt_computed_per_layer=row.per_layer,
        prompt_computed_per_step=[row.computed] * len(row.tokens),
        aux_peak_entries=0,
        aux_peak_bytes=0,
        revival=row.revival,
        scoring=row.scoring,
        sampling=row.sampling,
        forced_logits=row.forced_logits,
    )
