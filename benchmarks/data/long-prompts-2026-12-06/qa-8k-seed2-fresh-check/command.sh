#!/bin/bash
# issue 63 (twelfth session): the qa-8k seed 2 study (../qa-8k-seed2, its trials unchanged) decided again by 4f5fba1's
# rule (7dbe54a's deciding bound on the validation score; the fresh-drift check runs however many examples the search
# ranked on). The stored confirmation and judged front are removed first; no trial is added.
cd /work/main
sqlite3 /work/i63run/runs/qa-8k-seed2/study.db \
  "delete from study_user_attributes where key in ('confirmation', 'judged_at_target')"
start=$(date +%s)
echo "start $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) load $(cut -d' ' -f1-3 /proc/loadavg)"
.venv/bin/python -m tuner.search --preset qa-8k --seed 2 \
  --data-dir /work/shared/data/longbench --openqa-dir /work/shared/data/open-qa \
  --output /work/i63run/runs --study-name qa-8k-seed2 \
  --n-examples 2 --confirm-n-examples 3 --fresh-kl-examples 4 --heldout-n-examples 1 \
  --trials-timeout 480 --timing-rounds 2
rc=$?
end=$(date +%s)
echo "end $(date -u +%FT%TZ) rc $rc wall $((end-start)) s load $(cut -d' ' -f1-3 /proc/loadavg)"
