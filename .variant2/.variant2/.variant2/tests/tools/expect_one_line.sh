#!/bin/sh
# expect_one_line.sh CODE COMMAND [ARGS...]: runs COMMAND, checks that it exits with CODE after
# printing exactly one line (stdout and stderr together), and echoes "one line: <that line>".
expected=$1
shift
out=$("$@" 2>&1)
code=$?
lines=$(printf '%s\n' "$out" | wc -l)
if [ "$code" -ne "$expected" ] || [ "$lines" -ne 1 ]; then
  echo "exit code $code (expected $expected), $lines lines (expected 1):"
  printf '%s\n' "$out"
  exit 1
fi
echo "one line: $out"
