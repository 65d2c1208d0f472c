#!/usr/bin/env bash
# `make demo`: train the default recipe (multi30k-en-de) for DEMO_MINUTES on this machine's cores,
# print the test BLEU (beam 4) as JSON, and translate a few sentences.
set -euo pipefail
PY=$1; OUT=$2; MINUTES=$3
ATTNLAB="$PY -m attnlab"
if [ -f "$OUT/checkpoint/state.json" ]; then
  echo "== resuming the demo run in $OUT (delete it to start over)" >&2
  $ATTNLAB train --recipe multi30k-en-de --out "$OUT" --minutes "$MINUTES" --resume
else
  $ATTNLAB train --recipe multi30k-en-de --out "$OUT" --minutes "$MINUTES"
fi
echo "== test BLEU (test_2016_flickr, beam 4, sacreBLEU)" >&2
$ATTNLAB evaluate --model "$OUT" --split test --beam 4
echo "== translations" >&2
$ATTNLAB translate --model "$OUT" \
  "A man is riding a bicycle down the street." \
  "Two dogs are playing in the snow." \
  "The bank of the river."
