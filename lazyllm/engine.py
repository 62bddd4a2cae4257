"""LazyLLM inference: progressive per-layer token pruning in prefill and at every decoding step.

One sequence (batch size 1). Every forward pass, the prefill and each decoding step alike, adds new
tokens at the next original positions and ends with ``t``, the newest position. Per layer ``l``:

* **Active set** ``A_l`` (sorted original positions): ``A_0`` is every position so far; ``A_{l+1}``
  is ``A_l`` minus its lowest-ranked tokens by the schedule's rounding rule (``p[l]``), ranked by the
  schedule's :class:`~lazyllm.scoring.Scoring` rule at layer ``l`` (by default the attention ``t``
  pays each of them: softmax over ``A_l``, mean over query heads; a rule may use the queries of the
  last ``w`` positions, pooling, another head reduction or the layers since the previous stage).
  ``t`` always survives. In a decoding step the window is ``t`` plus the newest earlier positions
  the layer scored with (their queries are kept per layer, ``w - 1`` of them).
* **Queries** ``Q_l = A_l \\ C_l``: the active tokens layer ``l`` has never computed (``C_l``, see
  :mod:`lazyllm.state`). In a prefill that is all of ``A_l``; in a decoding step it is ``t`` plus any
  *revived* token, one pruned earlier and chosen again now. Nothing is computed twice in one layer.
* **Inputs of the queries**: for ``l = 0`` the embeddings; otherwise the layer ``l - 1`` output,
  either computed in this pass or, for a revived token, taken from the Aux Cache of layer ``l - 1``.
* **Attention**: each query at position ``i`` attends the keys of ``A_l`` at positions ``j <= i``
  (and ``i - j < window`` on sliding layers), by original positions. Keys/values of ``A_l ∩ C_l``
  come from the layer's KV store; those of ``Q_l`` are computed now and appended to it. Keys in
  ``C_l \\ A_l`` (pruned this pass) are masked out.
* **After the layer**: queries not in ``A_{l+1}`` park their output in the Aux Cache of layer ``l``.

Decoding steps follow the schedule's revival policy (:class:`~lazyllm.schedule.Revival`):
``dynamic`` is the above; ``frozen`` prunes nothing in decoding steps, so each layer attends exactly
``C_l`` plus ``t`` (the prefill's survivors and the generated tokens) and the Aux Cache is never
filled; ``budget:B`` is ``dynamic`` with at most ``B`` (token, layer) computations per step besides
``t``'s: at a pruning layer ``l`` a revival candidate (active, not in ``C_{l+1}``) costs the layers up
to the next pruning layer, the best-ranked candidates the budget pays for stay eligible and the others
are pruned (so ``A_{l+1}`` may be smaller than the rounding rule says).

The next-token logits come from ``t``'s final hidden state. With an all-zero schedule every token is
active everywhere and this is exactly ordinary KV-cached decoding.

Fast paths: a layer with ``p[l] = 0`` passes ``Q_l`` and ``A_l`` on unchanged (``C_l = C_{l+1}``
there); a prefill's active keys equal its queries in sorted order, so full layers use sdpa's
``is_causal`` without a mask; a decoding query at ``t`` needs no mask while all keys are active. No
host sync happens in a pass that prunes nothing (keep-all, ``frozen`` decoding) besides reading the
next token.

The model is never modified: its layers run through views whose attention calls the ``"lazyllm"``
wrapper (:mod:`lazyllm.attention`); the model and its config are shared, never switched.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import GenerationConfig

from lazyllm.architectures import DecoderStack, PositionEmbeddings, decoder_stack
from lazyllm.attention import CALL_KWARG, AttentionCall, lazyllm_layers, query_key_mask
from lazyllm.limits import context_length, prompt_limit
from lazyllm.models import model_name
from lazyllm.results import GenerationResult, GenerationTrace, PassTrace
from lazyllm.sampling import Sampling
from lazyllm.schedule import Revival, Schedule, num_pruned
from lazyllm.scoring import Scoring
from lazyllm.selectors import ScoringSelector, TokenSelector
from lazyllm.state import GenerationState
from lazyllm.streaming import IncrementalText, TextStream
from lazyllm.text import Prompt, StopCriteria, caller_stacklevel, encode_prompt, is_messages
from lazyllm.timing import synchronize


def select_survivors(
    scores: torch.Tensor, n_prune: int, forbidden: torch.Tensor | None = None
) -> torch.Tensor:
    """Indices (sorted, into the active set) of the tokens that survive pruning.

    Args:
        scores: ``[n]`` ranking of the active tokens; the last entry is the newest position, which
            always survives and is not ranked.
        n_prune: how many tokens to drop, at most ``n - 1``.
        forbidden: ``[n]`` bool, tokens pruned before any other (a revival budget); ``n_prune`` must
            cover them.

    Ties prune the earlier position first (stable ascending sort).
    """
    n = scores.shape[0]
    if not 0 <= n_prune <= n - 1:
        raise ValueError(f"cannot prune {n_prune} of {n} tokens (the last position must survive)")
    keep = torch.ones(n, dtype=torch.bool, device=scores.device)
    if n_prune:
        ranking = scores[:-1]
        if forbidden is not None:
            ranking = ranking.masked_fill(forbidden[:-1], float("-inf"))
        order = torch.sort(ranking, stable=True).indices
        keep[order[:n_prune]] = False
    return keep.nonzero().squeeze(1)


@dataclass(frozen=True)
class PrefillResult:
    """Output of a LazyLLM prefill.

    Attributes:
        logits: ``[1, vocab]`` float32 next-token logits.
        computed_positions: one sorted int64 tensor per layer, the original positions that layer computed.
        scores: per pruning layer, ``[n_l]`` attention of the last position over the tokens active there.
    """

    logits: torch.Tensor
    computed_positions: tuple[torch.Tensor, ...]
    scores: dict[int, torch.Tensor]

    @property
    def active_counts(self) -> list[int]:
        return [int(p.shape[0]) for p in self.computed_positions]

    @property
    def prompt_computed_fraction(self) -> float:
        """Share of (token, layer) pairs computed, relative to the unpruned prefill."""
        n = self.computed_positions[0].shape[0]
        return sum(self.active_counts) / (n * len(self.computed_positions))

    def next_token(self) -> int:
        return int(self.logits[0].argmax())


# ----------------------------------------------------------------------------------------------------
# One forward pass, as named steps on a per-layer plan


@dataclass(frozen=True)
class PromptPrefix:
    """The unpruned prefill of one prompt through its first ``depth`` layers, to resume from.

    A schedule that prunes nothing before layer ``F`` (and whose rule observes no layer before it)
    computes layers ``0..F-1`` of a prefill exactly as the unpruned model does, so its prefill may
    start at layer ``F`` from here (:meth:`LazyLLM.forced_logits`): bit for bit the same result,
    without the ``F`` full-width layers. Made by :meth:`LazyLLM.capture_prefix` on the same model.

    Attributes:
        ids: ``[1, N]`` the prompt.
        inputs: ``depth + 1`` tensors ``[1, N, hidden]``: the input of layer ``l`` (``l = 0``: the embeddings).
        keys: ``depth`` tensors ``[1, KVH, N, D]``, what layer ``l`` stored for every position.
        values: the same for values.
    """

    ids: torch.Tensor
    inputs: tuple[torch.Tensor, ...]
    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]

    def __post_init__(self) -> None:
        if len(self.inputs) != len(self.keys) + 1 or len(self.keys) != len(self.values):
            raise ValueError(
                f"prefix of {len(self.keys)} layers needs {len(self.keys) + 1} inputs and "
                f"{len(self.keys)} values; got {len(self.inputs)} and {len(self.values)}"
            )

    @property
    def depth(self) -> int:
        return len(self.keys)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.inputs, *self.keys, *self.values))


@dataclass(frozen=True)
class LayerPlan:
    """What layer ``index`` does in one pass: the mask, whether it scores, how many tokens it prunes.

    Attributes:
        n_old: slots the layer stored before this pass (its keys come first, then the queries').
        mask: ``[1, 1, q, n_old + q]`` additive mask, or None where causality is implicit.
        key_active: ``[n_old + q]`` bool, keys in ``A_l`` (None: all of them).
        n_prune: tokens pruned after the layer (the rounding rule on ``|A_l|``).
        want_scores: score the active tokens (to prune, or for a selector that observes the layer).
        last_key_mask: ``[n_old + q]`` bool, keys ``t`` may attend (None: all).
        window_positions: ``[w']`` original positions of the rule's query window (None: ``t`` alone).
        window_mask: ``[w', n_old + q]`` bool, keys each window query may see (None with ``w = 1``).
    """

    index: int
    n_old: int
    mask: torch.Tensor | None
    key_active: torch.Tensor | None
    n_prune: int
    want_scores: bool
    last_key_mask: torch.Tensor | None
    window_positions: torch.Tensor | None = None
    window_mask: torch.Tensor | None = None


@dataclass
class Generation:
    """What every pass of one generation shares (built once per call; never shared between calls).

    Made by :meth:`LazyLLM.begin` and handed back to :meth:`LazyLLM.forward_pass` for every pass of
    that generation; callers read ``state`` (the per-layer stores, :class:`~lazyllm.state.GenerationState`)
    and ``prompt_pairs`` and otherwise treat it as opaque.
    """

    stack: DecoderStack
    layers: tuple[torch.nn.Module, ...]  # views whose attention calls the lazyllm wrapper
    inner: str  # the model's own attention kernel
    pe_table: dict[str, PositionEmbeddings]  # cos/sin for every position, per layer type
    state: GenerationState
    selector: TokenSelector
    percentiles: tuple[float, ...]
    revival: Revival
    scoring: Scoring = field(default_factory=Scoring)
    # per layer, the queries [1, H, m, D] and positions [m] of the newest positions it scored with
    recent: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    prompt_tokens: int = 0
    trace: list[PassTrace] | None = None
    revived_pairs: int = 0
    prompt_pairs: int = 0  # (prompt token, layer) pairs computed so far, where known on the host
    prompt_pairs_device: torch.Tensor | None = None  # the part only the device knows (revived tokens)


class _Pass:
    """The mutable state of one forward pass while it walks the layers: ``Q_l``, ``A_l``, hidden states.

    Steps per layer: :meth:`plan` (masks), :meth:`attend` (run the layer, score), :meth:`choose`
    (``A_{l+1}``), :meth:`route` (``Q_{l+1}`` and their inputs; park the dropped).
    """

    def __init__(self, gen: Generation, new_ids: torch.Tensor, start: int) -> None:
        self.gen = gen
        self.device = new_ids.device
        self.start = start
        self.total = start + new_ids.shape[1]  # positions 0..total-1 exist after this pass
        self.decoding = start > 0
        gen.state.ensure_capacity(self.total)
        self.q_pos = torch.arange(start, self.total, device=self.device)  # Q_0: the new tokens
        self.active = torch.arange(self.total, device=self.device)  # A_0, sorted
        self.all_active = True  # A_l is every position (nothing pruned yet in this pass)
        self.hidden = gen.stack.embed(new_ids)  # [1, q, hidden]
        self.pe_q = {
            t: (cos[:, start : self.total], sin[:, start : self.total])
            for t, (cos, sin) in gen.pe_table.items()
        }
        self.explicit = gen.inner == "eager"  # eager attention needs an explicit causal mask
        frozen = self.decoding and not gen.revival.revives
        self.percentiles = (0.0,) * len(gen.percentiles) if frozen else gen.percentiles
        self.observing = not frozen
        budget = gen.revival.budget if self.decoding else None
        self.budget_left = budget  # revived (token, layer) computations this step may still make
        self.tracing = gen.trace is not None
        self._computed: list[torch.Tensor] = []
        self._attended: list[torch.Tensor] = []
        self._scores: dict[int, torch.Tensor] = {}

    def resume(self, prefix: PromptPrefix, first: int) -> None:
        """Take layers ``0..first-1`` of this prefill from the unpruned ``prefix`` (they prune nothing
        and nobody observes them): store their keys/values and account for them as computed."""
        state = self.gen.state
        for index in range(first):
            if state.store_kv:
                state.kv[index].append(prefix.keys[index], prefix.values[index], self.q_pos)
            self._account(LayerPlan(index, 0, None, None, 0, False, None))
        self.hidden = prefix.inputs[first]

    # --- step 1: masks ------------------------------------------------------------------------------
    def plan(self, index: int) -> LayerPlan:
        gen, state = self.gen, self.gen.state
        window = gen.stack.windows[index]
        n_old = state.kv[index].length if state.store_kv else 0
        q = self.hidden.shape[1]
        n_prune = num_pruned(self.percentiles[index], self.active.shape[0])
        # a budget ranks revival candidates even where the rounding rule prunes nothing
        ranks = n_prune > 0 or (self.budget_left is not None and self.percentiles[index] > 0)
        want_scores = ranks or (self.observing and gen.selector.observes(index))
        span = self.total - 1  # an upper bound of (newest - oldest position) of any key: no device read
        key_active = None
        if n_old == 0:  # queries == keys == A_l, sorted: causality by index is causality by position
            needs_mask = self.explicit or (window is not None and span >= window)
            mask = (
                query_key_mask(self.q_pos, self.q_pos, None, window, self.hidden.dtype)
                if needs_mask
                else None
            )
            key_pos = self.q_pos
        else:
            key_pos = torch.cat([state.kv[index].slot_positions(), self.q_pos])
            if not self.all_active:
                in_active = torch.zeros(self.total, dtype=torch.bool, device=self.device)
                in_active[self.active] = True
                key_active = in_active[key_pos]
            implicit = (
                q == 1 and key_active is None and not self.explicit and (window is None or span < window)
            )
            mask = (
                None
                if implicit
                else query_key_mask(self.q_pos, key_pos, key_active, window, self.hidden.dtype)
            )
        last_key_mask = key_active if want_scores else None
        if want_scores and window is not None and span >= window:
            in_window = (self.total - 1 - key_pos) < window
            last_key_mask = in_window if last_key_mask is None else last_key_mask & in_window
        plan = LayerPlan(index, n_old, mask, key_active, n_prune, want_scores, last_key_mask)
        if want_scores and gen.scoring.window > 1:
            return self._window_plan(plan, key_pos, window)
        return plan

    def _window_plan(self, plan: LayerPlan, key_pos: torch.Tensor, window: int | None) -> LayerPlan:
        """Add the query window of a rule with ``w > 1``: the last ``w`` queries of a prefill, or in a
        decoding step ``t`` after the newest positions this layer scored with before (device ops only)."""
        w = self.gen.scoring.window
        if not self.decoding:
            positions = self.q_pos[-w:]
        else:
            earlier = self.gen.recent.get(plan.index)
            newest = self.q_pos[-1:]
            positions = newest if earlier is None else torch.cat([earlier[1], newest])[-w:]
        allowed = key_pos[None, :] <= positions[:, None]  # [w', K]: causal by original position
        if window is not None:
            allowed &= (positions[:, None] - key_pos[None, :]) < window
        if plan.key_active is not None:
            allowed &= plan.key_active[None, :]
        return dataclasses.replace(plan, window_positions=positions, window_mask=allowed)

    # --- step 2: attend and score -------------------------------------------------------------------
    def attend(self, layer: torch.nn.Module, plan: LayerPlan) -> torch.Tensor | None:
        """Run the layer on the queries; return the rule's scores ``[|A_l|]`` of ``A_l`` (position order) if scored."""
        gen, state = self.gen, self.gen.state
        kv, q_pos = state.kv[plan.index], self.q_pos
        earlier = gen.recent.get(plan.index) if self.decoding else None
        call = AttentionCall(
            inner=gen.inner,
            store=(lambda k, v: kv.append(k, v, q_pos)) if state.store_kv else None,
            want_scores=plan.want_scores,
            values=gen.scoring.values,
            window=gen.scoring.window,
            decoding=self.decoding,
            last_key_mask=plan.last_key_mask,
            window_mask=plan.window_mask,
            earlier_queries=None if earlier is None else earlier[0],
        )
        self.hidden = layer(
            self.hidden,
            attention_mask=plan.mask,
            position_ids=q_pos[None],
            position_embeddings=self.pe_q[gen.stack.layer_types[plan.index]],
            **{CALL_KWARG: call},
        )
        self._account(plan)
        if not plan.want_scores:
            return None
        if call.scores is None:
            raise RuntimeError(
                f"layer {plan.index} did not call the attention interface; cannot score tokens"
            )
        if plan.window_positions is not None and call.window_queries is not None and state.store_kv:
            gen.recent[plan.index] = (call.window_queries, plan.window_positions)
        # keys are [stored slots..., queries...]; read them back in position order of A_l
        order = state.slot_of[plan.index, self.active] if plan.n_old else None
        scores = gen.scoring.token_scores(call.scores, order)
        if self.tracing:
            self._scores[plan.index] = scores
        if self.observing and gen.selector.observes(plan.index):
            gen.selector.observe(plan.index, scores, self.active)
        return scores

    def _account(self, plan: LayerPlan) -> None:
        """Record what the layer computed (slots, counters, trace) without reading the device."""
        gen, state = self.gen, self.gen.state
        q = self.q_pos.shape[0]
        single = q == 1 and self.decoding  # the query is t itself: its position is known on the host
        state.record_computed(plan.index, self.q_pos, plan.n_old, newest=self.total - 1 if single else None)
        if not self.decoding:
            gen.prompt_pairs += q
        elif q > 1:  # revived tokens (t is the last query; a forced batch's counts are never read)
            gen.revived_pairs += q - 1
            revived_prompt = (self.q_pos[:-1] < gen.prompt_tokens).sum()
            if gen.prompt_pairs_device is None:
                gen.prompt_pairs_device = revived_prompt
            else:
                gen.prompt_pairs_device = gen.prompt_pairs_device + revived_prompt
        if self.tracing:
            self._computed.append(self.q_pos)
            if plan.n_old and self.all_active:  # every stored key (the queries' were just appended)
                self._attended.append(torch.sort(state.kv[plan.index].slot_positions()).values)
            else:
                self._attended.append(self.active)

    # --- step 3: choose survivors -------------------------------------------------------------------
    def choose(self, plan: LayerPlan, scores: torch.Tensor | None) -> torch.Tensor:
        """``A_{l+1}``: ``A_l`` minus its lowest-ranked tokens (and, on a budget, unaffordable revivals)."""
        if scores is None or (plan.n_prune == 0 and self.budget_left is None):
            return self.active
        gen = self.gen
        ranks = gen.selector.rank(plan.index, scores, self.active)
        forbidden, n_prune = None, plan.n_prune
        if self.budget_left is not None:
            forbidden, n_forbidden = self._over_budget(plan, ranks)
            n_prune = max(n_prune, n_forbidden)
        keep = select_survivors(ranks, n_prune, forbidden)
        self.all_active = False
        return self.active[keep]

    def _over_budget(self, plan: LayerPlan, ranks: torch.Tensor) -> tuple[torch.Tensor | None, int]:
        """Revival candidates the remaining budget cannot pay for: the lowest-ranked ones."""
        state, nxt = self.gen.state, plan.index + 1
        costly = state.slot_of[nxt, self.active] < 0  # would be computed at layer l + 1 now
        costly[-1] = False  # t is the step's own token, never charged
        cost = self._segment(nxt)
        affordable = self.budget_left // cost if self.budget_left is not None else 0
        n_costly = int(costly.sum())  # host read: budget policy only
        if n_costly <= affordable:
            return None, 0
        # costly tokens in ascending rank order (ties: earlier position first); the last `affordable` stay
        order = torch.sort(ranks.masked_fill(~costly, float("inf")), stable=True).indices
        forbidden = torch.zeros_like(costly)
        forbidden[order[: n_costly - affordable]] = True
        return forbidden, n_costly - affordable

    def _segment(self, first: int) -> int:
        """Layers a token revived into layer ``first`` runs before it is ranked again (``first..m``)."""
        last = len(self.percentiles) - 1
        m = first
        while m < last and self.percentiles[m] == 0:
            m += 1
        return m - first + 1

    # --- step 4: route hidden states ----------------------------------------------------------------
    def route(self, plan: LayerPlan, next_active: torch.Tensor) -> None:
        """``Q_{l+1} = A_{l+1} \\ C_{l+1}`` with their inputs; queries leaving the active set park their output."""
        state, index = self.gen.state, plan.index
        q_pos, hidden = self.q_pos, self.hidden
        # a prefill's layer l + 1 has computed nothing yet; a decoding step's needs what it lacks
        need = next_active[state.slot_of[index + 1, next_active] < 0] if self.decoding else next_active
        row_of = torch.full((self.total,), -1, dtype=torch.long, device=self.device)
        row_of[q_pos] = torch.arange(q_pos.shape[0], device=self.device)
        rows = row_of[need]
        fresh = rows >= 0
        if not self.decoding or bool(fresh.all()):
            next_hidden = hidden[:, rows]
        else:  # revived: their layer-l output waits in the Aux Cache
            next_hidden = hidden.new_empty(1, need.shape[0], hidden.shape[-1])
            next_hidden[0, fresh] = hidden[0, rows[fresh]]
            next_hidden[0, ~fresh] = state.revive(index, need[~fresh])
        if state.keep_aux:
            in_next = torch.zeros(self.total, dtype=torch.bool, device=self.device)
            in_next[next_active] = True
            dropped = ~in_next[q_pos]
            # a prefill drops exactly the pruned queries; a decoding step must look
            if (plan.n_prune > 0) if not self.decoding else bool(dropped.any()):
                state.park(index, q_pos[dropped], hidden[0, dropped])
        if self.budget_left is not None:
            self.budget_left -= (need.shape[0] - 1) * self._segment(index + 1)
        self.hidden, self.q_pos, self.active = next_hidden, need, next_active
        self.pe_q = {t: (cos[:, need], sin[:, need]) for t, (cos, sin) in self.gen.pe_table.items()}

    def finish(self, every_query: bool = False) -> torch.Tensor:
        """``[1, vocab]`` float32 logits of ``t`` (``every_query``: ``[q, vocab]``, one row per query of a
        pass that pruned nothing); closes the pass's trace."""
        if self.gen.trace is not None:
            self.gen.trace.append(PassTrace(tuple(self._computed), tuple(self._attended), self._scores))
        if every_query:
            return self.gen.stack.logits_every(self.hidden)[0].float()
        return self.gen.stack.logits(self.hidden[:, -1:]).float()


class LazyLLM:
    """A loaded causal LM plus a pruning :class:`Schedule`; the model itself is never changed.

    One instance may serve several threads at once: every call keeps its state to itself.

    Args:
        model: a supported ``*ForCausalLM`` (see :mod:`lazyllm.architectures`), in eval mode.
        schedule: the pruning schedule (with its revival policy); its layer count must match the model.
        tokenizer: needed to generate from text, apply a chat template or use stop strings.
        selector: how tokens are ranked at pruning layers (default: the schedule's scoring rule,
            :class:`~lazyllm.selectors.ScoringSelector`; a baseline's selector gets the rule's scores).
        strict_model_name: also require ``schedule.model == model.config.name_or_path``.
    """

    def __init__(
        self,
        model: Any,
        schedule: Schedule,
        *,
        tokenizer: Any = None,
        selector: TokenSelector | None = None,
        strict_model_name: bool = True,
    ) -> None:
        self.model = model
        self.stack: DecoderStack = decoder_stack(model)
        schedule.check_model(model_name(model), self.stack.num_layers, strict_name=strict_model_name)
        self.schedule = schedule
        self.tokenizer = tokenizer
        self.selector = selector or ScoringSelector(schedule.scoring, schedule.percentiles)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _as_input_ids(self, input_ids: torch.Tensor | list[int]) -> torch.Tensor:
        ids = torch.as_tensor(input_ids, dtype=torch.long, device=self.device)
        if ids.dim() == 1:
            ids = ids[None]
        if ids.dim() != 2 or ids.shape[0] != 1:
            raise ValueError(
                f"input_ids has shape {tuple(ids.shape)}; LazyLLM runs one sequence at a time: [1, N]"
            )
        if ids.shape[1] == 0:
            raise ValueError("input_ids is empty; give at least one token")
        return ids

    def _fit_context(self, ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """Cut a prompt that would not fit the model's context in the middle (LongBench's rule), with
        a warning: keep the first and last halves of ``max_position_embeddings - max_new_tokens``."""
        limit = context_length(self.model)
        if limit is None or ids.shape[1] + max_new_tokens <= limit:
            return ids
        keep = prompt_limit(limit, max_new_tokens, name="max_new_tokens").tokens
        warnings.warn(
            f"prompt of {ids.shape[1]} tokens + {max_new_tokens} new exceeds the model's {limit}-token context; "
            f"cut in the middle to {keep} tokens",
            stacklevel=caller_stacklevel(),
        )
        half = keep // 2
        return torch.cat([ids[:, :half], ids[:, ids.shape[1] - (keep - half) :]], dim=1)

    # ------------------------------------------------------------------------------------------------
    # The engine's interface to the batched paths (lazyllm.prefill, lazyllm.batch, lazyllm.apply): a
    # generation is begun once, then walked pass by pass; nothing else of the engine is used there.

    def begin(self, ids: torch.Tensor, capacity: int, *, store_kv: bool, trace: bool) -> Generation:
        """A fresh :class:`Generation` for the prompt ``ids`` ``[1, N]``.

        Args:
            ids: the prompt (its first token sizes the rotary table; its length is ``prompt_tokens``).
            capacity: the most positions the generation will hold (prompt plus new tokens).
            store_kv: keep every layer's keys/values (needed for any pass after the first).
            trace: record a :class:`~lazyllm.results.PassTrace` per pass in ``gen.trace``.
        """
        layers, inner = lazyllm_layers(self.model, self.stack.layers)
        positions = torch.arange(capacity, device=ids.device)[None]
        pe_table = self.stack.position_embeddings(self.stack.embed(ids[:, :1]), positions)
        revival = self.schedule.revival
        state = GenerationState(
            self.stack.num_layers, capacity, ids.device, store_kv=store_kv, keep_aux=revival.revives
        )
        return Generation(
            stack=self.stack,
            layers=layers,
            inner=inner,
            pe_table=pe_table,
            state=state,
            selector=self.selector.begin(),
            percentiles=self.schedule.percentiles,
            revival=revival,
            scoring=self.schedule.scoring,
            prompt_tokens=ids.shape[1],
            trace=[] if trace else None,
        )

    def forward_pass(
        self,
        gen: Generation,
        new_ids: torch.Tensor,
        start: int,
        *,
        every_query: bool = False,
        prefix: PromptPrefix | None = None,
    ) -> torch.Tensor:
        """One forward pass adding ``new_ids`` ``[1, q]`` at positions ``start..start+q-1``; returns the
        ``[1, vocab]`` logits of the newest position (``every_query``: ``[q, vocab]``, for a pass that
        prunes nothing). A prefill given a ``prefix`` starts where the schedule first differs from
        the unpruned model. ``start`` is 0 for the prefill and the number of positions fed so far for
        a later pass. See the module docstring."""
        step = _Pass(gen, new_ids, start)
        first = 0
        if prefix is not None:
            first = self.resume_depth(gen, prefix)
            step.resume(prefix, first)
        last = len(gen.layers) - 1
        for index in range(first, last + 1):
            layer = gen.layers[index]
            plan = step.plan(index)
            scores = step.attend(layer, plan)
            if index == last or step.percentiles[index] == 0:
                continue  # A_{l+1} = A_l and Q_{l+1} = Q_l
            step.route(plan, step.choose(plan, scores))
        return step.finish(every_query)

    # ------------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor | list[int], *, return_scores: bool = False) -> PrefillResult:
        """Run the pruned prefill of one prompt (no caches kept).

        Args:
            input_ids: ``[1, N]`` or ``[N]`` token ids.
            return_scores: keep the attention scores of every pruning layer in the result.
        """
        ids = self._as_input_ids(input_ids)
        gen = self.begin(ids, ids.shape[1], store_kv=False, trace=True)
        logits = self.forward_pass(gen, ids, 0)
        assert gen.trace is not None
        (first,) = gen.trace
        return PrefillResult(
            logits=logits,
            computed_positions=first.computed,
            scores=first.scores if return_scores else {},
        )

    def resume_depth(self, gen: Generation, prefix: PromptPrefix) -> int:
        """How many layers of ``gen``'s prefill the captured ``prefix`` stands in for: those before the
        first one that prunes or that the selector observes (at most ``prefix.depth``)."""
        depth = prefix.depth
        for index in range(min(depth, len(gen.percentiles))):
            if gen.percentiles[index] > 0 or gen.selector.observes(index):
                return index
        return depth

    @torch.inference_mode()
    def capture_prefix(self, prompt: torch.Tensor | list[int]) -> PromptPrefix:
        """The unpruned prefill of ``prompt`` through every layer but the last, for
        :meth:`forced_logits` of other schedules on the same model (this engine must prune nothing)."""
        if any(self.schedule.percentiles):
            raise ValueError("capture_prefix needs an engine that prunes nothing (Schedule.keep_all)")
        ids = self._as_input_ids(torch.as_tensor(prompt))
        n, depth = ids.shape[1], self.stack.num_layers - 1
        gen = self.begin(ids, n, store_kv=True, trace=False)
        step = _Pass(gen, ids, 0)
        inputs = [step.hidden]
        for index in range(depth):
            step.attend(gen.layers[index], step.plan(index))
            inputs.append(step.hidden)
        kv = gen.state.kv[:depth]
        return PromptPrefix(
            ids=ids,
            inputs=tuple(inputs),
            keys=tuple(layer.keys[:, :, :n] for layer in kv if layer.keys is not None),
            values=tuple(layer.values[:, :, :n] for layer in kv if layer.values is not None),
        )

    @torch.inference_mode()
    def forced_logits(
        self,
        prompt: torch.Tensor | list[int],
        forced: Sequence[int],
        *,
        prefix: PromptPrefix | None = None,
    ) -> torch.Tensor:
        """Next-token logits ``[T, vocab]`` (float32) along a given answer ``forced`` (``T`` tokens).

        Teacher forcing: the passes are exactly those of :meth:`generate` (the prefill, then one
        decoding step per token, pruning and reviving as the schedule says), but each step feeds
        ``forced[t - 1]`` instead of the argmax. Row 0 is the prefill's (it scores ``forced[0]``).
        With ``forced`` = this engine's own greedy answer the rows equal ``generate``'s step logits.

        Where decoding steps can neither prune nor revive (``frozen`` revival, or a schedule that prunes
        nothing), step ``t`` attends exactly what the prefill stored plus the forced tokens before it,
        so all steps after the prefill run as one pass of ``T - 1`` queries under a causal mask: the
        same attention sets, equal logits up to float rounding, and one layer walk instead of ``T - 1``.

        ``prefix``: the unpruned prefill of this prompt (:meth:`capture_prefix`); the prefill then
        starts at the schedule's first pruning layer, with exactly the same result.
        """
        if len(forced) < 1:
            raise ValueError("forced answer is empty: need at least one token")
        ids = self._as_input_ids(torch.as_tensor(prompt))
        if prefix is not None and (prefix.ids.shape != ids.shape or not torch.equal(prefix.ids, ids)):
            raise ValueError("prefix was captured from another prompt; capture it from this one")
        if len(forced) > 1 and not (self.schedule.revival.revives and any(self.schedule.percentiles)):
            return self._forced_one_pass(ids, forced, prefix)
        return self._forced_steps(ids, forced, prefix)

    def _forced_one_pass(
        self, ids: torch.Tensor, forced: Sequence[int], prefix: PromptPrefix | None = None
    ) -> torch.Tensor:
        """The prefill, then every forced token but the last as one pass (decoding prunes nothing)."""
        n = ids.shape[1]
        gen = self.begin(ids, n + len(forced), store_kv=True, trace=False)
        first = self.forward_pass(gen, ids, 0, prefix=prefix)
        return self.forced_rest(gen, first, n, forced)

    def forced_rest(
        self, gen: Generation, first: torch.Tensor, n: int, forced: Sequence[int]
    ) -> torch.Tensor:
        """Teacher-forced logits ``[T, vocab]`` (float32) along ``forced`` (``T`` tokens) after a prefill
        of ``n`` tokens already run on ``gen`` (``first``: that prefill's logits ``[1, vocab]``, row 0):
        every forced token but the last as one pass appended to ``gen``'s stores. For schedules whose
        decoding prunes nothing (:meth:`forced_logits` says when); ``gen`` needs room for ``T - 1`` more."""
        if len(forced) == 1:
            return first.float()
        rest = torch.tensor([[int(t) for t in forced[:-1]]], device=first.device)
        return torch.cat([first.float(), self.forward_pass(gen, rest, n, every_query=True)])

    def _forced_steps(
        self, ids: torch.Tensor, forced: Sequence[int], prefix: PromptPrefix | None = None
    ) -> torch.Tensor:
        """The prefill, then one decoding step per forced token (any revival policy)."""
        n, steps = ids.shape[1], len(forced)
        gen = self.begin(ids, n + steps, store_kv=True, trace=False)
        rows: list[torch.Tensor] = []
        next_input, start = ids, 0
        for step in range(steps):
            logits = self.forward_pass(gen, next_input, start, prefix=prefix if step == 0 else None)
            rows.append(logits[0].float())
            start += next_input.shape[1]
            next_input = torch.tensor([[int(forced[step])]], device=ids.device)
        return torch.stack(rows)

    def generate(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int = 64,
        chat: bool | None = None,
        eos_token_id: int | list[int] | None = None,
        stop_strings: list[str] | tuple[str, ...] = (),
        return_logits: bool = False,
        trace: bool = False,
        generation_config: Sampling | GenerationConfig | None = None,
        do_sample: bool | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        repetition_penalty: float | None = None,
        seed: int | None = None,
        prefix: PromptPrefix | None = None,
    ) -> GenerationResult:
        """Decoding with LazyLLM pruning in the prefill and at every step (greedy unless told to sample).

        Args:
            prompt: text (needs a tokenizer), token ids ``[N]`` / ``[1, N]``, or chat messages
                ``[{"role": ..., "content": ...}, ...]`` (rendered by the tokenizer's chat template).
            max_new_tokens: at most this many new tokens.
            chat: wrap a text prompt as a user turn of the tokenizer's chat template; ``None``
                (the default): when the tokenizer has one (:func:`lazyllm.text.encode_prompt`).
            eos_token_id: stop at these ids (default: the tokenizer's / generation config's EOS).
            stop_strings: stop once the decoded text contains one of these; the text is cut before it.
            return_logits: keep every step's logits (before any processor) in the result.
            trace: record what every pass computed in ``result.trace`` (small overhead; for tests).
            generation_config: a :class:`~lazyllm.sampling.Sampling` or a ``transformers.GenerationConfig``
                (its decoding fields); the keyword arguments below override it.
            do_sample, temperature, top_k, top_p, repetition_penalty, seed: transformers' names and
                meaning (:mod:`lazyllm.sampling`). The pruning is the same whatever they are.
            prefix: the unpruned prefill of this very prompt (:meth:`capture_prefix` of a keep-all engine);
                the prefill then starts at the schedule's first pruning layer, with the same result. For
                scoring many schedules on one prompt; the TTFT it reports leaves out the prefix's layers.
        """
        sampling = Sampling.resolve(
            generation_config, do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
            repetition_penalty=repetition_penalty, seed=seed,
        )  # fmt: skip
        t0 = time.perf_counter()
        ids, stop = self.prepare(prompt, max_new_tokens, chat, eos_token_id, stop_strings)
        if prefix is not None and (prefix.ids.shape != ids.shape or not torch.equal(prefix.ids, ids)):
            raise ValueError("prefix was captured from another prompt; capture it from this one")
        steps = self.decode_steps(ids, stop, t0, max_new_tokens, sampling, return_logits, trace, prefix)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                result: GenerationResult = done.value
                return result

    def stream(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int = 64,
        chat: bool | None = None,
        eos_token_id: int | list[int] | None = None,
        stop_strings: list[str] | tuple[str, ...] = (),
        generation_config: Sampling | GenerationConfig | None = None,
        do_sample: bool | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        repetition_penalty: float | None = None,
        seed: int | None = None,
    ) -> TextStream:
        """:meth:`generate`, yielding the text as it is decoded (needs a tokenizer).

        Iterate the returned :class:`~lazyllm.streaming.TextStream` for the pieces (their concatenation
        is ``generate``'s ``text`` for the same arguments and seed); its ``result`` is the
        :class:`GenerationResult` once the stream is exhausted, with ``ttft_s`` the seconds from this
        call to the first piece. The arguments are checked here, before the first piece is asked for.
        """
        if self.tokenizer is None:
            raise ValueError("stream() needs a tokenizer: LazyLLM(model, schedule, tokenizer=tokenizer)")
        sampling = Sampling.resolve(
            generation_config, do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
            repetition_penalty=repetition_penalty, seed=seed,
        )  # fmt: skip
        t0 = time.perf_counter()
        ids, stop = self.prepare(prompt, max_new_tokens, chat, eos_token_id, stop_strings)
        steps = self.decode_steps(ids, stop, t0, max_new_tokens, sampling, False, False)
        return TextStream(steps, IncrementalText(stop), t0)

    def generate_many(self, prompts: Sequence[Prompt], **options: Any) -> list[GenerationResult]:
        """:meth:`generate` of each prompt in turn, with the same keyword arguments (a seed seeds each
        prompt alike: result ``i`` equals ``generate(prompts[i], **options)``).

        Sequential: the engine decodes one sequence at a time (batch size 1), which keeps every
        prompt's pruning its own; several prompts cost the sum of their times.
        """
        if isinstance(prompts, str) or is_messages(prompts):
            raise ValueError("generate_many takes a list of prompts; call generate for a single one")
        return [self.generate(p, **options) for p in prompts]

    def prepare(
        self,
        prompt: Prompt,
        max_new_tokens: int,
        chat: bool | None,
        eos_token_id: int | list[int] | None,
        stop_strings: Sequence[str],
    ) -> tuple[torch.Tensor, StopCriteria]:
        """The prompt as ids ``[1, N]`` on the model's device (encoded as :meth:`generate` does, cut in
        the middle to fit the context with ``max_new_tokens`` more) and its stopping rule, checked."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens = {max_new_tokens}: must be >= 1")
        ids = self._fit_context(
            self._as_input_ids(encode_prompt(self.tokenizer, prompt, chat=chat)), max_new_tokens
        )
        return ids, StopCriteria.build(self.model, self.tokenizer, eos_token_id, stop_strings)

    @torch.inference_mode()
    def decode_steps(
        self,
        ids: torch.Tensor,
        stop: StopCriteria,
        t0: float,
        max_new_tokens: int,
        sampling: Sampling,
        return_logits: bool,
        trace: bool,
        prefix: PromptPrefix | None = None,
    ) -> Generator[list[int], None, GenerationResult]:
        """:meth:`generate`'s decoding loop over ``ids`` ``[1, N]`` (from :meth:`prepare`), as a generator:
        yields the list of tokens so far after each new one and returns the :class:`GenerationResult`
        (``t0``: ``time.perf_counter()`` when the call began, for TTFT and total)."""
        n = ids.shape[1]
        generated: list[int] = []
        gen = self.begin(ids, n + max_new_tokens, store_kv=True, trace=trace)
        picker = None if sampling.greedy else sampling.picker(ids, max_new_tokens)
        logits_kept: list[torch.Tensor] = []
        usage: list[tuple[int, torch.Tensor | None]] = []  # per step: host part, device part
        finish = "length"
        ttft = 0.0
        next_input, start = ids, 0
        for step in range(max_new_tokens):
            logits = self.forward_pass(gen, next_input, start, prefix=prefix if step == 0 else None)
            if picker is None:
                token = int(logits[0].argmax())
                picked = None
            else:
                picked = picker.pick(logits)  # [1, 1] on the device
                token = int(picked)
            if step == 0:
                synchronize(ids.device)
                ttft = time.perf_counter() - t0
            generated.append(token)
            if return_logits:
                logits_kept.append(logits[0])
            usage.append((gen.prompt_pairs, gen.prompt_pairs_device))
            reason = stop.check(generated)
            yield generated
            if reason:
                finish = reason
                break
            start += next_input.shape[1]
            next_input = picked if picked is not None else torch.tensor([[token]], device=ids.device)
        synchronize(ids.device)
        total = time.perf_counter() - t0
        state = gen.state
        pairs = n * self.stack.num_layers
        usage_steps = [(host + (0 if dev is None else int(dev))) / pairs for host, dev in usage]
        per_layer = (state.slot_of[:, :n] >= 0).float().mean(dim=1).tolist()
        return GenerationResult(
            token_ids=generated,
            text=stop.text(generated),
            prompt_tokens=n,
            ttft_s=ttft,
            total_s=total,
            finish_reason=finish,
            prompt_computed_per_layer=per_layer,
            prompt_computed_per_step=usage_steps,
            aux_peak_entries=state.aux_peak_entries,
            aux_peak_bytes=state.aux_peak_bytes,
            revival=str(gen.revival),
            scoring=str(gen.scoring),
            revived_pairs=gen.revived_pairs,
            step_logits=logits_kept,
            trace=GenerationTrace(tuple(gen.trace)) if gen.trace is not None else None,
            sampling=sampling,
        )
