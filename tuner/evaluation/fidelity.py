"""Fidelity: how far a pruned model drifts from the unpruned one, teacher-forced along its own answer.

Per validation example, the unpruned model's greedy answer ``y_1..y_T`` (the baseline prediction,
cached with the baseline) is fed to both models token by token, exactly as decoding would (the prefill
of the prompt, then one decoding step per answer token, pruning at every pass as LazyLLM does), and
at each step ``t`` the next-token distributions ``P_t`` (unpruned) and ``Q_t`` (pruned) are compared:

* ``kl``: mean over ``t`` of ``KL(P_t || Q_t)`` in nats, computed on the unpruned model's top-``k``
  tokens plus one bucket for the rest of the vocabulary (a coarsening, so never above the full KL,
  and exactly 0 when the two distributions are equal);
* ``top1``: share of steps where the pruned model's argmax equals the unpruned one's;
* ``gold_delta`` (optional, ``gold=True``): mean log-likelihood per token of the first gold answer
  under the unpruned model minus under the pruned one (positive: pruning made the gold answer less
  likely). It costs a second teacher-forced pass per example.

The pruned side never generates freely, so its cost is fixed (prompt + ``T`` tokens). The unpruned
side (answer ids, top-``k`` log-probabilities per step, gold log-probabilities) is computed once per
study and cached as safetensors beside the baseline JSON cache, with a checksum of every tensor and
the baseline it was forced along in its metadata; a file that fails either, or holds an implausible
reference (a log-probability above 0, unsorted top-``k``), is rebuilt with one line, and a reference
whose answer ids are not the baseline's current answer is recomputed
(:mod:`tuner.evaluation.integrity`).

Engine hook: :meth:`lazyllm.engine.LazyLLM.forced_logits` runs the passes ``generate`` runs, with
the next input taken from the given answer instead of the argmax.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from lazyllm.atomic import replace_with
from lazyllm.batch import DEFAULT_BATCH_SIZE
from lazyllm.engine import LazyLLM, PromptPrefix
from lazyllm.models import model_name
from lazyllm.schedule import Schedule
from tuner.evaluation.integrity import announce_rebuild, tensors_digest
from tuner.evaluation.kl import topk_kl
from tuner.evaluation.runner import ExampleResult, chunks, result_of, run_examples

DEFAULT_TOP_K = 64
PREFIX_MEMORY_SHARE = 0.4
"""Unpruned prefills are kept per evaluator so trials start at their first pruning layer; by default
an evaluator keeps them within this share of the memory free on the model's device when it captures
its first one (each holds every layer of one prompt: about 120 MB for SmolLM2 at 1024 tokens), and
the rest run in full. A fixed 2 GiB held 17 of a search's 80 open-QA prompts, so most of each
trial's prefills ran from layer 0."""


