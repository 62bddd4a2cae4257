"""LongBench v1 metrics, re-implemented to give the same numbers as LongBench's own ``metrics.py``.

Every function here follows the definition in THUDM/LongBench ``LongBench/metrics.py`` and the scoring
loop of ``LongBench/eval.py``, quirks included, so that task scores stay comparable with published
LongBench numbers. The third-party libraries are the ones LongBench uses, or an exact substitute:

* ``jieba`` (precise mode, ``cut_all=False``) segments Chinese text for ``qa_f1_zh`` and ``rouge_zh``;
* the ``rouge`` package (pltrdy) computes ROUGE-L F for ``rouge`` and ``rouge_zh``;
* ``rapidfuzz`` replaces ``fuzzywuzzy`` + ``python-Levenshtein`` for ``code_sim`` (same integer ratio,
  see :func:`code_sim_score`).

Each metric maps one prediction and one ground-truth answer to a score in ``[0, 1]``;
:func:`score_example` takes the max over a record's answers and :func:`task_score` turns per-record
scores into the LongBench task score (a percentage with two decimals).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence

import jieba
from rapidfuzz import fuzz
from rouge import Rouge

MetricFn = Callable[[str, str, list[str] | None], float]
"""``(prediction, ground_truth, all_classes) -> score in [0, 1]``; ``all_classes`` is only read by
``classification``."""

_EN_PUNCTUATION = frozenset(string.punctuation)
# LongBench's Chinese punctuation set (full-width forms, CJK brackets and quotes, dashes, ellipsis); note
# that it has the closing "》" but not the opening "《" -- kept as is so that scores stay comparable.
_ZH_PUNCTUATION = frozenset(
    _EN_PUNCTUATION
    | set(
        "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣､、〃》「」『』【】〔〕〖〗〘〙〚〛"
    )
    | set("〜〝〞〟〰〾〿–—‘’‛“”„‟…‧﹏.")
)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_NUMBER = re.compile(r"\d+")
_PARAGRAPH_EN = re.compile(r"Paragraph (\d+)")
_PARAGRAPH_ZH = re.compile(r"段落(\d+)")


# --------------------------------------------------------------------------------------------------
# normalization and token F1
def normalize_answer(s: str) -> str:
    """SQuAD-style English normalization: lowercase, drop ASCII punctuation, replace the whole words
    a/an/the by a space, collapse whitespace (in that order).

    >>> normalize_answer("The  Cat, sat on A mat!")
    'cat sat on mat'
    """
    text = "".join(ch for ch in s.lower() if ch not in _EN_PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def normalize_zh_answer(s: str) -> str:
    """Chinese normalization of one token: lowercase, drop English and Chinese punctuation, remove all
    whitespace.

    >>> normalize_zh_answer("北京。 ABC")
    '北京abc'
    """
    text = "".join(ch for ch in s.lower() if ch not in _ZH_PUNCTUATION)
    return "".join(text.split())


def _token_f1(prediction: Sequence[str], ground_truth: Sequence[str]) -> float:
    """Token-level F1 with multiset overlap; 0 when nothing overlaps (including empty inputs)."""
    overlap = sum((Counter(prediction) & Counter(ground_truth)).values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(prediction)
    recall = overlap / len(ground_truth)
    return (2 * precision * recall) / (precision + recall)


def qa_f1_score(prediction: str, ground_truth: str) -> float:
    """F1 over the whitespace tokens of the normalized prediction and answer (:func:`normalize_answer`).

    >>> qa_f1_score("the cat sat", "a cat sat down")  # P = 2/2, R = 2/3
    0.8
    """
    return _token_f1(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def _zh_tokens(text: str) -> list[str]:
    tokens = (normalize_zh_answer(token) for token in jieba.cut(text, cut_all=False))
    return [token for token in tokens if token]


def qa_f1_zh_score(prediction: str, ground_truth: str) -> float:
    """F1 over jieba tokens, each normalized by :func:`normalize_zh_answer`; empty tokens are dropped."""
    return _token_f1(_zh_tokens(prediction), _zh_tokens(ground_truth))


# --------------------------------------------------------------------------------------------------
# ROUGE-L
def rouge_score(prediction: str, ground_truth: str) -> float:
    """ROUGE-L F from the ``rouge`` package: ``Rouge().get_scores([pred], [gt], avg=True)["rouge-l"]["f"]``.

    That implementation splits both texts into sentences on ".", counts *distinct* words, uses the
    summary-level union LCS and ``F = 2PR / (P + R + 1e-8)``. Any exception gives 0.0, as in LongBench:
    an empty text, and also a sentence pair too long for the package's recursive LCS (RecursionError).
    """
    try:
        scores = Rouge().get_scores([prediction], [ground_truth], avg=True)
    except Exception:  # LongBench uses a bare ``except``: every failure scores 0
        return 0.0
    return float(scores["rouge-l"]["f"])


def rouge_zh_score(prediction: str, ground_truth: str) -> float:
    """:func:`rouge_score` on jieba tokens joined by single spaces."""
    pred = " ".join(jieba.cut(prediction, cut_all=False))
    gt = " ".join(jieba.cut(ground_truth, cut_all=False))
    return rouge_score(pred, gt)


# --------------------------------------------------------------------------------------------------
# classification, retrieval, counting
def classification_score(prediction: str, ground_truth: str, all_classes: Sequence[str] | None) -> float:
    """Few-shot classification (trec, lsht): ``1 / len(matches)`` if ``ground_truth`` is matched, else 0.

    ``matches`` = the classes (in ``all_classes`` order) that occur as substrings of ``prediction``,
    minus those that are substrings of ``ground_truth`` without being equal to it.

    LongBench removes those from the list *while iterating over it*, so the entry right after each
    removed one is never examined and survives even if it should have been dropped. We walk the list
    the same way (index ``i`` advances after every step, removal shifts the rest left) to keep the
    scores identical; it only matters when two such entries are adjacent in ``matches``.

    >>> classification_score("Other location or City", "City", ["City", "Other location"])
    0.5
    """
    if all_classes is None:
        raise ValueError("all_classes = None: classification needs the record's list of class names")
    matches = [name for name in all_classes if name in prediction]
    i = 0
    while i < len(matches):
        term = matches[i]
        if term in ground_truth and term != ground_truth:
            matches.remove(term)  # removes the first equal entry, as list.remove does in LongBench
        i += 1
    if ground_truth in matches:
        return 1.0 / len(matches)
    return 0.0


def _share_equal(prediction: str, target: str) -> float:
    """Share of the ``\\d+`` numbers in ``prediction`` that equal the string ``target`` (0 if none)."""
    numbers = _NUMBER.findall(prediction)
    if not numbers:
        return 0.0
    return sum(number == target for number in numbers) / len(numbers)


def _paragraph_id(pattern: re.Pattern[str], ground_truth: str) -> str:
    found = pattern.search(ground_truth)
    if found is None:
        raise ValueError(
            f"ground truth {ground_truth!r} has no paragraph id matching {pattern.pattern!r}; "
            "is this a passage_retrieval answer?"
        )
    return found.group(1)


def retrieval_score(prediction: str, ground_truth: str) -> float:
    """passage_retrieval_en: the share of numbers in ``prediction`` equal to N of "Paragraph N" in gt.

    >>> retrieval_score("Paragraph 3, not Paragraph 12", "Paragraph 3")
    0.5
    """
    return _share_equal(prediction, _paragraph_id(_PARAGRAPH_EN, ground_truth))


def retrieval_zh_score(prediction: str, ground_truth: str) -> float:
    """passage_retrieval_zh: as :func:`retrieval_score`, with the answer pattern "段落N"."""
    return _share_equal(prediction, _paragraph_id(_PARAGRAPH_ZH, ground_truth))


def count_score(prediction: str, ground_truth: str) -> float:
    """passage_count: the share of numbers in ``prediction`` whose digits equal ``ground_truth`` exactly.

    >>> count_score("12 or 13", "12")
    0.5
    """
    return _share_equal(prediction, ground_truth)


# --------------------------------------------------------------------------------------------------
# code
def code_sim_score(prediction: str, ground_truth: str) -> float:
    """lcc / repobench-p: edit similarity of the first code line of the prediction with the answer.

    The line used is the first line of ``prediction.lstrip("\\n")`` containing none of "`", "#", "//"
    ("" if there is none). LongBench scores it with ``fuzzywuzzy.fuzz.ratio(line, gt) / 100``, an
    *integer* percentage. ``round(rapidfuzz.fuzz.ratio(...))`` gives the same integer as fuzzywuzzy
    with python-Levenshtein >= 0.20 (whose ``ratio`` is rapidfuzz's Indel normalized similarity, and
    fuzzywuzzy rounds with Python's ``round``); fuzzywuzzy's special cases also agree (equal strings
    give 100, one empty string gives 0). The old C python-Levenshtein (< 0.20) could differ by one point
    when the exact ratio ends in .5.

    >>> code_sim_score("```python\\n# comment\\nx = 1\\n", "x = 1")
    1.0
    """
    line = ""
    for candidate in prediction.lstrip("\n").split("\n"):
        if "`" not in candidate and "#" not in candidate and "//" not in candidate:
            line = candidate
            break
    return round(fuzz.ratio(line, ground_truth)) / 100


# --------------------------------------------------------------------------------------------------
# registry and scoring
def _without_classes(fn: Callable[[str, str], float]) -> MetricFn:
    def metric(prediction: str, ground_truth: str, all_classes: list[str] | None) -> float:
        return fn(prediction, ground_truth)

    metric.__name__ = fn.__name__
    metric.__doc__ = fn.__doc__
    return metric


METRICS: dict[str, MetricFn] = {
    "qa_f1": _without_classes(qa_f1_score),
    "qa_f1_zh": _without_classes(qa_f1_zh_score),
    "rouge": _without_classes(rouge_score),
    "rouge_zh": _without_classes(rouge_zh_score),
    "classification": classification_score,
    "retrieval": _without_classes(retrieval_score),
    "retrieval_zh": _without_classes(retrieval_zh_score),
    "count": _without_classes(count_score),
    "code_sim": _without_classes(code_sim_score),
}
"""Metric name -> ``fn(prediction, ground_truth, all_classes)``; the names used by ``DatasetSpec.metric``."""


def get_metric(name: str) -> MetricFn:
    """The metric registered as ``name``; an unknown name is a ``ValueError`` listing the valid ones."""
    try:
        return METRICS[name]
    except KeyError:
        raise ValueError(f"Unknown metric {name!r}. Available: {', '.join(METRICS)}") from None


def cut_first_line(prediction: str) -> str:
    """LongBench's cut for trec, triviaqa, samsum and lsht: the first line after leading newlines.

    >>> cut_first_line("\\n\\nLocation\\nQuestion: ...")
    'Location'
    """
    return prediction.lstrip("\n").split("\n")[0]


def score_example(
    metric: str,
    prediction: str,
    answers: Sequence[str],
    all_classes: list[str] | None,
    first_line: bool,
) -> float:
    """Score one prediction as LongBench's ``eval.py`` does: the best score over all ``answers``.

    Args:
        metric: a :data:`METRICS` name.
        prediction: the generated text (the continuation only, without the prompt).
        answers: the record's ground-truth answers (at least one).
        all_classes: the record's class names (classification only; None elsewhere).
        first_line: cut ``prediction`` to its first line first (see :func:`cut_first_line`).
    """
    fn = get_metric(metric)
    if isinstance(answers, str) or not answers:
        raise ValueError(f"answers = {answers!r}: need a non-empty list of ground-truth strings")
    if first_line:
        prediction = cut_first_line(prediction)
    best = 0.0
    for ground_truth in answers:
        best = max(best, fn(prediction, ground_truth, all_classes))
    return best


def agreement_score(metric: str, prediction: str, reference: str) -> float:
    """The score of ``prediction`` against ``reference``, the unpruned model's own answer (a prompts
    file without gold answers): the metric with ``reference`` as the one ground truth, and 1 where
    the two are the same text (an answer agrees fully with itself, even one the metric scores 0 such
    as an empty answer under ``qa_f1``). So the unpruned model scores 1 on every prompt, and a
    schedule's loss is 100 x (1 - mean agreement): agreement points.

    >>> agreement_score("qa_f1", "Paris, France", "Paris")
    0.6666666666666666
    >>> agreement_score("qa_f1", "", "")
    1.0
    """
    if prediction.strip() == reference.strip():
        return 1.0
    return get_metric(metric)(prediction, reference, None)


def task_score(scores: Sequence[float]) -> float:
    """LongBench task score: ``round(100 * mean(scores), 2)``.

    The sum is accumulated left to right in plain floats, as LongBench does (Python >= 3.12's ``sum``
    uses compensated summation, which can differ in the last bit and hence in the rounding).

    >>> task_score([1.0, 0.5, 0.0])
    50.0
    """
    if not scores:
        raise ValueError("scores = []: need at least one per-record score to average")
    total = 0.0
    for score in scores:
        total += score
    return round(100 * total / len(scores), 2)
