// Content digests: the compile cache's keys (compiler.cpp) and the --config entries'
// hashes (config.cpp), which say whether an entry changed across a reload.
#pragma once

#include <string>

namespace syrup {

// Hex SHA-256 of `data` (64 lowercase hex digits).
std::string sha256_hex(const std::string& data);

}  // namespace syrup
