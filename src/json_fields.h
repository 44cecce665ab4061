// Integer fields of JSON read from files (checkpoint headers, state.json, a loader's
// state). nlohmann's get<int>() and get<uint64_t>() convert whatever number is there:
// 2.5 becomes 2, -1 becomes 2^64 - 1, and 1e300 is a float-to-integer cast with
// undefined behaviour. A file is input, so a field that is not what it should be is an
// InputError naming it.
#pragma once
#include <cstdint>
#include <string>
#include <nlohmann/json.hpp>
#include "src/errors.h"

namespace flashgpt {

// j[key]: an integer in [0, max]; InputError (naming `what` and the key) if j is not an
// object, the key is missing, or its value is another type, negative, fractional or
// larger than max.
inline uint64_t json_uint(const nlohmann::json& j, const char* key, const std::string& what,
                          uint64_t max = UINT64_MAX) {
  const auto it = j.find(key);  // end() when j is not an object
  if (it == j.end()) fail_input(what, ": '", key, "' is missing");
  const bool ok = it->is_number_unsigned() ? it->get<uint64_t>() <= max
                                           : it->is_number_integer() && it->get<int64_t>() >= 0 &&
                                                 uint64_t(it->get<int64_t>()) <= max;
  if (!ok) {
    std::string got = it->dump();
    if (got.size() > 40) got = got.substr(0, 40) + "...";
    fail_input(what, ": '", key, "' must be an integer in [0, ", max, "], got ", got);
  }
  return it->get<uint64_t>();
}

}  // namespace flashgpt
