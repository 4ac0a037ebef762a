#!/usr/bin/env bash
# Text options reach the engine byte for byte (issue 49). CLI11, left to itself, reads a value of
# a multi-value option such as --prompt or --stop as a list when it is bracketed: "[a, b]" is two
# values, "[x]" is x, and "[]" is none and swallows the next argument. The shipped model's
# tokenizer maps a prompt to <s> and its UTF-8 bytes, so the prompt_ids that `generate --json`
# prints are exactly what reached the engine; a stop string shows itself by where the text ends.
# Usage: verbatim_text_cli_test.sh SPECULA_BINARY SOURCE_DIR
set -uo pipefail
specula=$1
source_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# run NAME ARGS...: runs specula with a 120 s bound; sets rc, out (stdout exactly, trailing
# newlines included) and err.
run() {
  local name=$1
  shift
  timeout 120 "$specula" "$@" >"$work/out" 2>"$work/err"
  rc=$?
  out=$(cat "$work/out"; printf .)
  out=${out%.}
  err=$(cat "$work/err")
  if ((rc != 0)); then fail "$name: exit status $rc (stderr: $err)"; fi
}

# ids_of TEXT: "256,b1,b2,...", <s> and the bytes of TEXT, as the shipped tokenizer encodes it.
ids_of() {
  local ids=256 b
  for b in $(printf '%s' "$1" | od -An -v -tu1); do ids+=",$b"; done
  printf '%s\n' "$ids"
}

# The prompt_ids of each JSON line of $out, one line each.
prompt_ids() { grep -o '"prompt_ids":\[[0-9,]*\]' <<<"$out" | sed 's/.*\[//; s/\]$//'; }

# Brackets, braces, commas, quotes, a backslash, whitespace runs, control characters, non-ASCII
# text, and values that look like flags (these only as --prompt=VALUE).
values=("[a, b]" "[x]" "[]" "[" "]" "a,b" ",a,,b," "{x}" "{}" "\"quoted\"" "'single'" 'back\slash' "  two  spaces  "
        $'tab\there' $'two\nlines' "héllo wörld — 日本語 🌍" "[é, 日]" "-x" "--x" "-" "--" "-[a, b]")

# 1. --prompt: every value in one batch, each as --prompt VALUE (flag-like ones only as
# --prompt=VALUE) and each again as --prompt=VALUE; one request per flag, in order.
args=() expected=""
for v in "${values[@]}"; do
  [[ $v == -* ]] || args+=(--prompt "$v")
done
for v in "${values[@]}"; do args+=("--prompt=$v"); done
for v in "${values[@]}"; do [[ $v == -* ]] || expected+="$(ids_of "$v")"$'\n'; done
for v in "${values[@]}"; do expected+="$(ids_of "$v")"$'\n'; done
run "prompt batch" generate "${args[@]}" --max-new-tokens 1 --json
[[ "$(prompt_ids)"$'\n' == "$expected" ]] || fail "prompt batch: prompt_ids
$(prompt_ids)
expected
$expected"

# "[]" last on the command line and "[]" before a flag: one prompt "[]", the flag still a flag.
run "prompt [] last" generate --max-new-tokens 1 --json --prompt "[]"
[[ "$(prompt_ids)" == "$(ids_of "[]")" ]] || fail "prompt [] last: $(prompt_ids)"
run "prompt [] before a flag" generate --prompt "[]" --json --max-new-tokens 1
[[ "$(prompt_ids)" == "$(ids_of "[]")" ]] || fail "prompt [] before a flag: $(prompt_ids) (stdout: $out)"

# One value per flag: a second word is not a second prompt.
timeout 120 "$specula" generate --prompt a b --max-new-tokens 1 >"$work/out" 2>"$work/err"
rc=$?
((rc != 0)) && grep -q "not expected: b" "$work/err" ||
  fail "--prompt a b: exit status $rc, stderr '$(cat "$work/err")': 'b' should be refused, not run as a prompt"

# 2. Single-value text options keep brackets too: --prompts-file and --model of `generate`,
# --json of `bench generate`.
printf '%s\n%s\n' "[x]" "{y} [a, b]" >"$work/[a, b]"
ln -s "$source_dir/models/specula-byte-6m" "$work/[m]"
run "prompts-file and model" generate --prompts-file "$work/[a, b]" --model "$work/[m]" --max-new-tokens 1 --json
[[ "$(prompt_ids)" == "$(ids_of "[x]")"$'\n'"$(ids_of "{y} [a, b]")" ]] ||
  fail "--prompts-file '[a, b]' --model '[m]': prompt_ids $(prompt_ids)"
run "bench generate json path" bench generate --synthetic tiny --prompt-len 4 --decode-len 2 --json "$work/[x].json"
[[ -s "$work/[x].json" ]] || fail "bench generate --json '[x].json' wrote no such file: $(ls "$work")"

# 3. --stop: the greedy text stops right before the first occurrence of the stop string, and
# runs on unchanged when it never occurs. The prompt repeats bracketed text, so the model's
# continuation does too and some stop strings are found.
prompt="-x é日本 {x} [x] a,b -x é日本 {x} [x] a,b -x é日本 {x} [x] a,b"
gen=(generate "--prompt=$prompt" --max-new-tokens 48 --ignore-eos)
run "stop reference" "${gen[@]}"
reference=${out%$'\n'}  # the streamed text, then one newline
found=0
for v in "${values[@]}"; do
  [[ -n $v ]] || continue
  expected=${reference%%"$v"*}
  [[ $expected != "$reference" ]] && found=$((found + 1))
  if [[ $v == -* ]]; then run "stop '$v'" "${gen[@]}" "--stop=$v"; else run "stop '$v'" "${gen[@]}" --stop "$v"; fi
  [[ ${out%$'\n'} == "$expected" ]] || fail "--stop '$v': text '${out%$'\n'}', expected '$expected'"
done
# Two stop strings: the earlier match wins.
run "two stops" "${gen[@]}" --stop "a,b" --stop "[x]"
first_a=${reference%%"a,b"*} first_x=${reference%%"[x]"*}
expected=$first_a
((${#first_x} < ${#first_a})) && expected=$first_x
[[ ${out%$'\n'} == "$expected" ]] || fail "--stop 'a,b' --stop '[x]': text '${out%$'\n'}', expected '$expected'"
# A stop test where no stop string matched proves only that nothing was cut.
((found > 0)) || fail "the reference text '$reference' contains none of the stop strings: the stop path was not exercised"

if ((failures > 0)); then
  echo "$failures case(s) failed" >&2
  exit 1
fi
echo "all text options passed through byte for byte ($found stop strings found in the reference text)"
