// A BPF object's read-only configuration (`const volatile` variables, libbpf's .rodata),
// set by name before the object is loaded. One implementation for syrupd's loader (the
// policies' parameters) and for the benchmarks' hand-written programs.
#pragma once

#include <bpf/libbpf.h>

#include <cstdint>
#include <string>

namespace syrup {

// Writes `value` into the .rodata variable `name` of an opened, not yet loaded object
// (found by name in its BTF). 0; -ENOENT if the object has no such variable; -EINVAL if
// it is not an integer (or enum) of 1, 2, 4 or 8 bytes; -ERANGE if `value` does not fit.
int set_rodata(bpf_object* obj, const std::string& name, uint64_t value);

}  // namespace syrup
