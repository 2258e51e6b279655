#include "pdtrain/model/llmc_format.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "pdtrain/core/error.hpp"
#include "pdtrain/core/posix_io.hpp"

namespace pdtrain {
namespace {

constexpr bool kLittleEndianHost = std::endian::native == std::endian::little;
[[noreturn]] void data_error(const std::string& msg) { throw Error(ExitCode::data, msg); }

std::string errno_text() { return std::strerror(errno); }

// A file descriptor closed on scope exit.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Closes now and reports whether close succeeded (it can report a deferred write error).
  bool close() {
    const int fd = fd_;
    fd_ = -1;
    return ::close(fd) == 0;
  }

 private:
  int fd_;
};

// Reads up to n bytes at `offset`; returns how many were read (fewer only at end of file).
std::size_t read_at(int fd, void* buf, std::size_t n, std::int64_t offset,
                    const std::string& path) {
  const IoResult r = pread_full(fd, buf, n, offset);
  if (r.err != 0)
    data_error(path + ": cannot read llm.c checkpoint: " + std::strerror(r.err));
  return r.done;
}

void write_all(int fd, const void* buf, std::size_t n, const std::string& path) {
  const IoResult r = write_full(fd, buf, n);
  if (r.err != 0)
    throw Error(ExitCode::runtime,
                path + ": cannot write llm.c checkpoint: " + std::strerror(r.err));
}

std::uint32_t get_le32(const unsigned char* b) {
  return static_cast<std::uint32_t>(b[0]) | static_cast<std::uint32_t>(b[1]) << 8 |
         static_cast<std::uint32_t>(b[2]) << 16 | static_cast<std::uint32_t>(b[3]) << 24;
}

void put_le32(unsigned char* b, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
}

// Swaps the bytes of n 32-bit words in place (used only on big-endian hosts).
void swap_words(void* data, std::size_t n) {
  auto* w = static_cast<std::uint32_t*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t v = w[i];
    w[i] = (v >> 24) | ((v >> 8) & 0xff00u) | ((v << 8) & 0xff0000u) | (v << 24);
  }
}

// Parses and validates the header of the open file `fd` (including the file size).
LlmcHeader read_header_fd(int fd, const std::string& path) {
  std::array<unsigned char, kLlmcHeaderBytes> buf{};
  const std::size_t got = read_at(fd, buf.data(), buf.size(), 0, path);
  if (got < buf.size())
    data_error(path + ": short header: an llm.c checkpoint header is " +
               std::to_string(kLlmcHeaderBytes) + " bytes but the file has only " +
               std::to_string(got));
  std::array<int, 8> v{};
  for (int i = 0; i < 8; ++i) v[i] = static_cast<int>(get_le32(buf.data() + 4 * i));
  const LlmcHeader h{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]};

  if (h.magic != kLlmcMagic)
    data_error(path + ": wrong magic " + std::to_string(h.magic) + " in header int 0, expected " +
               std::to_string(kLlmcMagic) + ": not an llm.c GPT-2 checkpoint");
  if (h.version != kLlmcVersionFp32) {
    const std::string what = h.version == kLlmcVersionBf16 ? " (bf16 parameters)" : "";
    data_error(path + ": unsupported version = " + std::to_string(h.version) + what +
               " in header int 1; pdtrain reads llm.c checkpoints of version " +
               std::to_string(kLlmcVersionFp32) + " (fp32 parameters)");
  }
  const std::pair<const char*, int> fields[] = {
      {"max_seq_len", h.max_seq_len}, {"vocab_size", h.vocab_size},
      {"num_layers", h.n_layer},      {"num_heads", h.n_head},
      {"channels", h.channels},       {"padded_vocab_size", h.padded_vocab_size}};
  for (const auto& [name, value] : fields)
    if (value <= 0)
      data_error(path + ": " + name + " = " + std::to_string(value) +
                 " in the llm.c checkpoint header must be positive");
  if (h.channels % h.n_head != 0)
    data_error(path + ": channels = " + std::to_string(h.channels) +
               " is not divisible by num_heads = " + std::to_string(h.n_head));
  if (h.padded_vocab_size < h.vocab_size)
    data_error(path + ": padded_vocab_size = " + std::to_string(h.padded_vocab_size) +
               " is smaller than vocab_size = " + std::to_string(h.vocab_size));

  // Guard the exact int64 count against overflow with a floating-point estimate first.
  const double C = h.channels, L = h.n_layer;
  const double estimate = (static_cast<double>(h.padded_vocab_size) + h.max_seq_len) * C +
                          L * (12.0 * C * C + 13.0 * C) + 2.0 * C;
  if (estimate > 1e18)
    data_error(path + ": the header implies ~" + std::to_string(estimate) +
               " parameters, implausibly many (channels = " + std::to_string(h.channels) +
               ", num_layers = " + std::to_string(h.n_layer) + ")");
  const std::int64_t count = llmc_param_count(h);
  const std::int64_t expected = kLlmcHeaderBytes + 4 * count;

  struct stat st {};
  if (::fstat(fd, &st) != 0) data_error(path + ": cannot stat llm.c checkpoint: " + errno_text());
  const auto size = static_cast<std::int64_t>(st.st_size);
  if (size != expected)
    data_error(path + ": file size is " + std::to_string(size) + " bytes but the header implies " +
               std::to_string(kLlmcHeaderBytes) + " + 4 * " + std::to_string(count) +
               " parameters = " + std::to_string(expected) + " bytes" +
               (size < expected ? " (truncated?)" : " (extra bytes after the parameters)"));
  return h;
}

