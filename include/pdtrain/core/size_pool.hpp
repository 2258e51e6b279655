#pragma once
// Spare buffers kept by size and reused instead of allocated again: a fresh multi-MiB buffer
// costs a page fault per 4 KiB on its first touch, every step. The one pool of the code base
// (fetch replies, holders' gradient sums, streamed gradients and their push buffers).
#include <cstddef>
#include <limits>
#include <map>
#include <memory>
#include <optional>

namespace pdtrain {

template <class T>
class SizePool {
 public:
  // At most `keep` spares are kept; beyond it the smallest is dropped.
  explicit SizePool(std::size_t keep = std::numeric_limits<std::size_t>::max()) : keep_(keep) {}

  // A spare of exactly `size`, if there is one.
  std::optional<T> take(std::size_t size) {
    auto it = spare_.find(size);
    return it == spare_.end() ? std::nullopt : std::optional<T>(pop(it));
  }
  // The smallest spare of at least `size`, if there is one.
  std::optional<T> take_fitting(std::size_t size) {
    auto it = spare_.lower_bound(size);
    return it == spare_.end() ? std::nullopt : std::optional<T>(pop(it));
  }
  void give(std::size_t size, T item) {
    spare_.emplace(size, std::move(item));
    while (spare_.size() > keep_) spare_.erase(spare_.begin());
  }
  std::size_t spares() const { return spare_.size(); }

 private:
  T pop(typename std::multimap<std::size_t, T>::iterator it) {
    T item = std::move(it->second);
    spare_.erase(it);
    return item;
  }

  std::size_t keep_;
  std::multimap<std::size_t, T> spare_;
};

// Message bytes that grow without zero-filling (a fetch reply can be tens of MiB).
struct ByteBuffer {
  std::unique_ptr<char[]> data;
  std::size_t size = 0, capacity = 0;
  void resize(std::size_t n) {
    if (n > capacity) data.reset(new char[n]), capacity = n;
    size = n;
  }
};

}  // namespace pdtrain
