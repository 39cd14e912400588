#!/usr/bin/env bash
# Before (a worktree of c3385a2: each batch of picks answered by one message) against after (answers
# flushed every ms of the router's work), kv-aware with the router service, prefix and multi,
# alternated: round 70 before then after, round 71 after then before (same seeds per round).
set -euo pipefail
OUT=$1; BEFORE=$2; AFTER=$3
run() { .venv/bin/python bench/routing.py "$OUT/$1" --rounds 1 --first-round "$2" --scenarios prefix,multi --policies kv-aware --tree "$3"; }
run before-70 70 "$BEFORE"; run after-70 70 "$AFTER"
run after-71 71 "$AFTER"; run before-71 71 "$BEFORE"