int open_for_read(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) data_error(path + ": cannot open llm.c checkpoint: " + errno_text());
  return fd;
}

int to_header_int(std::int64_t v, const char* key, const std::string& path) {
  if (v <= 0 || v > std::numeric_limits<std::int32_t>::max())
    data_error(path + ": " + key + " = " + std::to_string(v) +
               " does not fit an llm.c checkpoint header (positive int32)");
  return static_cast<int>(v);
}

}  // namespace

std::int64_t llmc_param_count(const LlmcHeader& h) {
  const std::int64_t C = h.channels, L = h.n_layer;
  return static_cast<std::int64_t>(h.padded_vocab_size) * C +
         static_cast<std::int64_t>(h.max_seq_len) * C + L * (12 * C * C + 13 * C) + 2 * C;
}

LlmcHeader read_llmc_header(const std::string& path) {
  Fd fd(open_for_read(path));
  return read_header_fd(fd.get(), path);
}

ModelShape shape_from_llmc(const LlmcHeader& h, std::int64_t seq_len, const std::string& path) {
  if (seq_len <= 0)
    data_error("model.seq_len = " + std::to_string(seq_len) + " must be positive (checkpoint " +
               path + ")");
  if (seq_len > h.max_seq_len)
    data_error("model.seq_len = " + std::to_string(seq_len) + " in the deck exceeds max_seq_len = " +
               std::to_string(h.max_seq_len) + " in " + path);
  ModelShape s{};
  s.n_layer = h.n_layer;
  s.n_head = h.n_head;
  s.d_model = h.channels;
  s.vocab_size = h.vocab_size;
  s.padded_vocab = h.padded_vocab_size;
  s.seq_len = seq_len;
  s.max_seq_len = h.max_seq_len;
  return s;
}

