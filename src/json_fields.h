// Reading JSON from files (checkpoint headers, state.json, a loader's state, imported
// configs): nesting and integer fields are checked, so that a damaged or hostile file is
// an InputError naming what is wrong, never a crash or a silently converted number.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <nlohmann/json.hpp>
#include "src/errors.h"

namespace flashgpt {

constexpr int kMaxJsonDepth = 64;

// nlohmann::json::parse(input...) refusing nesting deeper than kMaxJsonDepth (an
// InputError naming `what`): copying, comparing and printing a parsed value recurse,
// so a file of 100000 '[' would overflow the stack long after it parsed. Syntax errors
// still throw nlohmann's parse_error, for the caller's own message.
template <class... Input>
nlohmann::json parse_json(const std::string& what, Input&&... input) {
  return nlohmann::json::parse(std::forward<Input>(input)...,
                               [&what](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
                                 if (depth > kMaxJsonDepth)
                                   fail_input(what, " is nested more than ", kMaxJsonDepth, " levels deep");
                                 return true;
                               });
}

// nlohmann's get<int>() and get<uint64_t>() convert whatever number is there: 2.5
// becomes 2, -1 becomes 2^64 - 1, and 1e300 is a float-to-integer cast with undefined
// behaviour.

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
