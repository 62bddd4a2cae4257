#!/bin/bash
# issue 63: openqa-4k seed 0 decided again by the fixed rule (1bfe1f4: a scored schedule is its own
# evidence). The stored study (4 trials, same flags as 1f6bb8b's run) with its stored confirmation
# removed, so the confirmation, fresh-drift and held-out stages run again; no new trial (--n-trials 4).
cd /work/main
sqlite3 /work/i63run/runs/openqa-4k-seed0/study.db "delete from study_user_attributes where key='confirmation'"
start=$(date +%s)
echo "start $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) load $(cut -d' ' -f1-3 /proc/loadavg)"
.venv/bin/python -m tuner.search --preset openqa-4k --seed 0 \
  --openqa-dir /work/shared/data/open-qa --output /work/i63run/runs --study-name openqa-4k-seed0 \
  --n-examples 4 --confirm-n-examples 8 --fresh-kl-examples 4 --heldout-n-examples 4 \
  --trials-timeout 480 --timing-rounds 2 --n-trials 4
rc=$?
end=$(date +%s)
echo "end $(date -u +%FT%TZ) rc $rc wall $((end-start)) s load $(cut -d' ' -f1-3 /proc/loadavg)"