void check_llmc_shape(const LlmcHeader& h, const ModelShape& shape, const std::string& path) {
  struct Field {
    const char* deck_key;
    std::int64_t deck;
    const char* file_key;
    std::int64_t file;
  };
  const Field fields[] = {
      {"model.n_layer", shape.n_layer, "num_layers", h.n_layer},
      {"model.n_head", shape.n_head, "num_heads", h.n_head},
      {"model.d_model", shape.d_model, "channels", h.channels},
      {"model.vocab_size", shape.vocab_size, "vocab_size", h.vocab_size},
      {"model.padded_vocab_size", shape.padded_vocab, "padded_vocab_size", h.padded_vocab_size},
      {"model.max_seq_len", shape.max_seq_len, "max_seq_len", h.max_seq_len},
  };
  for (const Field& f : fields)
    if (f.deck != f.file)
      data_error(std::string(f.deck_key) + " = " + std::to_string(f.deck) + " in the deck but " +
                 f.file_key + " = " + std::to_string(f.file) + " in " + path);
  if (shape.seq_len > h.max_seq_len)
    data_error("model.seq_len = " + std::to_string(shape.seq_len) +
               " in the deck exceeds max_seq_len = " + std::to_string(h.max_seq_len) + " in " +
               path);
}

void read_llmc_params(const std::string& path, const ParamCatalog& cat,
                      std::vector<float>& canonical) {
  Fd fd(open_for_read(path));
  const LlmcHeader h = read_header_fd(fd.get(), path);
  check_llmc_shape(h, cat.shape(), path);
  const std::int64_t n = cat.total_numel();
  if (llmc_param_count(h) != n)  // cannot happen once the shapes agree; guards the catalogue
    data_error(path + ": holds " + std::to_string(llmc_param_count(h)) +
               " parameters but the model has " + std::to_string(n));
  canonical.resize(static_cast<std::size_t>(n));
  const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(float);
  const std::size_t got = read_at(fd.get(), canonical.data(), bytes, kLlmcHeaderBytes, path);
  if (got != bytes)  // the file shrank after its size was checked
    data_error(path + ": read only " + std::to_string(got) + " of " + std::to_string(bytes) +
               " parameter bytes");
  if constexpr (!kLittleEndianHost) swap_words(canonical.data(), canonical.size());
}

void write_llmc(const std::string& path, const ParamCatalog& cat, const float* canonical) {
  const ModelShape& s = cat.shape();
  std::array<unsigned char, kLlmcHeaderBytes> header{};
  const int ints[8] = {kLlmcMagic,
                       kLlmcVersionFp32,
                       to_header_int(s.max_seq_len, "model.max_seq_len", path),
                       to_header_int(s.vocab_size, "model.vocab_size", path),
                       to_header_int(s.n_layer, "model.n_layer", path),
                       to_header_int(s.n_head, "model.n_head", path),
                       to_header_int(s.d_model, "model.d_model", path),
                       to_header_int(s.padded_vocab, "model.padded_vocab_size", path)};
  for (int i = 0; i < 8; ++i) put_le32(header.data() + 4 * i, static_cast<std::uint32_t>(ints[i]));

  const std::string tmp = path + ".tmp";
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0)
    throw Error(ExitCode::runtime, tmp + ": cannot create llm.c checkpoint: " + errno_text());
  try {
    write_all(fd.get(), header.data(), header.size(), tmp);
    const std::size_t n = static_cast<std::size_t>(cat.total_numel());
    if constexpr (kLittleEndianHost) {
      write_all(fd.get(), canonical, n * sizeof(float), tmp);
    } else {
      std::vector<float> chunk(std::min<std::size_t>(n, std::size_t{1} << 20));
      for (std::size_t i = 0; i < n; i += chunk.size()) {
        const std::size_t k = std::min(chunk.size(), n - i);
        std::memcpy(chunk.data(), canonical + i, k * sizeof(float));
        swap_words(chunk.data(), k);
        write_all(fd.get(), chunk.data(), k * sizeof(float), tmp);
      }
    }
    if (::fsync(fd.get()) != 0)
      throw Error(ExitCode::runtime, tmp + ": cannot sync llm.c checkpoint: " + errno_text());
    if (!fd.close())
      throw Error(ExitCode::runtime, tmp + ": cannot close llm.c checkpoint: " + errno_text());
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      throw Error(ExitCode::runtime,
                  "cannot rename " + tmp + " to " + path + ": " + errno_text());
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
}

}  // namespace pdtrain
