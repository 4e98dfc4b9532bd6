// The fuzz targets' invariant check: a broken invariant aborts, so libFuzzer saves the
// input as a crash, with the target and the invariant on stderr.
#pragma once

#include <cstdio>
#include <cstdlib>

#ifndef SYRUP_FUZZ_TARGET
#error "define SYRUP_FUZZ_TARGET (the target's name) before including fuzz_check.h"
#endif

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "%s: invariant broken: %s\n", SYRUP_FUZZ_TARGET, what);
    std::abort();
  }
}

}  // namespace
