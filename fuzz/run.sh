#!/usr/bin/env bash
# Builds Syrup's libFuzzer targets (clang-19, ASan + UBSan) and runs them.
#
#   fuzz/run.sh [-t SECONDS] [-b BUILD_DIR] [-f] [TARGET...]
#
# TARGET: protocol (the control-protocol frame parser), config (the --config YAML
# loader and planner), http (the metrics endpoint's request parser), source (the policy
# source path: syrupd's compiler in its sandbox, with the real clang); default all, one
# after the other.
#   -t SECONDS   how long each target runs (default 600)
#   -b DIR       build directory (default build/fuzz)
#   -f           fresh: start from the seed corpus in a temporary directory (ctest);
#                otherwise the corpus grows in DIR/corpus/TARGET across runs
# Seeds: fuzz/corpus/TARGET (read only). A crashing input is saved as
# DIR/artifacts/TARGET-crash-*; reproduce with `DIR/fuzz_TARGET FILE`.
# Exit: 0 no crash, 1 a crash or a build failure, 2 usage, 77 fuzzers cannot be built on
# this machine (no clang++-19 or no fuzzer runtime: apt-get install libclang-rt-19-dev);
# ctest reports 77 as skipped.
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
seconds=600
build=$src/build/fuzz
fresh=0
while getopts "t:b:fh" o; do
  case $o in
    t) seconds=$OPTARG ;;
    b) build=$OPTARG ;;
    f) fresh=1 ;;
    *) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(protocol config http source)
for t in "${targets[@]}"; do
  case $t in protocol|config|http|source) ;; *) echo "fuzz/run.sh: unknown target '$t' (protocol, config, http, source)" >&2; exit 2 ;; esac
done
case $seconds in ''|*[!0-9]*) echo "fuzz/run.sh: -t takes whole seconds" >&2; exit 2 ;; esac

skip() {
  echo "SKIP: $*" >&2
  exit 77
}

# Whether this machine can build and run a fuzzer at all.
cxx=${SYRUP_FUZZ_CXX:-$(command -v clang++-19 || true)}
[ -n "$cxx" ] || skip "no clang++-19 (apt-get install clang-19)"
mkdir -p "$build"
probe=$(mktemp -d /tmp/syrup-fuzz-probe-XXXXXX)
trap 'rm -rf "$probe"' EXIT
printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' > "$probe/p.cpp"
if ! "$cxx" -fsanitize=fuzzer,address,undefined "$probe/p.cpp" -o "$probe/p" 2> "$probe/err"; then
  skip "$cxx cannot link -fsanitize=fuzzer,address,undefined (clang's fuzzer runtime is missing: apt-get install libclang-rt-19-dev): $(grep -m1 -i error "$probe/err")"
fi
if ! "$probe/p" -runs=1 > "$probe/run" 2>&1; then
  skip "a fuzzer cannot run here (ASan needs to map its shadow memory): $(tail -1 "$probe/run")"
fi

# Build, one at a time (ctest may start both targets at once). The main build builds the
# fuzzers into build/fuzz already (tests/CMakeLists.txt): then this finds them up to date.
# A tree configured before is not configured again (its build re-runs CMake when needed).
exec 9> "$build/.lock"
flock -w 900 9 || { echo "fuzz/run.sh: another build of $build held its lock for 15 minutes" >&2; exit 1; }
if ! { { [ -f "$build/build.ninja" ] ||
         cmake -S "$src/fuzz" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE= > "$build/configure.log" 2>&1; } &&
       cmake --build "$build" > "$build/build.log" 2>&1; }; then
  echo "fuzz/run.sh: building the fuzzers failed:" >&2
  tail -n 30 "$build/configure.log" "$build/build.log" >&2
  exit 1
fi
flock -u 9

mkdir -p "$build/artifacts"
status=0
for t in "${targets[@]}"; do
  if [ $fresh -eq 1 ]; then
    work=$(mktemp -d "/tmp/syrup-fuzz-$t-XXXXXX")
    log=$build/$t-$$.log  # several may run at once (ctest, a long run)
  else
    work=$build/corpus/$t
    mkdir -p "$work"
    log=$build/$t.log
  fi
  dict=()
  [ -f "$src/fuzz/$t.dict" ] && dict=(-dict="$src/fuzz/$t.dict")
  echo "fuzz/run.sh: fuzzing $t for ${seconds}s (corpus $work, seeds fuzz/corpus/$t)"
  # Every failure exits 1 (libFuzzer's default for a crash is 77, ctest's skip code).
  start=$build/$t-$$.start
  touch "$start"
  "$build/fuzz_$t" -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
    -error_exitcode=1 -timeout_exitcode=1 -print_final_stats=1 \
    -artifact_prefix="$build/artifacts/$t-" "${dict[@]}" "$work" "$src/fuzz/corpus/$t" \
    > "$log" 2>&1
  rc=$?
  grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb|#[0-9]+.*(DONE|INITED))' "$log" | tail -4
  if [ $rc -ne 0 ]; then
    echo "fuzz/run.sh: $t FAILED (libFuzzer exit $rc); the end of $log:" >&2
    grep -v '^    #' "$log" | tail -25 >&2
    find "$build/artifacts" -name "$t-*" -newer "$start" | while read -r a; do
      echo "  reproduce: $build/fuzz_$t $a" >&2
    done
    status=1
  fi
  rm -f "$start"
  if [ $fresh -eq 1 ]; then
    rm -rf "$work"
    [ $rc -eq 0 ] && rm -f "$log"
  fi
done
exit $status
