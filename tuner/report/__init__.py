"""Everything a person reads about a study, drawn from one :class:`~tuner.study.outcome.StudyOutcome`:
:mod:`.files` (schedules, tables, JSON), :mod:`.plots` (figures) and :mod:`.console` (the lines
printed at the end). To add a plot, add a function to :mod:`.plots` and call it from
:func:`tuner.report.files.write_outcome`.
"""
