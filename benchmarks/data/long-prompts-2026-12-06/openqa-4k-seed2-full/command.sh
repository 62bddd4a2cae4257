#!/bin/bash
# issue 63, cheap against full-length search: openqa-4k seed 2 with its trials at the target length
# (--search-prompt-tokens 4096: no multi-fidelity), every other flag as in ../openqa-4k-seed2/command.sh,
# and enough --trials-timeout for all 60 trials, so both searches run the same number of trials.
# Unlike seed 1's full-length run (at 92fb91c, under the preset's then max_kl 0.5), this one runs at 641edb6 or later:
# the preset's 0.5-nat cap binds short trials only (search_max_kl), so these 4096-token trials search
# under the prior's cap at 4096 (0.174 nats).
cd /work/main
start=$(date +%s)
echo "start $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) load $(cut -d' ' -f1-3 /proc/loadavg)"
.venv/bin/python -m tuner.search --preset openqa-4k --seed 2 --search-prompt-tokens 4096 \
  --openqa-dir /work/shared/data/open-qa --output /work/i63run/runs --study-name openqa-4k-seed2-full \
  --n-examples 4 --confirm-n-examples 8 --fresh-kl-examples 4 --heldout-n-examples 4 \
  --trials-timeout 3600 --timing-rounds 2
rc=$?
end=$(date +%s)
echo "end $(date -u +%FT%TZ) rc $rc wall $((end-start)) s load $(cut -d' ' -f1-3 /proc/loadavg)"
