"""Deprecated: this module is now :mod:`lazyllm.serving.queue`; importing it from here warns and works for one
release (0.1.x), then goes."""

import warnings

from lazyllm.serving.queue import *  # noqa: F403

warnings.warn(
    "lazyllm.scheduler is deprecated and will be removed in the next release; import lazyllm.serving.queue instead",
    DeprecationWarning,
    stacklevel=2,
)
