#pragma once
// The safetensors format (Hugging Face): an 8-byte little-endian header length N, N bytes of
// JSON ({"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
// "__metadata__": {string: string}}), then the tensors' bytes, offsets relative to the end of
// the header. The header is read and written with nlohmann::json, never by hand.
//
// Reading checks everything before a byte of data is trusted: the length against the file's
// size, the JSON, every entry's dtype (F32, BF16 and F16 are read; others are refused), shape
// and offsets (inside the file, as many bytes as the shape needs). Each problem is
// Error(ExitCode::data) naming the file and, where there is one, the tensor.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace pdtrain {

enum class StDtype { f32, bf16, f16 };

struct StTensor {
  std::string name;
  StDtype dtype = StDtype::f32;
  std::vector<std::int64_t> shape;
  std::int64_t begin = 0, end = 0;  // byte offsets into the data section
  std::int64_t numel() const;
};

// An open safetensors file whose header has been validated.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, StTensor>& tensors() const { return tensors_; }
  // Tensor `name`'s values as fp32 (bf16 and fp16 widened exactly); `out` gets numel floats.
  void read_f32(const StTensor& t, std::vector<float>& out) const;

 private:
  std::string path_;
  int fd_ = -1;
  std::int64_t data_start_ = 0;
  std::map<std::string, StTensor> tensors_;
};

// One fp32 tensor to write: its name, shape and values (numel floats, row-major).
struct StOutTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<float> values;
};

// Writes the tensors (fp32, in the given order) and `metadata` to PATH.tmp, fsync'ed and renamed
// over PATH (io/output_file), so PATH is never half-written. Error(data) names the file.
void write_safetensors(const std::string& path, const std::vector<StOutTensor>& tensors,
                       const std::map<std::string, std::string>& metadata);

}  // namespace pdtrain
