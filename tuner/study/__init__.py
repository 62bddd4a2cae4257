"""The data model of a study: settings, search spaces, trial records, identity, storage and workers."""
