// Text helpers shared by syrupd's modules (messages that list names).
#pragma once

#include <string>
#include <vector>

namespace syrup {

// "a, b, c": the items in order, separated by `sep`.
inline std::string join(const std::vector<std::string>& items, const std::string& sep = ", ") {
  std::string s;
  for (size_t i = 0; i < items.size(); i++) s += (i ? sep : "") + items[i];
  return s;
}

}  // namespace syrup
