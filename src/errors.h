// Errors and checks. Two kinds of failure:
//   InputError  - the user's input is wrong (config, data, checkpoint, CLI): one clear
//                 message, exit code 2, nothing already written is damaged.
//   std::runtime_error - a bug or a failing system/library call: exit code 1.
// Every CUDA/cuBLAS/NCCL/MPI call goes through a CHECK macro that names the call,
// the file and the line.
#pragma once
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>
#include <sstream>

#include "src/utf8.h"

namespace flashgpt {

// The message of an InputError is one line of UTF-8 (the program prints it as
// "error: ..."): control characters that quoted input brings into it (a YAML scalar
// "a\nb", a file name) and bytes of it that are not UTF-8 (a corrupt file's header, which a
// JSON parser's message quotes) are written as escapes.
inline std::string one_line(const std::string& s) {
  std::string out;
  const char* hex = "0123456789abcdef";
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const Utf8Char u = decode_utf8(s, i);
    if (u.length > 1) out.append(s, i, u.length);
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (u.code_point == kInvalidCodePoint || c < 0x20 || c == 0x7f) out += {'\\', 'x', hex[c >> 4], hex[c & 15]};
    else out += char(c);
    i += u.length;
  }
  return out;
}

class InputError : public std::runtime_error {
 public:
  explicit InputError(const std::string& what) : std::runtime_error(one_line(what)) {}
};

// Builds a message from any streamable parts: fail_input("bad key ", key).
template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

template <class... Args>
[[noreturn]] void fail_input(const Args&... args) {
  throw InputError(cat(args...));
}

template <class... Args>
[[noreturn]] void fail(const Args&... args) {
  throw std::runtime_error(cat(args...));
}

// Creates the output directory `dir` (and its parents) that the user named with `what`
// (a key or an option). One that cannot be created (a parent that is a file, no
// permission, a read-only file system) is bad input: an InputError naming both.
inline void create_output_dir(const std::string& dir, const char* what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail_input(what, " '", dir, "': cannot create the directory (", ec.message(), ")");
}

// `text` (a knob's value) as a decimal integer from 1 to `max`, or an InputError
// "NAME must be EXPECTED, got 'TEXT'".
inline int64_t parse_positive_int(const std::string& text, const char* name, const char* expected = "a positive integer",
                                  int64_t max = INT32_MAX) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || text[0] < '0' || text[0] > '9' || *end != '\0' || errno == ERANGE || v < 1 || v > max)
    fail_input(name, " must be ", expected, ", got '", text, "'");
  return v;
}

}  // namespace flashgpt

// Precondition of a function (a programming error when it does not hold).
#define FG_ASSERT(cond, ...)                                                        \
  do {                                                                              \
    if (!(cond))                                                                    \
      ::flashgpt::fail(__FILE__, ":", __LINE__, ": assertion `", #cond, "` failed: ", \
                       ##__VA_ARGS__);                                              \
  } while (0)
