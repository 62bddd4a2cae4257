"""Deprecated: this module is now :mod:`lazyllm.serving.protocol`; importing it from here warns and works for one
release (0.1.x), then goes."""

import warnings

from lazyllm.serving.protocol import *  # noqa: F403

warnings.warn(
    "lazyllm.protocol is deprecated and will be removed in the next release; import lazyllm.serving.protocol instead",
    DeprecationWarning,
    stacklevel=2,
)
