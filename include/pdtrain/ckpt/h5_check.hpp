#pragma once
// H5_CHECK wraps every HDF5 call of the checkpoint library. HDF5 reports failure by a negative
// return value (hid_t or herr_t); the macro turns it into a pdtrain::Error that names the
// source file, line and rank, the call, the checkpoint file and object being worked on (see
// H5Context) and the innermost messages of HDF5's own error stack.
//
// HDF5 calls happen on one thread only (the one that calls CheckpointWriter / read_checkpoint);
// Debian's parallel HDF5 is not thread-safe, so the background encoder never touches it.
#include <hdf5.h>

#include <string>

#include "pdtrain/core/error.hpp"

namespace pdtrain::ckpt {

// Names the file and object ("params/qkvw") that HDF5 errors refer to while it lives. Nested
// contexts stack; the innermost file and object are reported.
class H5Context {
 public:
  H5Context(std::string file, std::string object);
  ~H5Context();
  H5Context(const H5Context&) = delete;
  H5Context& operator=(const H5Context&) = delete;

 private:
  std::string saved_file_, saved_object_;
};

// "checkpoint FILE, OBJECT" for messages, from the innermost H5Context ("" when none).
std::string h5_context_text();

// Throws Error(code) for a failed HDF5 call; used by H5_CHECK. The code is ExitCode::data
// (an unreadable or damaged file) unless the caller says otherwise.
[[noreturn]] void h5_fail(const char* call, const char* file, int line,
                          ExitCode code = ExitCode::data);

// Initializes HDF5 for pdtrain once per process: silences HDF5's automatic error printing (we
// report errors ourselves) and registers the zstd filter (id 32015). Every entry point of the
// checkpoint library calls it; calling it again is free.
void ensure_hdf5_ready();

// An owned HDF5 identifier, closed with the right H5?close on destruction.
class H5Id {
 public:
  H5Id() = default;
  explicit H5Id(hid_t id) : id_(id) {}
  ~H5Id() { reset(); }
  H5Id(H5Id&& o) noexcept : id_(o.id_) { o.id_ = H5I_INVALID_HID; }
  H5Id& operator=(H5Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      o.id_ = H5I_INVALID_HID;
    }
    return *this;
  }
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }  // NOLINT: handles are passed straight to H5 calls
  // Closes now and reports a failure (H5Fclose is where buffered data reaches the file).
  void close_checked(const char* file, int line);
  void reset();

 private:
  hid_t id_ = H5I_INVALID_HID;
};

}  // namespace pdtrain::ckpt

// Evaluates an HDF5 call once; a negative result throws pdtrain::Error(ExitCode::data) naming
// file, line, rank, the call and the checkpoint context. Yields the call's value.
#define H5_CHECK(call)                                                                   \
  ([&]() {                                                                               \
    auto pdt_h5_rc_ = (call);                                                            \
    if (pdt_h5_rc_ < 0) ::pdtrain::ckpt::h5_fail(#call, __FILE__, __LINE__);             \
    return pdt_h5_rc_;                                                                   \
  }())
