#pragma once
// Names and constants of the checkpoint format (docs/checkpoint-format.md), private.
#include <cstdint>
#include <string>

namespace pdtrain::ckpt::detail {

constexpr const char* kFormat = "pdtrain-checkpoint";
constexpr std::int64_t kFormatVersion = 1;          // raw, zstd, xor (and anchors)
constexpr std::int64_t kBitDeltaFormatVersion = 2;  // bitdelta files: quantized states

// Groups: one dataset per tensor, except the CRC and bitdelta groups.
constexpr const char* kParams = "params";
constexpr const char* kAdamM = "adam_m";
constexpr const char* kAdamV = "adam_v";
// bitdelta, per quantized state: "<state>_codes" uint8 [blocks of tensor, code bytes],
// "<state>_scales" uint32 [blocks of tensor, 2 x groups], and max_error/<state> fp32 [n_blocks].
constexpr const char* kCodesSuffix = "_codes";
constexpr const char* kScalesSuffix = "_scales";
constexpr const char* kMaxError = "max_error";
constexpr const char* kCrc = "crc32c";          // uint32 [n_blocks] per state group

// The three states of a block, in file order.
enum class State { param = 0, m = 1, v = 2 };
constexpr const char* kStateGroups[3] = {kParams, kAdamM, kAdamV};

// "ckpt-00000100.h5" -> 100; -1 if the name is not a checkpoint's.
std::int64_t step_of_file_name(const std::string& name);

// The directory of `path` ("." when none) and its last component.
std::string dir_of(const std::string& path);
std::string base_of(const std::string& path);

}  // namespace pdtrain::ckpt::detail
