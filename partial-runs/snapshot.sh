#!/usr/bin/env bash
# Save a long grid's raw run folders into partial-runs/ (records gzipped), or restore them under runs/ to resume it.
#   partial-runs/snapshot.sh save RUN      runs/RUN/<cell>/ -> partial-runs/RUN/<cell>/
#   partial-runs/snapshot.sh restore RUN   partial-runs/RUN/<cell>/ -> runs/RUN/<cell>/
set -euo pipefail
cd "$(dirname "$0")/.."
action=${1:?save or restore}
run=${2:?the name of the run folder under runs/}
case $action in
  save) from=runs/$run to=partial-runs/$run ;;
  restore) from=partial-runs/$run to=runs/$run ;;
  *) echo "snapshot.sh: save or restore, got '$action'" >&2; exit 2 ;;
esac
lines() { if [ -f "$1" ]; then wc -l < "$1"; elif [ -f "$1.gz" ]; then gunzip -c "$1.gz" | wc -l; else echo 0; fi; }
for cell in "$from"/*/; do
  cell=$(basename "$cell")
  [ -f "$from/$cell/cell.json" ] || continue
  # never replace records with fewer: a run folder left by a session that ran past its last snapshot
  if [ "$(lines "$to/$cell/items.jsonl")" -gt "$(lines "$from/$cell/items.jsonl")" ]; then
    echo "snapshot.sh: $to/$cell holds more item records than $from/$cell; save it first, or delete it" >&2
    exit 1
  fi
  mkdir -p "$to/$cell"
  cp "$from/$cell/cell.json" "$to/$cell/"
  [ -f "$from/$cell/arithmetic.json" ] && cp "$from/$cell/arithmetic.json" "$to/$cell/"
  for records in items calls; do
    if [ "$action" = save ]; then
      [ -f "$from/$cell/$records.jsonl" ] && gzip -9 -c "$from/$cell/$records.jsonl" > "$to/$cell/$records.jsonl.gz"
    else
      [ -f "$from/$cell/$records.jsonl.gz" ] && gunzip -c "$from/$cell/$records.jsonl.gz" > "$to/$cell/$records.jsonl"
    fi
  done
done
echo "$action: $from -> $to"