def free_memory_bytes(device: torch.device) -> int:
    """Bytes free on ``device``: ``torch.cuda.mem_get_info`` on CUDA, ``MemAvailable`` elsewhere (0
    where it cannot be read: nothing is kept)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


RESUMES_PER_CAPTURE = 3
"""Passes that must resume from a prompt prefix before :meth:`FidelityEvaluator.score_together`
captures one that is not cached: capturing costs about one unpruned prefill, and a resumed pass saves
only the layers before its schedule first prunes."""
# v2: references teacher-forced in one pass after the prefill (LazyLLM.forced_logits), so a keep-all
# trial reproduces them bit for bit; v1 files (step by step) are recomputed, not mixed with v2 trials
_FORMAT = "lazyllm-fidelity-v2"


def forced_logits(
    engine: LazyLLM,
    prompt_ids: Sequence[int] | torch.Tensor,
    forced: Sequence[int],
    prefix: PromptPrefix | None = None,
) -> torch.Tensor:
    """Next-token logits ``[T, vocab]`` along ``forced``: :meth:`lazyllm.engine.LazyLLM.forced_logits`."""
    return engine.forced_logits(torch.as_tensor(prompt_ids), forced, prefix=prefix)


@dataclass(frozen=True)
class Reference:
    """The unpruned side of one example.

    Attributes:
        answer_ids: ``[T]`` int64, the unpruned greedy answer.
        topk_ids: ``[T, k]`` int64, the unpruned model's ``k`` most likely tokens per step (argmax first).
        topk_logp: ``[T, k]`` float32, their log-probabilities.
        gold_ids: ``[G]`` int64, the first gold answer's tokens (empty when not computed).
        gold_logp: ``[G]`` float32, their log-probabilities under the unpruned model.
    """

    answer_ids: torch.Tensor
    topk_ids: torch.Tensor
    topk_logp: torch.Tensor
    gold_ids: torch.Tensor
    gold_logp: torch.Tensor

    def __post_init__(self) -> None:
        t = self.answer_ids.shape[0]
        if t < 1 or self.topk_ids.shape[0] != t or self.topk_ids.shape != self.topk_logp.shape:
            raise ValueError(
                f"reference shapes disagree: answer {tuple(self.answer_ids.shape)}, "
                f"top-k ids {tuple(self.topk_ids.shape)}, log-probs {tuple(self.topk_logp.shape)}"
            )
        if self.gold_ids.shape != self.gold_logp.shape:
            raise ValueError("gold ids and gold log-probs differ in shape")
        for name in ("answer_ids", "topk_ids", "gold_ids"):
            ids = getattr(self, name)
            if ids.dtype != torch.long or (ids.numel() and int(ids.min()) < 0):
                raise ValueError(f"reference {name}: must be int64 token ids >= 0")
        for name in ("topk_logp", "gold_logp"):
            logp = getattr(self, name)
            # log-probabilities: <= 0, never NaN (-inf is a probability of 0)
            if logp.dtype != torch.float32 or bool((logp.isnan() | (logp > 0)).any()):
                raise ValueError(f"reference {name}: log-probabilities must be float32 and <= 0")
        if self.topk_logp.shape[1] > 1 and bool((self.topk_logp.diff(dim=1) > 0).any()):
            raise ValueError("reference topk_logp: each step's top-k must be sorted, most likely first")
        if bool((torch.logsumexp(self.topk_logp.double(), dim=1) > 1e-4).any()):
            raise ValueError("reference topk_logp: a step's top-k probabilities sum above 1")

    def tensors(self, prefix: str) -> dict[str, torch.Tensor]:
        return {f"{prefix}::{name}": getattr(self, name).contiguous() for name in _FIELDS}


_FIELDS = ("answer_ids", "topk_ids", "topk_logp", "gold_ids", "gold_logp")


def reference_from_logits(
    answer_ids: Sequence[int],
    logits: torch.Tensor,
    top_k: int,
    gold_ids: Sequence[int] = (),
    gold_logits: torch.Tensor | None = None,
) -> Reference:
    """Build a :class:`Reference` from the unpruned model's teacher-forced logits ``[T, vocab]``."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    top = torch.topk(logp, min(top_k, logp.shape[-1]), dim=-1)  # sorted: argmax first
    gold = torch.tensor(list(gold_ids), dtype=torch.long)
    gold_logp = torch.zeros(0, dtype=torch.float32)
    if gold.numel():
        if gold_logits is None:
            raise ValueError("gold ids given without their logits")
        gold_logp = _token_logp(gold_logits, gold)
    return Reference(
        answer_ids=torch.tensor(list(answer_ids), dtype=torch.long),
        topk_ids=top.indices.long(),
        topk_logp=top.values.float(),
        gold_ids=gold,
        gold_logp=gold_logp,
    )


