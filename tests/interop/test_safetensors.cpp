// The safetensors reader: F32, BF16 and F16 tensors read exactly (fp16 subnormals and
// infinities included), what the writer wrote read back bit for bit, and headers whose entries
// do not fit the file refused naming the file and the tensor.
#include "pdtrain/interop/safetensors.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "pdtrain/core/error.hpp"

namespace pdtrain {
namespace {

std::string temp(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("pdtrain-st-" + name)).string();
}

// A file of one tensor "t" with the given header entry and data bytes.
std::string file_with(const std::string& name, const nlohmann::json& entry, const std::string& data) {
  const std::string header = nlohmann::json{{"t", entry}}.dump();
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(header.size() >> (8 * i));
  const std::string path = temp(name);
  std::ofstream(path, std::ios::binary) << bytes << header << data;
  return path;
}

std::string words(std::initializer_list<std::uint16_t> w) {
  std::string s;
  for (std::uint16_t v : w) s += static_cast<char>(v & 0xff), s += static_cast<char>(v >> 8);
  return s;
}

std::string error_of(const std::string& path) {
  try {
    SafetensorsReader r(path);
    std::vector<float> v;
    for (const auto& [name, t] : r.tensors()) r.read_f32(t, v);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::data);
    return e.what();
  }
  return "";
}

TEST(Safetensors, ReadsBf16AndF16Exactly) {
  // bf16: 1.0, -2.5, 0.15625; f16: 1.0, -2.5, smallest subnormal 2^-24, +inf.
  const SafetensorsReader b(file_with(
      "bf16", {{"dtype", "BF16"}, {"shape", {3}}, {"data_offsets", {0, 6}}},
      words({0x3f80, 0xc020, 0x3e20})));
  std::vector<float> v;
  b.read_f32(b.tensors().at("t"), v);
  EXPECT_EQ(v, (std::vector<float>{1.0f, -2.5f, 0.15625f}));
  const SafetensorsReader h(file_with(
      "f16", {{"dtype", "F16"}, {"shape", {2, 2}}, {"data_offsets", {0, 8}}},
      words({0x3c00, 0xc100, 0x0001, 0x7c00})));
  h.read_f32(h.tensors().at("t"), v);
  EXPECT_EQ(v, (std::vector<float>{1.0f, -2.5f, std::ldexp(1.0f, -24),
                                   std::numeric_limits<float>::infinity()}));
}

TEST(Safetensors, WrittenFileReadsBackBitForBit) {
  const std::string path = temp("written");
  const std::vector<StOutTensor> out = {{"a", {2, 3}, {1, 2, 3, 4, 5, -0.0f}},
                                        {"b", {1}, {std::nextafter(1.0f, 2.0f)}}};
  write_safetensors(path, out, {{"format", "pt"}});
  const SafetensorsReader r(path);
  ASSERT_EQ(r.tensors().size(), 2u);
  for (const StOutTensor& t : out) {
    std::vector<float> v;
    r.read_f32(r.tensors().at(t.name), v);
    EXPECT_EQ(r.tensors().at(t.name).shape, t.shape);
    EXPECT_EQ(std::memcmp(v.data(), t.values.data(), v.size() * 4), 0) << t.name;
  }
}

TEST(Safetensors, EntriesThatDoNotFitAreRefusedNamingTheTensor) {
  const std::string four(16, '\0');
  EXPECT_NE(error_of(file_with("short", {{"dtype", "F32"}, {"shape", {5}}, {"data_offsets", {0, 20}}}, four))
                .find("tensor 't': data_offsets [0,20] reach past the end of the file (16 data bytes"),
            std::string::npos);
  EXPECT_NE(error_of(file_with("size", {{"dtype", "F32"}, {"shape", {3}}, {"data_offsets", {0, 16}}}, four))
                .find("tensor 't': data_offsets [0,16] hold 16 bytes but shape [3] of F32 needs 12"),
            std::string::npos);
  EXPECT_NE(error_of(file_with("dtype", {{"dtype", "F64"}, {"shape", {2}}, {"data_offsets", {0, 16}}}, four))
                .find("tensor 't' has dtype F64"),
            std::string::npos);
  EXPECT_NE(error_of(file_with("entry", {{"dtype", "F32"}}, four))
                .find("tensor 't': a header entry needs dtype, shape and data_offsets"),
            std::string::npos);
  const std::string tiny = temp("tiny");
  std::ofstream(tiny, std::ios::binary) << "abc";
  EXPECT_NE(error_of(tiny).find(tiny + ": truncated: 3 bytes"), std::string::npos);
}

}  // namespace
}  // namespace pdtrain
