"""LazyLLM inference: progressive per-layer token pruning in prefill and at every decoding step.

One sequence (batch size 1). Every forward pass, the prefill and each decoding step alike, adds new
tokens at the next original positions and ends with ``t``, the newest position. Per layer ``l``:

* **Active set** ``A_l`` (sorted original positions): ``A_0`` is every position so far; ``A_{l+1}``
  is ``A_l`` minus its lowest-ranked tokens by the schedule's rounding rule (``p[l]``), ranked by the
  attention ``t`` pays each of them at layer ``l`` (softmax over ``A_l``, mean over query heads).
  ``t`` always survives.
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

The next-token logits come from ``t``'s final hidden state. With an all-zero schedule every token is
active everywhere and this is exactly ordinary KV-cached decoding.

Fast paths: a layer with ``p[l] = 0`` passes ``Q_l`` and ``A_l`` on unchanged (``C_l = C_{l+1}``
there); a prefill's active keys equal its queries in sorted order, so full layers use sdpa's
``is_causal`` without a mask; a decoding query at ``t`` needs no mask while all keys are active.

The model is never modified: its attention implementation is switched to the ``"lazyllm"`` wrapper
(:mod:`lazyllm.attention`) only inside a call, and restored in ``finally``.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from lazyllm.architectures import DecoderStack, PositionEmbeddings, decoder_stack
from lazyllm.attention import CALL_KWARG, AttentionCall, causal_mask, lazyllm_attention, query_key_mask
from lazyllm.schedule import Schedule, num_pruned
from lazyllm.selectors import AttentionSelector, TokenSelector
from lazyllm.state import GenerationState
from lazyllm.text import StopCriteria, caller_stacklevel, encode_prompt
from lazyllm.timing import synchronize


def select_survivors(scores: torch.Tensor, n_prune: int) -> torch.Tensor:
    """Indices (sorted, into the active set) of the tokens that survive pruning.

    Args:
        scores: ``[n]`` ranking of the active tokens; the last entry is the newest position, which
            always survives and is not ranked.
        n_prune: how many tokens to drop, at most ``n - 1``.

    Ties prune the earlier position first (stable ascending sort).
    """
    n = scores.shape[0]
    if not 0 <= n_prune <= n - 1:
        raise ValueError(f"cannot prune {n_prune} of {n} tokens (the last position must survive)")
    keep = torch.ones(n, dtype=torch.bool, device=scores.device)
    if n_prune:
        order = torch.sort(scores[:-1], stable=True).indices
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
    def computed_fraction(self) -> float:
        """Share of (token, layer) pairs computed, relative to the unpruned prefill."""
        n = self.computed_positions[0].shape[0]
        return sum(self.active_counts) / (n * len(self.computed_positions))

    def next_token(self) -> int:
        return int(self.logits[0].argmax())


@dataclass(frozen=True)
class GenerationResult:
    """Output of :meth:`LazyLLM.generate`.

    Attributes:
        token_ids: generated ids (stop string / EOS included as generated, text cut at a stop string).
        text: decoded generation, when a tokenizer is known.
        prompt_tokens: prompt length N.
        ttft_s: seconds from the call to the first token (prefill + first argmax).
        total_s: seconds for the whole generation.
        finish_reason: "eos", "stop_string" or "length".
        prompt_usage_per_layer: share of prompt tokens each layer computed by the end (paper Fig. 7).
        prompt_usage_per_step: share of (prompt token, layer) pairs computed so far, after each step.
        aux_peak_entries / aux_peak_bytes: Aux Cache high-water mark.
        step_logits: ``[vocab]`` float32 logits of each step, when asked for.
    """

    token_ids: list[int]
    text: str | None
    prompt_tokens: int
    ttft_s: float
    total_s: float
    finish_reason: str
    prompt_usage_per_layer: list[float]
    prompt_usage_per_step: list[float]
    aux_peak_entries: int
    aux_peak_bytes: int
    step_logits: list[torch.Tensor] = field(default_factory=list, repr=False)

    @property
    def prompt_computed_fraction(self) -> float:
        """Share of (prompt token, layer) pairs computed over the whole generation (paper Table 2)."""
        return self.prompt_usage_per_step[-1]


class LazyLLM:
    """A loaded causal LM plus a pruning :class:`Schedule`; the model itself is never changed.

    Args:
        model: a supported ``*ForCausalLM`` (see :mod:`lazyllm.architectures`), in eval mode.
        schedule: the pruning schedule; its layer count must match the model.
        tokenizer: needed to generate from text, apply a chat template or use stop strings.
        selector: how tokens are ranked at pruning layers (default: LazyLLM's attention rule).
        strict_model_name: also require ``schedule.model == model.config.name_or_path``.
        track_computation: count every (layer, position) computation (for tests; small overhead).
        static: static token pruning (a baseline): prune only in the prefill; decoding steps use the
            prompt tokens that reached the last layer and never revive others.
    """

    def __init__(
        self,
        model: Any,
        schedule: Schedule,
        *,
        tokenizer: Any = None,
        selector: TokenSelector | None = None,
        strict_model_name: bool = True,
        track_computation: bool = False,
        static: bool = False,
    ) -> None:
        self.model = model
        self.stack: DecoderStack = decoder_stack(model)
        name = str(getattr(model.config, "name_or_path", "") or type(model).__name__)
        schedule.check_model(name, self.stack.num_layers, strict_name=strict_model_name)
        self.schedule = schedule
        self.tokenizer = tokenizer
        self.selector = selector or AttentionSelector()
        self.track_computation = track_computation
        self.static = static
        self.last_state: GenerationState | None = None

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
        limit = getattr(self.model.config, "max_position_embeddings", None)
        if not limit or ids.shape[1] + max_new_tokens <= limit:
            return ids
        keep = limit - max_new_tokens
        if keep < 2:
            raise ValueError(
                f"max_new_tokens = {max_new_tokens} leaves no room for a prompt in a {limit}-token context"
            )
        warnings.warn(
            f"prompt of {ids.shape[1]} tokens + {max_new_tokens} new exceeds the model's {limit}-token context; "
            f"cut in the middle to {keep} tokens",
            stacklevel=caller_stacklevel(),
        )
        half = keep // 2
        return torch.cat([ids[:, :half], ids[:, ids.shape[1] - (keep - half) :]], dim=1)

    # ------------------------------------------------------------------------------------------------
    def _forward(
        self,
        state: GenerationState,
        new_ids: torch.Tensor,
        start: int,
        inner: str,
        pe_table: dict[str, PositionEmbeddings],
        trace: PrefillTrace | None = None,
        percentiles: tuple[float, ...] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward pass adding ``new_ids`` ``[1, q]`` at positions ``start..start+q-1``.

        Returns the ``[1, vocab]`` logits of the newest position and the positions active at the last
        layer. ``percentiles`` overrides the schedule for this pass. See the module docstring.
        """
        stack = self.stack
        sched = self.schedule.percentiles if percentiles is None else percentiles
        device = new_ids.device
        q0 = new_ids.shape[1]
        total = start + q0  # positions 0..total-1 exist after this pass
        state.ensure_capacity(total)
        q_pos = torch.arange(start, total, device=device)  # Q_0: the new tokens
        visible = state.visible_prompt
        all_active = visible is None  # A_l is every position (no pruning yet in this pass)
        if visible is None:
            active = torch.arange(total, device=device)  # A_0, sorted
        else:  # static pruning: prompt tokens dropped in the prefill stay out for good
            active = torch.cat([visible, torch.arange(state.prompt_tokens, total, device=device)])
        hidden = stack.embed(new_ids)  # [1, q, hidden]
        explicit = inner == "eager"
        pe_q = {t: (cos[:, q_pos], sin[:, q_pos]) for t, (cos, sin) in pe_table.items()}
        for layer_idx, layer in enumerate(stack.layers):
            n_active = active.shape[0]
            n_prune = num_pruned(sched[layer_idx], n_active)
            observe = self.selector.observes(layer_idx)
            window = stack.windows[layer_idx]
            kv = state.kv[layer_idx]
            n_old = kv.length if state.store_kv else 0
            q = q_pos.shape[0]
            # keys: the layer's stored slots (if any) followed by the queries' own
            key_active: torch.Tensor | None = None
            if n_old and not all_active:
                in_active = torch.zeros(total, dtype=torch.bool, device=device)
                in_active[active] = True
                key_active = torch.cat(
                    [in_active[kv.slot_positions()], torch.ones(q, dtype=torch.bool, device=device)]
                )
            if n_old == 0:
                # queries == keys == A_l, sorted: plain causality in index space is causality by position
                mask = causal_mask(q_pos, window, hidden.dtype, explicit=explicit)
                key_pos = q_pos
            else:
                key_pos = torch.cat([kv.slot_positions(), q_pos])
                span_ok = window is None or int(key_pos.max() - key_pos.min()) < window
                single_newest = q == 1  # the newest position: every stored key is earlier
                if single_newest and key_active is None and span_ok and not explicit:
                    mask = None
                else:
                    mask = query_key_mask(q_pos, key_pos, key_active, window, hidden.dtype)
            last_key_mask = None
            if n_prune or observe:
                last_key_mask = key_active
                if window is not None and int(q_pos[-1] - key_pos.min()) >= window:
                    in_window = (q_pos[-1] - key_pos) < window
                    last_key_mask = in_window if last_key_mask is None else last_key_mask & in_window

            def store(
                key: torch.Tensor, value: torch.Tensor, kv: Any = kv, q_pos: torch.Tensor = q_pos
            ) -> Any:
                return kv.append(key, value, q_pos)

            call = AttentionCall(
                inner=inner,
                store=store if state.store_kv else None,
                want_scores=n_prune > 0 or observe,
                last_key_mask=last_key_mask,
            )
            hidden = layer(
                hidden,
                attention_mask=mask,
                position_ids=q_pos[None],
                position_embeddings=pe_q[stack.layer_types[layer_idx]],
                **{CALL_KWARG: call},
            )
            state.record_computed(layer_idx, q_pos, n_old)
            if trace is not None:
                trace.computed.append(active)
            attention = None
            if n_prune or observe:
                if call.scores is None:
                    raise RuntimeError(
                        f"layer {layer_idx} did not call the attention interface; cannot score tokens"
                    )
                slots = (
                    state.slot_of[layer_idx, active]
                    if state.store_kv
                    else torch.arange(n_active, device=device)
                )
                attention = call.scores[0, slots]  # [n_active], sorted by position
                if trace is not None:
                    trace.scores[layer_idx] = attention
                if observe:
                    self.selector.observe(layer_idx, attention, active)
            if layer_idx == stack.num_layers - 1:
                break
            if sched[layer_idx] == 0:
                continue  # A_{l+1} = A_l and Q_{l+1} = Q_l
            # --- choose A_{l+1} ---------------------------------------------------------------------
            next_active = active
            if n_prune and attention is not None:
                keep = select_survivors(self.selector.rank(layer_idx, attention, active), n_prune)
                next_active = active[keep]
                all_active = False
            # --- route hidden states: Q_{l+1} = A_{l+1} \ C_{l+1} -----------------------------------
            need = (
                next_active[state.slot_of[layer_idx + 1, next_active] < 0] if state.store_kv else next_active
            )
            row_of = torch.full((total,), -1, dtype=torch.long, device=device)
            row_of[q_pos] = torch.arange(q, device=device)
            rows = row_of[need]
            fresh = rows >= 0
            if bool(fresh.all()):
                next_hidden = hidden[:, rows]
            else:
                next_hidden = hidden.new_empty(1, need.shape[0], hidden.shape[-1])
                next_hidden[0, fresh] = hidden[0, rows[fresh]]
                next_hidden[0, ~fresh] = state.revive(layer_idx, need[~fresh])
            if state.store_kv:
                in_next = torch.zeros(total, dtype=torch.bool, device=device)
                in_next[next_active] = True
                dropped = ~in_next[q_pos]
                if bool(dropped.any()):
                    state.park(layer_idx, q_pos[dropped], hidden[0, dropped])
            hidden, q_pos, active = next_hidden, need, next_active
            pe_q = {t: (cos[:, q_pos], sin[:, q_pos]) for t, (cos, sin) in pe_table.items()}
        return stack.logits(hidden[:, -1:]).float(), active

    def _pe_table(self, hidden_like: torch.Tensor, n_positions: int) -> dict[str, PositionEmbeddings]:
        positions = torch.arange(n_positions, device=hidden_like.device)[None]
        return self.stack.position_embeddings(hidden_like, positions)

    # ------------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor | list[int], *, return_scores: bool = False) -> PrefillResult:
        """Run the pruned prefill of one prompt (no caches kept).

        Args:
            input_ids: ``[1, N]`` or ``[N]`` token ids.
            return_scores: keep the attention scores of every pruning layer in the result.
        """
        ids = self._as_input_ids(input_ids)
        n = ids.shape[1]
        self.selector.reset()
        state = GenerationState(
            self.stack.num_layers, n, ids.device, store_kv=False, track=self.track_computation
        )
        trace = PrefillTrace()
        with lazyllm_attention(self.model) as inner:
            pe_table = self._pe_table(self.stack.embed(ids[:, :1]), n)
            logits, _ = self._forward(state, ids, 0, inner, pe_table, trace)
        self.last_state = state
        return PrefillResult(
            logits=logits,
            computed_positions=tuple(trace.computed),
            scores=trace.scores if return_scores else {},
        )

    @torch.inference_mode()
    def generate(
        self,
        prompt: str | torch.Tensor | list[int],
        *,
        max_new_tokens: int = 64,
        chat: bool = False,
        eos_token_id: int | list[int] | None = None,
        stop_strings: list[str] | tuple[str, ...] = (),
        return_logits: bool = False,
    ) -> GenerationResult:
        """Greedy decoding with LazyLLM pruning in the prefill and at every step.

        Args:
            prompt: text (needs a tokenizer) or token ids ``[N]`` / ``[1, N]``.
            max_new_tokens: at most this many new tokens.
            chat: wrap a text prompt as a user turn of the tokenizer's chat template.
            eos_token_id: stop at these ids (default: the tokenizer's / generation config's EOS).
            stop_strings: stop once the decoded text contains one of these; the text is cut before it.
            return_logits: keep every step's logits in the result.
        """
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens = {max_new_tokens}: must be >= 1")
        t0 = time.perf_counter()
        ids = self._fit_context(
            self._as_input_ids(encode_prompt(self.tokenizer, prompt, chat=chat)), max_new_tokens
        )
        n = ids.shape[1]
        stop = StopCriteria.build(self.model, self.tokenizer, eos_token_id, stop_strings)
        self.selector.reset()
        state = GenerationState(
            self.stack.num_layers, n + max_new_tokens, ids.device, store_kv=True, track=self.track_computation
        )
        state.prompt_tokens = n
        generated: list[int] = []
        logits_kept: list[torch.Tensor] = []
        usage_steps: list[float] = []
        finish = "length"
        ttft = 0.0
        with lazyllm_attention(self.model) as inner:
            pe_table = self._pe_table(self.stack.embed(ids[:, :1]), n + max_new_tokens)
            next_input, start = ids, 0
            decode_sched: tuple[float, ...] | None = None
            for step in range(max_new_tokens):
                logits, final_active = self._forward(
                    state, next_input, start, inner, pe_table, None, decode_sched
                )
                if step == 0 and self.static:
                    # static pruning: the prompt tokens that reached the last layer are all later steps see
                    state.visible_prompt = final_active[final_active < n]
                    decode_sched = (0.0,) * self.stack.num_layers
                token = int(logits[0].argmax())
                if step == 0:
                    synchronize(ids.device)
                    ttft = time.perf_counter() - t0
                generated.append(token)
                if return_logits:
                    logits_kept.append(logits[0])
                usage_steps.append(float((state.slot_of[:, :n] >= 0).float().mean()))
                reason = stop.check(generated)
                if reason:
                    finish = reason
                    break
                start += next_input.shape[1]
                next_input = torch.tensor([[token]], device=ids.device)
        synchronize(ids.device)
        total = time.perf_counter() - t0
        self.last_state = state
        per_layer = (state.slot_of[:, :n] >= 0).float().mean(dim=1).tolist()
        return GenerationResult(
            token_ids=generated,
            text=stop.text(generated),
            prompt_tokens=n,
            ttft_s=ttft,
            total_s=total,
            finish_reason=finish,
            prompt_usage_per_layer=per_layer,
            prompt_usage_per_step=usage_steps,
            aux_peak_entries=state.aux_peak_entries,
            aux_peak_bytes=state.aux_peak_bytes,
            step_logits=logits_kept,
        )


@dataclass
class PrefillTrace:
    """What a prefill pass records for :class:`PrefillResult`."""

    computed: list[torch.Tensor] = field(default_factory=list)
    scores: dict[int, torch.Tensor] = field(default_factory=dict)
