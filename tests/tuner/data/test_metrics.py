"""LongBench metrics: exact values worked out by hand from LongBench's definitions."""

from __future__ import annotations

import pytest

from tuner.data.metrics import (
    METRICS,
    classification_score,
    code_sim_score,
    count_score,
    cut_first_line,
    get_metric,
    normalize_answer,
    normalize_zh_answer,
    qa_f1_score,
    qa_f1_zh_score,
    retrieval_score,
    retrieval_zh_score,
    rouge_score,
    rouge_zh_score,
    score_example,
    task_score,
)

EXACT = 1e-12  # relative tolerance: only float rounding, nothing else


def f_rouge(p: float, r: float) -> float:
    """The ``rouge`` package's F: 2PR / (P + R + 1e-8)."""
    return 2.0 * (p * r) / (p + r + 1e-8)


# --------------------------------------------------------------------------------------------------
# normalization
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The  Cat, sat on A mat!", "cat sat on mat"),  # case, punctuation, articles, spaces
        ("an apple's the-end", "apples theend"),  # punctuation goes first, so "the-end" is one word
        ("Anthem", "anthem"),  # "an" only as a whole word
        ("café—bar", "café—bar"),  # non-ASCII punctuation is kept
        ("  ", ""),
    ],
)
def test_normalize_answer(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


def test_normalize_zh_answer() -> None:
    assert normalize_zh_answer("北京。 ABC") == "北京abc"
    assert normalize_zh_answer("《书名》") == "《书名"  # LongBench's set has "》" but not "《"
    assert normalize_zh_answer("“你好”，!") == "你好"


# --------------------------------------------------------------------------------------------------
# token F1
@pytest.mark.parametrize(
    ("pred", "gt"),
    [
        ("the cat sat", "a cat sat down"),  # "cat sat" vs "cat sat down": P = 2/2, R = 2/3
        ("New York City", "new york"),  # P = 2/3, R = 2/2
    ],
)
def test_qa_f1_eight_tenths(pred: str, gt: str) -> None:
    # F1 = 2 * P * R / (P + R) = 2 * 1 * (2/3) / (5/3) = 4/5
    assert qa_f1_score(pred, gt) == pytest.approx(0.8, rel=EXACT)
    assert qa_f1_score(gt, pred) == pytest.approx(0.8, rel=EXACT)  # F1 is symmetric


def test_qa_f1_cases() -> None:
    assert qa_f1_score("cat cat dog", "cat") == pytest.approx(
        0.5, rel=EXACT
    )  # overlap min(2, 1) = 1: P 1/3, R 1
    assert qa_f1_score("Paris!", "paris") == 1.0
    assert qa_f1_score("dog", "cat") == 0.0
    assert qa_f1_score("", "cat") == 0.0
    assert qa_f1_score("the", "a") == 0.0  # both normalize to no tokens: no overlap -> 0
    # P = 2/4, R = 2/6 -> F1 = 2 * (1/2) * (1/3) / (5/6) = 2/5
    assert qa_f1_score("w x y z", "y z p q r s") == pytest.approx(0.4, rel=EXACT)
    # the article "a" is dropped: "b c" vs "b c": 1
    assert qa_f1_score("a b c", "b c") == 1.0


def test_qa_f1_zh() -> None:
    # jieba: 我/爱/北京 vs 北京 -> P 1/3, R 1 -> F1 1/2
    assert qa_f1_zh_score("我爱北京", "北京") == pytest.approx(0.5, rel=EXACT)
    assert qa_f1_zh_score("北京。", "北京") == 1.0  # the "。" token normalizes to "" and is dropped
    assert qa_f1_zh_score("中国的首都是北京", "北京是中国的首都") == 1.0  # same tokens, any order
    assert qa_f1_zh_score("", "北京") == 0.0


# --------------------------------------------------------------------------------------------------
# ROUGE-L (the `rouge` package: distinct words, summary-level union LCS, sentences split on ".")
def test_rouge_l_by_hand() -> None:
    # LCS(a b c d, a c d e f) = a c d: 3 words; 5 distinct gt words, 4 distinct pred words
    assert rouge_score("a b c d", "a c d e f") == pytest.approx(f_rouge(3 / 4, 3 / 5), rel=EXACT)
    # LCS = "the cat on the mat", but words are counted as a set: {the, cat, on, mat} = 4 of 5 distinct
    assert rouge_score("the cat sat on the mat", "the cat lay on the mat") == pytest.approx(
        f_rouge(4 / 5, 4 / 5), rel=EXACT
    )
    # two pred sentences: LCS with "a d" is "a" from the first and "d" from the second: union 2
    assert rouge_score("a b. c d", "a d") == pytest.approx(f_rouge(2 / 4, 2 / 2), rel=EXACT)
    assert rouge_score("hello world", "hello world") == pytest.approx(f_rouge(1.0, 1.0), rel=EXACT)
    assert rouge_score("hello world", "hello world") < 1.0  # the 1e-8 in the denominator


def test_rouge_failures_score_zero() -> None:
    assert rouge_score("", "a reference") == 0.0  # "Hypothesis is empty" -> 0
    assert rouge_score("...", "a reference") == 0.0  # no sentence left after splitting on "."
    assert rouge_score("a prediction", "") == 0.0
    assert rouge_score("x y", "a b") == 0.0  # no overlap


def test_rouge_zh() -> None:
    # "我 爱 北京" vs "北京": LCS 1, 3 pred words, 1 gt word
    assert rouge_zh_score("我爱北京", "北京") == pytest.approx(f_rouge(1 / 3, 1.0), rel=EXACT)
    assert rouge_zh_score("", "北京") == 0.0


# --------------------------------------------------------------------------------------------------
# classification
CLASSES = ["City", "Country", "Other location"]


def test_classification_basic() -> None:
    assert classification_score("City", "City", CLASSES) == 1.0
    assert classification_score("City or Country", "City", CLASSES) == 0.5  # two matches: 1/2
    assert classification_score("City, Country or Other location", "City", CLASSES) == pytest.approx(1 / 3)
    assert classification_score("Country", "City", CLASSES) == 0.0
    assert classification_score("", "City", CLASSES) == 0.0
    assert classification_score("city", "City", CLASSES) == 0.0  # case-sensitive substring match


def test_classification_drops_proper_substrings_of_gt() -> None:
    classes = ["location", "Other location"]
    # "location" is in gt but is not gt: dropped, so the score is 1, not 1/2
    assert classification_score("Other location", "Other location", classes) == 1.0
    # the only match is dropped: nothing left, gt not matched
    assert classification_score("location", "Other location", classes) == 0.0


def test_classification_keeps_longbench_removal_quirk() -> None:
    # matches = [Other, location, Other location]; LongBench removes "Other" while iterating, which
    # shifts "location" into the slot already visited, so it is never checked and survives: 1/2, not 1
    classes = ["Other", "location", "Other location"]
    assert classification_score("Other location", "Other location", classes) == 0.5


def test_classification_needs_classes() -> None:
    with pytest.raises(ValueError, match="all_classes"):
        classification_score("City", "City", None)


# --------------------------------------------------------------------------------------------------
# retrieval and count
def test_retrieval() -> None:
    assert retrieval_score("Paragraph 3", "Paragraph 3") == 1.0
    assert retrieval_score("Paragraph 3, not Paragraph 12", "Paragraph 3") == 0.5
    assert retrieval_score("3 3 30", "Paragraph 3") == pytest.approx(2 / 3, rel=EXACT)
    assert retrieval_score("no idea", "Paragraph 3") == 0.0  # no digits at all
    assert retrieval_score("", "Paragraph 3") == 0.0
    with pytest.raises(ValueError, match="no paragraph id"):
        retrieval_score("3", "3")


def test_retrieval_zh() -> None:
    assert retrieval_zh_score("段落5", "段落5") == 1.0
    assert retrieval_zh_score("答案是段落5或段落6", "段落5") == 0.5
    assert retrieval_zh_score("Paragraph 5", "段落5") == 1.0  # only the numbers in pred count
    assert retrieval_zh_score("不知道", "段落5") == 0.0


def test_count() -> None:
    assert count_score("12", "12") == 1.0
    assert count_score("12 or 13", "12") == 0.5
    assert count_score("there are twelve", "12") == 0.0  # no digits
    assert count_score("012", "12") == 0.0  # compared as digit strings
    assert count_score("1234", "12") == 0.0  # \d+ is greedy: one number, 1234


# --------------------------------------------------------------------------------------------------
# code
def test_code_sim_first_code_line() -> None:
    # leading newlines stripped; lines with ``` / # / // are skipped
    assert code_sim_score("```python\n# comment\nx = 1\n", "x = 1") == 1.0
    # "return a + b;" (13) vs "return a+b;" (11): indel distance 2, ratio 22/24 = 91.67 -> 92
    assert code_sim_score("\n\n// add\nreturn a + b;\nfoo()", "return a+b;") == 0.92
    # a line with an inline comment is skipped too: the next line is used
    assert code_sim_score("y = 2  # set y\nx = 1", "x = 1") == 1.0


def test_code_sim_integer_ratio() -> None:
    assert code_sim_score("abc", "abd") == 0.67  # 4/6 = 66.67 -> 67
    # "abcdefgh" vs "abcdeXYZ": LCS 5, 16 chars, ratio 10/16 = 62.5 -> Python round -> 62 (not 63)
    assert code_sim_score("abcdefgh", "abcdeXYZ") == 0.62
    assert code_sim_score("# only\n// comments\n```", "x = 1") == 0.0  # no code line: "" vs gt
    assert code_sim_score("", "") == 1.0  # fuzzywuzzy: equal strings give 100


# --------------------------------------------------------------------------------------------------
# registry, per-example scoring, task score
def test_registry_names() -> None:
    assert set(METRICS) == {
        "qa_f1",
        "qa_f1_zh",
        "rouge",
        "rouge_zh",
        "classification",
        "retrieval",
        "retrieval_zh",
        "count",
        "code_sim",
    }
    assert METRICS["qa_f1"]("the cat sat", "a cat sat down", None) == pytest.approx(0.8, rel=EXACT)
    assert METRICS["classification"]("City or Country", "City", CLASSES) == 0.5


def test_unknown_metric_lists_names() -> None:
    with pytest.raises(ValueError, match=r"Unknown metric 'bleu'\. Available: qa_f1, qa_f1_zh, rouge"):
        get_metric("bleu")
    with pytest.raises(ValueError, match="Unknown metric"):
        score_example("bleu", "x", ["x"], None, first_line=False)


def test_first_line_cut() -> None:
    assert cut_first_line("\n\nLocation\nQuestion: where?") == "Location"
    assert cut_first_line("  a\nb") == "  a"  # only newlines are stripped
    assert cut_first_line("") == ""
    # trec-like: the second line would add a match (1/2) without the cut
    pred = "\nCity\nCountry"
    assert score_example("classification", pred, ["City"], CLASSES, first_line=True) == 1.0
    assert score_example("classification", pred, ["City"], CLASSES, first_line=False) == 0.5
    # triviaqa-like
    assert score_example("qa_f1", "\n\nParis\nQuestion: x", ["Paris"], None, first_line=True) == 1.0
    assert score_example("qa_f1", "\n\nParis\nQuestion: x", ["Paris"], None, first_line=False) == 0.5


def test_score_example_max_over_answers() -> None:
    assert score_example("qa_f1", "cat sat", ["dog", "the cat sat down", "cat sat"], None, False) == 1.0
    assert score_example("qa_f1", "cat sat", ["dog", "cat sat down"], None, False) == pytest.approx(0.8)
    assert score_example("count", "7", ["6", "8"], None, False) == 0.0
    with pytest.raises(ValueError, match="answers"):
        score_example("qa_f1", "x", [], None, False)


def test_task_score() -> None:
    assert task_score([1.0, 0.5, 0.0]) == 50.0
    assert task_score([1 / 3]) == 33.33
    assert task_score([2 / 3]) == 66.67
    assert task_score([0.1, 0.1, 0.1]) == 10.0
    assert task_score([0.0]) == 0.0
    with pytest.raises(ValueError, match="at least one"):
        task_score([])
