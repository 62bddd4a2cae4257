"""The one YAML reader of the settings files (search spaces, ``studies/*.yaml`` presets).

PyYAML's safe loader, except that a key given twice in a mapping is an error instead of silently
the last one: in a settings file a repeated key is a typo whose first value would be ignored.
"""

from __future__ import annotations

from typing import Any

import yaml


class StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice is an error (not silently the last)."""


def _mapping_once(loader: StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} is given twice", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_once)


def load_strict(text: str) -> Any:
    """Parse ``text`` safely; a repeated key raises :class:`yaml.YAMLError` naming the key and line.

    >>> load_strict("a: 1\\nb: 2")
    {'a': 1, 'b': 2}
    """
    return yaml.load(text, Loader=StrictLoader)
