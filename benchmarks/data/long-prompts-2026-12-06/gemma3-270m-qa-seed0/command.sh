#!/bin/bash
# issue 63, item 5: the quickstart's flags plus --model on a model with no packaged prior (Gemma 3 270M):
# the pilot sets the search cap; how many trials land above it?
cd /work/main
start=$(date +%s)
echo "start $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) load $(cut -d' ' -f1-3 /proc/loadavg)"
.venv/bin/python -m tuner.search --task qa --model gemma3-270m --seed 0 --output /work/i63run/runs-gemma
rc=$?
end=$(date +%s)
echo "end $(date -u +%FT%TZ) rc $rc wall $((end-start)) s load $(cut -d' ' -f1-3 /proc/loadavg)"
