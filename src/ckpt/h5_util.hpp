#pragma once
// Small HDF5 helpers of the checkpoint library (private): attributes, typed open/create.
#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>

#include "pdtrain/ckpt/h5_check.hpp"

namespace pdtrain::ckpt::detail {

void write_attr_i64(hid_t obj, const char* name, std::int64_t value);
void write_attr_str(hid_t obj, const char* name, const std::string& value);
std::optional<std::int64_t> read_attr_i64(hid_t obj, const char* name);
std::optional<std::string> read_attr_str(hid_t obj, const char* name);

// Opens a file read-only through the POSIX (sec2) driver: readers need no coordination.
H5Id open_read_only(const std::string& path);

// True if `path` names a link in `loc` ("params/wte").
bool exists(hid_t loc, const std::string& path);

}  // namespace pdtrain::ckpt::detail
