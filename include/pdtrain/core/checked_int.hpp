#pragma once
// 64-bit integer arithmetic that remembers an overflow instead of wrapping, for sizes derived
// from user input (parameter counts, bytes per rank): a product of deck values is either
// exact or known to be too large, never a wrapped or negative number.
#include <cstdint>
#include <limits>

namespace pdtrain {

class CheckedInt {
 public:
  constexpr CheckedInt(std::int64_t v) : value_(v) {}  // NOLINT: implicit, reads as arithmetic

  constexpr bool overflowed() const { return overflowed_; }
  // The exact value; INT64_MAX once an overflow happened (so comparisons with a cap fail safe).
  constexpr std::int64_t value() const {
    return overflowed_ ? std::numeric_limits<std::int64_t>::max() : value_;
  }

  friend constexpr CheckedInt operator+(CheckedInt a, CheckedInt b) {
    CheckedInt r(0);
    r.overflowed_ = a.overflowed_ || b.overflowed_ || __builtin_add_overflow(a.value_, b.value_, &r.value_);
    return r;
  }
  friend constexpr CheckedInt operator*(CheckedInt a, CheckedInt b) {
    CheckedInt r(0);
    r.overflowed_ = a.overflowed_ || b.overflowed_ || __builtin_mul_overflow(a.value_, b.value_, &r.value_);
    return r;
  }
  // Rounds up; `b` > 0.
  friend constexpr CheckedInt ceil_div(CheckedInt a, std::int64_t b) {
    CheckedInt r = a;
    if (!r.overflowed_) r.value_ = a.value_ / b + (a.value_ % b != 0);
    return r;
  }

 private:
  std::int64_t value_;
  bool overflowed_ = false;
};

}  // namespace pdtrain
