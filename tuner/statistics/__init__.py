"""Statistics of a study: the paired bootstrap, the calibration from KL to task loss and its prior, the cap, robust speedups."""
