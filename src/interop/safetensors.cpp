#include "pdtrain/interop/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "pdtrain/core/bf16.hpp"
#include "pdtrain/core/error.hpp"
#include "pdtrain/core/posix_io.hpp"
#include "pdtrain/io/output_file.hpp"

namespace pdtrain {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this reader copies it as is");

// The format's own bound on the header (safetensors refuses more than 100 MB): a length beyond
// it is a damaged or foreign file, not a reason to allocate.
constexpr std::int64_t kMaxHeaderBytes = 100'000'000;

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw Error(ExitCode::data, path + ": " + what);
}

std::int64_t element_bytes(StDtype d) { return d == StDtype::f32 ? 4 : 2; }

StDtype dtype_of(const std::string& path, const std::string& name, const std::string& text) {
  if (text == "F32") return StDtype::f32;
  if (text == "BF16") return StDtype::bf16;
  if (text == "F16") return StDtype::f16;
  bad(path, "tensor '" + name + "' has dtype " + text + "; pdtrain reads F32, BF16 and F16");
}

// IEEE binary16 to binary32, exact (subnormals, infinities and NaN included).
float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    exp = 113;
    while ((mant & 0x400u) == 0) mant <<= 1, --exp;
    bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

std::int64_t get_le64(const unsigned char* b) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | b[i];
  return v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())
             ? -1
             : static_cast<std::int64_t>(v);
}

// One header entry, checked against the data section's size.
StTensor parse_entry(const std::string& path, const std::string& name, const nlohmann::json& e,
                     std::int64_t data_bytes) {
  const std::string what = "tensor '" + name + "'";
  if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") ||
      !e.contains("data_offsets"))
    bad(path, what + ": a header entry needs dtype, shape and data_offsets");
  const auto& dtype = e["dtype"];
  const auto& shape = e["shape"];
  const auto& offsets = e["data_offsets"];
  if (!dtype.is_string()) bad(path, what + ": dtype is not a string");
  StTensor t;
  t.name = name;
  t.dtype = dtype_of(path, name, dtype.get<std::string>());
  if (!shape.is_array()) bad(path, what + ": shape is not an array");
  std::int64_t numel = 1;
  for (const auto& d : shape) {
    if (!d.is_number_unsigned() || d.get<std::uint64_t>() > (std::uint64_t{1} << 40))
      bad(path, what + ": shape " + shape.dump() + " is not a list of sizes");
    t.shape.push_back(d.get<std::int64_t>());
    if (numel > (std::int64_t{1} << 40) / std::max<std::int64_t>(1, t.shape.back()))
      bad(path, what + ": shape " + shape.dump() + " is implausibly large");
    numel *= t.shape.back();
  }
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned())
    bad(path, what + ": data_offsets " + offsets.dump() + " is not [begin, end]");
  const std::uint64_t b = offsets[0].get<std::uint64_t>(), en = offsets[1].get<std::uint64_t>();
  if (b > en) bad(path, what + ": data_offsets " + offsets.dump() + " end before they begin");
  if (en > static_cast<std::uint64_t>(data_bytes))
    bad(path, what + ": data_offsets " + offsets.dump() + " reach past the end of the file (" +
                  std::to_string(data_bytes) + " data bytes after the header; truncated?)");
  t.begin = static_cast<std::int64_t>(b);
  t.end = static_cast<std::int64_t>(en);
  if (t.end - t.begin != numel * element_bytes(t.dtype))
    bad(path, what + ": data_offsets " + offsets.dump() + " hold " +
                  std::to_string(t.end - t.begin) + " bytes but shape " + shape.dump() + " of " +
                  dtype.get<std::string>() + " needs " +
                  std::to_string(numel * element_bytes(t.dtype)));
  return t;
}

}  // namespace

std::int64_t StTensor::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd_ < 0) bad(path, std::string("cannot open safetensors file: ") + std::strerror(errno));
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) bad(path, std::string("cannot stat: ") + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) bad(path, "is not a regular file");
    const auto size = static_cast<std::int64_t>(st.st_size);
    unsigned char len[8];
    const IoResult r = pread_full(fd_, len, 8, 0);
    if (r.err != 0) bad(path, std::string("cannot read: ") + std::strerror(r.err));
    if (r.done < 8)
      bad(path, "truncated: " + std::to_string(size) +
                    " bytes, shorter than the 8-byte header length of a safetensors file");
    const std::int64_t n = get_le64(len);
    if (n < 0 || n > kMaxHeaderBytes)
      bad(path, "header length " + std::to_string(n) + " is not a safetensors header's (at most " +
                    std::to_string(kMaxHeaderBytes) + " bytes)");
    if (n > size - 8)
      bad(path, "the header claims " + std::to_string(n) + " bytes but the file has only " +
                    std::to_string(size - 8) + " after its length (truncated?)");
    std::string text(static_cast<std::size_t>(n), '\0');
    const IoResult h = pread_full(fd_, text.data(), text.size(), 8);
    if (h.err != 0 || h.done != text.size()) bad(path, "cannot read the header");
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      bad(path, std::string("the header is not JSON: ") + e.what());
    }
    if (!header.is_object()) bad(path, "the header is not a JSON object");
    data_start_ = 8 + n;
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") continue;
      tensors_.emplace(name, parse_entry(path, name, entry, size - data_start_));
    }
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsReader::read_f32(const StTensor& t, std::vector<float>& out) const {
  const auto n = static_cast<std::size_t>(t.numel());
  const auto bytes = static_cast<std::size_t>(t.end - t.begin);
  std::vector<unsigned char> raw(bytes);
  const IoResult r = pread_full(fd_, raw.data(), bytes, data_start_ + t.begin);
  if (r.err != 0 || r.done != bytes)  // the file shrank after its header was checked
    bad(path_, "tensor '" + t.name + "': read only " + std::to_string(r.done) + " of " +
                   std::to_string(bytes) + " bytes" +
                   (r.err ? std::string(": ") + std::strerror(r.err) : std::string()));
  out.resize(n);
  if (t.dtype == StDtype::f32) {
    std::memcpy(out.data(), raw.data(), bytes);
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t h;
    std::memcpy(&h, raw.data() + 2 * i, 2);
    out[i] = t.dtype == StDtype::bf16 ? to_float(std::bit_cast<bf16>(h)) : half_to_float(h);
  }
}

void write_safetensors(const std::string& path, const std::vector<StOutTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const StOutTensor& t : tensors) {
    const std::uint64_t bytes = t.values.size() * sizeof(float);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(text.size() >> (8 * i));
  const std::string tmp = path + ".tmp";
  try {
    OutputFile out(tmp, OutputFile::Mode::truncate);
    out.write(std::string_view(reinterpret_cast<const char*>(len), 8));
    out.write(text);
    for (const StOutTensor& t : tensors)
      out.write(std::string_view(reinterpret_cast<const char*>(t.values.data()),
                                 t.values.size() * sizeof(float)));
    out.close();
  } catch (...) {
    ::unlink(tmp.c_str());  // PATH itself was never touched
    throw;
  }
  publish_file(tmp, path);
}

}  // namespace pdtrain
