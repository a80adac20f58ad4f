# The abx code/run driver for bash: one long-lived shell that runs cells read as lines on
# stdin (the code with backslash escapes, decoded by printf %b) at its top level, so
# variables, functions and the working directory persist; the cell's stdout and stderr are
# the shell's own, and a frame (a marker, one JSON object, a newline) on fd 1 ends each
# cell with its exit status. Embedded in the broker (broker/local/src/code/mod.rs), which
# starts `bash -c` with a short bootstrap that reads this file from stdin into
# `__abx_driver` and evals it (so it is not on the command line).
unset __abx_driver
__abx_mark=$'\x1f'"$ABX_CODE_NONCE"
unset ABX_CODE_NONCE
trap ':' INT
printf '%s{"t":"ready","pid":%d}\n' "$__abx_mark" "$$"
while IFS= read -r __abx_line; do
  printf -v __abx_code '%b' "$__abx_line"
  unset __abx_line
  eval "$__abx_code" </dev/null
  __abx_status=$?
  printf '%s{"t":"done","status":%d}\n' "$__abx_mark" "$__abx_status"
  printf '%sE\n' "$__abx_mark" >&2
done
