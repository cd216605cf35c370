// One error type for the whole project: main() catches it, prints one line and aborts MPI.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace dz {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

namespace detail {
inline void cat(std::ostringstream&) {}
template <class T, class... R>
void cat(std::ostringstream& os, const T& v, const R&... r) {
  os << v;
  cat(os, r...);
}
}  // namespace detail

// str("tensor ", name, " has ", n, " dims") -> std::string
template <class... A>
std::string str(const A&... a) {
  std::ostringstream os;
  detail::cat(os, a...);
  return os.str();
}

[[noreturn]] inline void fail(const std::string& msg) { throw Error(msg); }

}  // namespace dz

// DZ_CHECK(cond, "message parts", ...) throws dz::Error with the message when cond is false.
#define DZ_CHECK(cond, ...)                      \
  do {                                           \
    if (!(cond)) ::dz::fail(::dz::str(__VA_ARGS__)); \
  } while (0)
