"""Every word, table, CSV, markdown file and figure the tuner writes, from typed results:

* a study (:class:`~tuner.stages.outcome.StudyOutcome`): :mod:`.files` (schedules, tables, JSON),
  :mod:`.plots` (figures), :mod:`.console` (the lines printed at the end), :mod:`.decision` (what bound
  the answer, in words);
* ``python -m tuner.evaluate``: :mod:`.evaluation` (Tables 1-3, per-method results and summaries);
* ``--match-speedup``: :mod:`.matched` (the matched-speed and matched-loss tables and figure);
* shared: :mod:`.figure` (matplotlib set up once, figures saved atomically), :mod:`.table` (CSV text).

To add a study plot, add a function to :mod:`.plots` and call it from
:func:`tuner.report.files.write_outcome`.
"""
