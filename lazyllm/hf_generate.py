"""Deprecated: this module is now :mod:`lazyllm.apply`; importing it from here warns and works for one
release (0.1.x), then goes."""

import warnings

from lazyllm.apply import *  # noqa: F403

warnings.warn(
    "lazyllm.hf_generate is deprecated and will be removed in the next release; import lazyllm.apply instead",
    DeprecationWarning,
    stacklevel=2,
)