def _token_logp(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``[T]`` log-probability of ``ids[t]`` under ``logits[t]``."""
    return torch.log_softmax(logits.float(), dim=-1).gather(1, ids[:, None]).squeeze(1)


@dataclass(frozen=True)
class ExampleDrift:
    """Drift of a pruned model on one example (see the module docstring)."""

    dataset: str
    record_id: str
    kl: float
    top1: float
    gold_delta: float | None
    tokens: int

    def __post_init__(self) -> None:
        if not (math.isfinite(self.kl) and self.kl >= 0.0):
            raise ValueError(f"{self.dataset}/{self.record_id}: KL = {self.kl} must be finite and >= 0")
        if not 0.0 <= self.top1 <= 1.0:
            raise ValueError(f"{self.dataset}/{self.record_id}: top-1 agreement {self.top1} outside [0, 1]")


def drift(reference: Reference, logits: torch.Tensor) -> tuple[float, float]:
    """``(mean KL(P || Q), top-1 agreement)`` of pruned logits ``[T, vocab]`` against ``reference``.

    KL uses the reference's top-``k`` tokens plus one "rest of the vocabulary" bucket (float64;
    :func:`tuner.evaluation.kl.topk_kl`).
    """
    if logits.shape[0] != reference.topk_ids.shape[0]:
        raise ValueError(f"{logits.shape[0]} rows of logits for a {reference.topk_ids.shape[0]}-token answer")
    return topk_kl(reference.topk_logp, reference.topk_ids, logits)


class ReferenceCache:
    """References per example key in one safetensors file (no pickle); rewritten atomically.

    The metadata holds the format, a checksum of every tensor (:func:`tuner.evaluation.integrity.tensors_digest`)
    and ``identity`` (what the references were computed from: the baseline cache's key, ``k``, gold);
    a file that fails any of these is rebuilt with one line, never trusted."""

    def __init__(self, path: Path, identity: str = "") -> None:
        self.path = path
        self.identity = identity
        self.entries: dict[str, Reference] = {}
        if path.exists():
            try:
                self.entries = _read(path, identity)
            except (SafetensorError, OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
                announce_rebuild(path, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
                self.entries = {}

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tensors: dict[str, torch.Tensor] = {}
        for key, ref in self.entries.items():
            tensors.update(ref.tensors(key))
        metadata = {"format": _FORMAT, "checksum": tensors_digest(tensors), "identity": self.identity}
        replace_with(self.path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))


def _read(path: Path, identity: str) -> dict[str, Reference]:
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata() or {}
    found = metadata.get("format")
    if found != _FORMAT:
        raise ValueError(f"format {found!r}, expected {_FORMAT!r}")
    if "checksum" not in metadata:
        raise ValueError("written without a checksum by an older version")
    if metadata.get("identity", "") != identity:
        raise ValueError(f"made for other inputs ({metadata.get('identity')!r}, expected {identity!r})")
    raw = load_file(str(path))
    if tensors_digest(raw) != metadata["checksum"]:
        raise ValueError("its checksum does not match its content")
    keys = {name.rsplit("::", 1)[0] for name in raw}
    return {k: Reference(**{f: raw[f"{k}::{f}"] for f in _FIELDS}) for k in keys}


def _prefix_in(prefixes: Mapping[str, PromptPrefix | None], example: Any) -> PromptPrefix | None:
    return prefixes[example.key]


class FidelityEvaluator:
    """Teacher-forced drift of pruned engines on an :class:`~tuner.evaluation.runner.Evaluator`'s examples.

    Args:
        evaluator: holds the model, tokenizer, examples and the baseline cache (answer ids).
        top_k: unpruned tokens kept per step for the KL.
        gold: also measure the change in gold-answer log-likelihood (a second pass per example).
        prefix_bytes: the memory its kept prefills may hold (None: ``prefix_share`` of the memory free
            on the model's device when the first is captured, so an evaluator built after another
            filled its own sees what is left).
        prefix_share: that share (a study with local workers divides it among them).
    """

    def __init__(
        self,
        evaluator: Any,
        *,
        top_k: int = DEFAULT_TOP_K,
        gold: bool = False,
        prefix_bytes: int | None = None,
        prefix_share: float = PREFIX_MEMORY_SHARE,
    ) -> None:
        if top_k < 1:
            raise ValueError(f"fidelity top_k = {top_k}: must be >= 1")
        if prefix_bytes is not None and prefix_bytes < 0:
            raise ValueError(
                f"prefix_bytes = {prefix_bytes}: must be >= 0 (or None for a share of free memory)"
            )
        if not 0 <= prefix_share <= 1:
            raise ValueError(f"prefix_share = {prefix_share}: must be in [0, 1]")
        self.evaluator = evaluator
        self.top_k = top_k
        self.gold = gold
        self._prefix_bytes = prefix_bytes
        self.prefix_share = prefix_share
        self.prefixes: dict[str, PromptPrefix | None] = {}  # None: over the memory cap, run in full
        base = evaluator.cache.path
        stem = base.name.removeprefix("baseline-").removesuffix(".json")
        name = f"{stem}-k{top_k}{'-gold' if gold else ''}"
        self.cache = ReferenceCache(base.with_name(f"fidelity-{name}.safetensors"), identity=name)
        layers = int(evaluator.model.config.num_hidden_layers)
        self.keep_all = LazyLLM(
            evaluator.model,
            Schedule.keep_all(model_name(evaluator.model), layers),
            tokenizer=evaluator.tokenizer,
            strict_model_name=False,
        )

    def adopt(self, other: FidelityEvaluator) -> int:
        """Take ``other``'s unpruned side (baseline answer, reference, kept prefix) for every example
        both evaluators hold with the same prompt and answer length, on the same model and settings:
        the calibration's examples begin with the search's, which need not be computed again. Returns
        how many examples were adopted."""
        same_settings = (other.top_k, other.gold) == (self.top_k, self.gold)
        if other.evaluator.model is not self.evaluator.model or not same_settings:
            return 0
        theirs = {ex.key: ex for ex in other.evaluator.examples}
        adopted = 0
        for ex in self.evaluator.examples:
            twin = theirs.get(ex.key)
            if twin is None or (twin.input_ids, twin.max_new_tokens, twin.stop_strings) != (
                ex.input_ids, ex.max_new_tokens, ex.stop_strings,
            ):  # fmt: skip
                continue
            base = other.evaluator.cache.entries.get(ex.key)
            if base is None or ex.key in self.evaluator.cache.entries:
                continue
            self.evaluator.cache.entries[ex.key] = base
            if ex.key in other.cache.entries and ex.key not in self.cache.entries:
                self.cache.entries[ex.key] = other.cache.entries[ex.key]
            if other.prefixes.get(ex.key) is not None and ex.key not in self.prefixes:
                self.prefixes[ex.key] = other.prefixes[ex.key]
            adopted += 1
        return adopted

    def gold_ids(self, example: Any) -> list[int]:
        if not self.gold or not example.answers:
            return []
        ids: list[int] = self.evaluator.tokenizer(example.answers[0], add_special_tokens=False)["input_ids"]
        return ids[: example.max_new_tokens]

    def references(self) -> dict[str, Reference]:
        """The unpruned side per example key (computed once, then read from the cache). Examples with
        neither a baseline answer nor a reference get both from one unpruned prefill
        (:meth:`_unpruned_together`); the others are forced along their cached baseline answer."""
        return self._references_of(self.evaluator.examples, self.prefix, progress=self.evaluator.progress)

    def _references_of(
        self, examples: Sequence[Any], prefix_of: Callable[[Any], PromptPrefix | None], *, progress: bool
    ) -> dict[str, Reference]:
        """:meth:`references` of ``examples``, each prompt's unpruned prefill from ``prefix_of`` (None:
        captured for the pass that needs it)."""
        self._unpruned_together(examples, prefix_of, progress=progress)
        base = self.evaluator.baseline(examples)
        stale = [
            ex.key
            for ex in examples
            if ex.key in self.cache.entries
            and not self._matches(self.cache.entries[ex.key], base[ex.key], ex)
        ]
        if stale:  # forced along another answer than the baseline's: recomputed, never mixed
            announce_rebuild(
                self.cache.path, f"{len(stale)} reference(s) not forced along the current baseline"
            )
            for key in stale:
                del self.cache.entries[key]
        missing = [ex for ex in examples if ex.key not in self.cache.entries]
        for ex in tqdm(missing, desc="fidelity reference", disable=not progress or not missing):
            answer = list(base[ex.key].token_ids)
            prefix = prefix_of(ex)  # captured here once: the trials start from it too
            logits = forced_logits(self.keep_all, ex.input_ids, answer, prefix)
            gold = self.gold_ids(ex)
            gold_logits = forced_logits(self.keep_all, ex.input_ids, gold, prefix) if gold else None
            self.cache.entries[ex.key] = reference_from_logits(answer, logits, self.top_k, gold, gold_logits)
            self.cache.save()
        return {ex.key: self.cache.entries[ex.key] for ex in examples}

    def _unpruned_together(
        self, examples: Sequence[Any], prefix_of: Callable[[Any], PromptPrefix | None], *, progress: bool
    ) -> None:
        """Baseline answers and references of the ``examples`` that lack both: per example the
        unpruned prefix (``prefix_of``, else captured for this pass) is computed once, the baseline's
        answer resumes from it (its last layer, then decoding, batched across examples) and is
        teacher-forced from that same prefill: one unpruned prefill instead of three, the same answers
        and logits."""
        ev = self.evaluator
        todo = [ex for ex in examples if ex.key not in ev.cache.entries and ex.key not in self.cache.entries]
        with tqdm(total=len(todo), desc="baseline and reference", disable=not progress or not todo) as bar:
            for chunk in chunks(todo, DEFAULT_BATCH_SIZE):
                prefixes = [
                    prefix_of(ex) or self.keep_all.capture_prefix(torch.as_tensor(ex.input_ids))
                    for ex in chunk
                ]
                runs = [(self.keep_all, ex, prefix) for ex, prefix in zip(chunk, prefixes)]
                for ex, prefix, result in zip(chunk, prefixes, run_examples(runs, force_own=True)):
                    assert result.forced_logits is not None
                    ev.record_baseline(ex, result)
                    answer = list(result.token_ids)
                    gold = self.gold_ids(ex)
                    gold_logits = forced_logits(self.keep_all, ex.input_ids, gold, prefix) if gold else None
                    self.cache.entries[ex.key] = reference_from_logits(
                        answer, result.forced_logits, self.top_k, gold, gold_logits
                    )
                ev.cache.save()
                self.cache.save()
                bar.update(len(chunk))

    def _matches(self, ref: Reference, entry: Any, example: Any) -> bool:
        """``ref`` was forced along ``entry``'s answer (and ``example``'s gold answer, if measured)."""
        vocab = int(self.evaluator.model.config.vocab_size)
        return (
            ref.answer_ids.tolist() == list(entry.token_ids)
            and ref.gold_ids.tolist() == self.gold_ids(example)
            and (ref.topk_ids.numel() == 0 or int(ref.topk_ids.max()) < vocab)
            and ref.topk_ids.shape[1] == min(self.top_k, vocab)
        )

    @property
    def prefix_bytes(self) -> int:
        """The memory the kept prefills may hold (fixed on first use when given as a share)."""
        if self._prefix_bytes is None:
            device = next(self.evaluator.model.parameters()).device
            self._prefix_bytes = int(self.prefix_share * free_memory_bytes(device))
        return self._prefix_bytes

    def prefix(self, example: Any) -> PromptPrefix | None:
        """The unpruned prefill of ``example``'s prompt (captured once, while within ``prefix_bytes``)."""
        if example.key not in self.prefixes:
            used = sum(p.nbytes for p in self.prefixes.values() if p is not None)
            last = next((p for p in reversed(self.prefixes.values()) if p is not None), None)
            size = None if last is None else last.nbytes * len(example.input_ids) / last.ids.shape[1]
            if self.prefix_bytes == 0 or (size is not None and used + size > self.prefix_bytes):
                self.prefixes[example.key] = None  # no capture: it would be dropped
            else:
                captured = self.keep_all.capture_prefix(torch.as_tensor(example.input_ids))
                fits = used + captured.nbytes <= self.prefix_bytes
                self.prefixes[example.key] = captured if fits else None
        return self.prefixes[example.key]

    def example_drift(self, engine: LazyLLM, example: Any, ref: Reference) -> ExampleDrift:
        """``engine``'s drift on ``example`` against its reference ``ref`` (from the cached prefix if any)."""
        return self.drift_from(engine, example, ref, self.prefix(example))

    def drift_from(
        self,
        engine: LazyLLM,
        example: Any,
        ref: Reference,
        prefix: PromptPrefix | None,
        logits: torch.Tensor | None = None,
    ) -> ExampleDrift:
        """:meth:`example_drift` with the prompt's ``prefix`` given (None: the whole prefill), and the
        forced logits along the reference's answer when already computed (``logits``)."""
        if logits is None:
            logits = forced_logits(engine, example.input_ids, ref.answer_ids.tolist(), prefix)
        kl, top1 = drift(ref, logits)
        gold_delta = None
        if ref.gold_ids.numel():
            pruned = _token_logp(
                forced_logits(engine, example.input_ids, ref.gold_ids.tolist(), prefix), ref.gold_ids
            )
            gold_delta = float(ref.gold_logp.double().mean() - pruned.double().mean())
        return ExampleDrift(
            example.dataset, example.record_id, kl, top1, gold_delta, int(ref.answer_ids.shape[0])
        )

    def score_together(
        self, engines: Mapping[int, LazyLLM], *, kl: bool, desc: str = "task score"
    ) -> dict[int, tuple[list[ExampleResult], list[ExampleDrift]]]:
        """Every engine's task-scored answers and, with ``kl``, its drift, a chunk of examples at a
        time. Each prompt's unpruned prefix is taken from the cache or captured; what the study lacks
        of the unpruned side (the baseline answer, and with ``kl`` the reference) is computed from it;
        every engine's prefill (answer and teacher-forced pass) resumes from it, and the chunk's
        answers of every engine decode together: the same answers and KLs as one engine and one
        example at a time, with one unpruned prefill per example for everything. Prefixes captured
        here are dropped after their chunk, whose size keeps them within ``prefix_bytes`` (one at
        least); a prefix is captured only where the unpruned side is missing or at least
        :data:`RESUMES_PER_CAPTURE` passes resume from it (a capture costs about one unpruned prefill,
        a resumed pass saves the layers before its first prune). The results' TTFTs leave out the
        prefix's layers: no timing (:mod:`tuner.statistics.speed` times).
        """
        ev = self.evaluator
        worth = len(engines) * (2 if kl else 1) >= RESUMES_PER_CAPTURE
        out: dict[int, tuple[list[ExampleResult], list[ExampleDrift]]] = {n: ([], []) for n in engines}
        examples = list(ev.examples)
        with tqdm(total=len(examples), desc=desc, disable=not ev.progress, leave=False) as bar:
            done, size = 0, 1  # the first chunk measures a prefix's size
            while done < len(examples):
                chunk = examples[done : done + size]
                prefixes = {ex.key: self._chunk_prefix(ex, worth, kl) for ex in chunk}
                size = self._chunk_size(prefixes.values())
                prefix_of = functools.partial(_prefix_in, prefixes)
                refs: dict[str, Reference] = {}
                if kl:
                    refs = self._references_of(chunk, prefix_of, progress=False)
                else:
                    ev.baseline(chunk, resume=(self.keep_all, prefix_of))
                runs = [(engine, ex, prefixes[ex.key]) for ex in chunk for engine in engines.values()]
                along = (
                    [tuple(refs[ex.key].answer_ids.tolist()) for ex in chunk for _ in engines] if kl else None
                )
                answers = iter(run_examples(runs, forced=along, batch_size=max(len(runs), 1)))
                for ex in chunk:
                    for (number, engine), answer in zip(engines.items(), answers):
                        results, drifts = out[number]
                        results.append(result_of("lazyllm", ex, answer, ev.unpruned(ex)))
                        if kl:
                            drift = self.drift_from(
                                engine, ex, refs[ex.key], prefixes[ex.key], answer.forced_logits
                            )
                            drifts.append(drift)
                done += len(chunk)
                bar.update(len(chunk))
        return out

    def _chunk_prefix(self, example: Any, worth: bool, kl: bool) -> PromptPrefix | None:
        """The unpruned prefix :meth:`score_together` resumes ``example`` from: the kept one, else one
        captured for its chunk where it pays (the unpruned side is missing, or ``worth``)."""
        kept = self.prefixes.get(example.key)
        if kept is not None:
            return kept
        missing = example.key not in self.evaluator.cache.entries or (
            kl and example.key not in self.cache.entries
        )
        return self.keep_all.capture_prefix(torch.as_tensor(example.input_ids)) if missing or worth else None

    def _chunk_size(self, prefixes: Iterable[PromptPrefix | None]) -> int:
        """Examples per chunk of :meth:`score_together`: as many prefixes as fit in ``prefix_bytes``
        beside the kept ones (one at least, at most a decoding batch)."""
        sizes = [p.nbytes for p in prefixes if p is not None]
        if not sizes:
            return DEFAULT_BATCH_SIZE
        used = sum(p.nbytes for p in self.prefixes.values() if p is not None)
        return max(1, min(DEFAULT_BATCH_SIZE, (self.prefix_bytes - used) // max(sizes)))

    def evaluate(
        self,
        engine: LazyLLM,
        *,
        should_stop: Callable[[list[ExampleDrift]], str | None] | None = None,
        desc: str = "fidelity",
    ) -> tuple[list[ExampleDrift], str | None]:
        """Drift of ``engine`` on every example (stopping early if ``should_stop`` gives a reason)."""
        refs = self.references()
        out: list[ExampleDrift] = []
        bar = tqdm(self.evaluator.examples, desc=desc, disable=not self.evaluator.progress, leave=False)
        for ex in bar:
            out.append(self.example_drift(engine, ex, refs[ex.key]))
            if should_stop is not None:
                reason = should_stop(out)
                if reason:
                    return out, reason
        return out, None
