#pragma once
// The one loop around pread(2) and write(2): both may move fewer bytes than asked (a signal, a
// large request, a full disk), and EINTR is a retry, not an error. Callers word the error,
// which names their file and what it is.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>

namespace pdtrain {

struct IoResult {
  std::size_t done = 0;  // bytes moved
  int err = 0;           // errno of the call that failed; 0 when done == n or at end of file
};

namespace detail {
// Linux moves at most about 2 GiB per call; asking for at most 1 GiB keeps every call whole.
constexpr std::size_t kMaxIoBytes = std::size_t{1} << 30;
}  // namespace detail

// Reads n bytes at `offset`; fewer only at end of file (err 0) or on an error (err set).
inline IoResult pread_full(int fd, void* buf, std::size_t n, std::int64_t offset) {
  IoResult r;
  auto* p = static_cast<unsigned char*>(buf);
  while (r.done < n) {
    const ssize_t got = ::pread(fd, p + r.done, std::min(n - r.done, detail::kMaxIoBytes),
                                static_cast<off_t>(offset + static_cast<std::int64_t>(r.done)));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) r.err = errno;
    if (got <= 0) return r;
    r.done += static_cast<std::size_t>(got);
  }
  return r;
}

// Writes n bytes; fewer only on an error (err set; a write that moves nothing is ENOSPC).
inline IoResult write_full(int fd, const void* buf, std::size_t n) {
  IoResult r;
  const auto* p = static_cast<const unsigned char*>(buf);
  while (r.done < n) {
    const ssize_t put = ::write(fd, p + r.done, std::min(n - r.done, detail::kMaxIoBytes));
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) {
      r.err = put < 0 ? errno : ENOSPC;
      return r;
    }
    r.done += static_cast<std::size_t>(put);
  }
  return r;
}

}  // namespace pdtrain
