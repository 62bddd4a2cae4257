"""The stages a study runs, in order, each with typed inputs and outputs:

trial (:mod:`.trial`: a proposal -> a :class:`~tuner.study.records.TrialRecord`) -> front (:mod:`.front`:
records -> the non-dominated and feasible ones) -> confirmation (:mod:`.confirm`: the feasible front
-> a confirmed recommendation) -> held-out check (:mod:`.heldout`: the recommendation against
hand-made schedules on test). :mod:`tuner.stages.outcome` gathers their outputs into one
:class:`~tuner.stages.outcome.StudyOutcome`, from which :mod:`tuner.report` writes every file once.
"""
