// Text (one token per byte) and llm.c token shards. Both become a training span and a
// validation span of data files (read with pread: data_file.hpp); training sequences start at
// counter-based random offsets, validation sequences are llm.c's consecutive non-overlapping
// windows.
#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "pdtrain/core/error.hpp"
#include "pdtrain/core/rng.hpp"
#include "pdtrain/data/data_file.hpp"
#include "pdtrain/data/sources.hpp"
#include "pdtrain/data/token_shard.hpp"

namespace pdtrain::data {
namespace {

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw Error(ExitCode::data, file + ": " + what);
}

// Tokens of width 1 (bytes) or 2 (little-endian uint16) in a data file, from byte `offset`.
// Decoded byte by byte so shards load the same on any host.
struct TokenView {
  std::shared_ptr<const DataFile> file;
  std::int64_t offset = 0;
  std::int64_t n = 0;
  int width = 1;

  // Tokens [first, first + count) into `out`: one read of the file.
  void read(std::int64_t first, std::int64_t count, std::int32_t* out) const {
    std::vector<std::uint8_t> bytes(static_cast<std::size_t>(count * width));
    file->read(offset + first * width, bytes.size(), bytes.data());
    for (std::int64_t i = 0; i < count; ++i)
      out[i] = width == 1 ? bytes[i] : static_cast<std::int32_t>(bytes[2 * i] | (bytes[2 * i + 1] << 8));
  }
  TokenView sub(std::int64_t first, std::int64_t len) const {
    return {file, offset + first * width, len, width};
  }
};

std::string token_position(const TokenView& v, std::int64_t i) {
  return (v.width == 1 ? "byte offset " : "token index ") + std::to_string(i);
}

// Every token must index the embedding table; name the first one that does not. Read a
// chunk at a time, so a large file is never held in memory whole.
void check_vocab(const TokenView& v, std::int64_t vocab, const std::string& file) {
  if (vocab >= (std::int64_t{1} << (8 * v.width))) return;  // no value can be out of range
  constexpr std::int64_t kChunk = std::int64_t{1} << 18;
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(std::min(kChunk, v.n)));
  for (std::int64_t first = 0; first < v.n; first += kChunk) {
    const std::int64_t count = std::min(kChunk, v.n - first);
    v.read(first, count, tokens.data());
    for (std::int64_t i = 0; i < count; ++i)
      if (tokens[i] >= vocab)
        fail(file, token_position(v, first + i) + " holds value " + std::to_string(tokens[i]) +
                       ", not below vocab_size " + std::to_string(vocab));
  }
}

std::int32_t header_int(const DataFile& f, int index) {
  std::uint8_t b[4];
  f.read(4 * index, 4, b);
  return static_cast<std::int32_t>(std::uint32_t{b[0]} | std::uint32_t{b[1]} << 8 |
                                   std::uint32_t{b[2]} << 16 | std::uint32_t{b[3]} << 24);
}

TokenView text_tokens(const std::shared_ptr<const DataFile>& f) { return {f, 0, f->size(), 1}; }

// Checks the llm.c header against the file and returns the tokens after it.
TokenView shard_tokens(const std::shared_ptr<const DataFile>& shared) {
  const DataFile& f = *shared;
  const std::string& file = f.path();
  const std::int64_t size = f.size();
  if (size < kShardHeaderBytes)
    fail(file, "file is " + std::to_string(size) + " bytes, shorter than the " +
                   std::to_string(kShardHeaderBytes) + "-byte llm.c token shard header");
  if (const auto magic = header_int(f, 0); magic != kShardMagic)
    fail(file, "header magic (int 0) is " + std::to_string(magic) + ", expected " +
                   std::to_string(kShardMagic) + ": not an llm.c token shard");
  if (const auto version = header_int(f, 1); version != kShardVersion)
    fail(file, "header version (int 1) is " + std::to_string(version) + ", expected " +
                   std::to_string(kShardVersion) + " (uint16 GPT-2 tokens)");
  const std::int64_t count = header_int(f, 2);
  if (count < 0)
    fail(file, "header token count (int 2) is negative: " + std::to_string(count));
  if (const auto expect = kShardHeaderBytes + 2 * count; size != expect)
    fail(file, "file size is " + std::to_string(size) + " bytes but the header token count " +
                   "(int 2) is " + std::to_string(count) + ", which needs " +
                   std::to_string(kShardHeaderBytes) + " + 2*" + std::to_string(count) + " = " +
                   std::to_string(expect) + " bytes (truncated or corrupt shard)");
  return {shared, kShardHeaderBytes, count, 2};
}

void check_split(const TokenView& v, std::int64_t seq_len, const std::string& file,
                 const std::string& which) {
  if (v.n >= seq_len + 1) return;
  fail(file, "the " + which + " holds " + std::to_string(v.n) +
                 " tokens, fewer than seq_len + 1 = " + std::to_string(seq_len + 1) +
                 " needed for one sequence");
}

std::string percent(double fraction) {
  return std::to_string(static_cast<long long>(std::lround(100.0 * fraction))) + "%";
}

class WindowSource final : public TokenSource {
 public:
  WindowSource(TokenView train, TokenView val, const SourceSpec& s, std::string description)
      : train_(train),
        val_(val),
        seed_(static_cast<std::uint64_t>(s.seed)),
        seq_len_(s.seq_len),
        vocab_(s.vocab_size),
        description_(std::move(description)) {}

  void train_sequences(std::int64_t step, std::int64_t first, std::int64_t count,
                       std::int32_t* out) const override {
    check_train_slice(step, first, count, out);
    // Starts in [0, n - seq_len) so the seq_len + 1 tokens stay inside the training split.
    const auto starts = static_cast<std::uint64_t>(train_.n - seq_len_);
    for (std::int64_t i = 0; i < count; ++i) {
      const auto key = rng_key(seed_, kTrainTag, static_cast<std::uint64_t>(step),
                               static_cast<std::uint64_t>(first + i));
      copy_window(train_, static_cast<std::int64_t>(rng_below(key, 0, starts)),
                  out + i * (seq_len_ + 1));
    }
  }

  void val_sequences(std::int64_t batch, std::int64_t batch_size, std::int64_t first,
                     std::int64_t count, std::int32_t* out) const override {
    check_val_slice(batch, batch_size, first, count, out);
    for (std::int64_t i = 0; i < count; ++i) {
      const std::int64_t w = (batch * batch_size + first + i) % val_windows();
      copy_window(val_, w * seq_len_, out + i * (seq_len_ + 1));
    }
  }

  std::string describe() const override { return description_; }

  // Whole windows: window w needs tokens w*seq_len .. w*seq_len + seq_len.
  std::int64_t val_windows() const { return (val_.n - 1) / seq_len_; }

 private:
  // A token out of the vocabulary here means the file was rewritten in place since
  // check_vocab() passed (DataFile::read checks size and time, not the bytes); it would index
  // past the embedding table.
  void copy_window(const TokenView& v, std::int64_t start, std::int32_t* out) const {
    v.read(start, seq_len_ + 1, out);
    for (std::int64_t t = 0; t <= seq_len_; ++t)
      if (out[t] < 0 || out[t] >= vocab_)
        fail(v.file->path(), token_position(v, start + t) + " now holds value " +
                                 std::to_string(out[t]) + ", not below vocab_size " +
                                 std::to_string(vocab_) + ": the file changed while the job ran");
  }

  TokenView train_, val_;
  std::uint64_t seed_;
  std::int64_t seq_len_;
  std::int64_t vocab_;
  std::string description_;
};

// Splits, checks and describes a source whose files `tokens_of` turns into token views.
template <class TokensOf>
std::unique_ptr<TokenSource> open_windows(const SourceSpec& s, TokensOf tokens_of) {
  const TokenView all = tokens_of(std::make_shared<const DataFile>(s.path));
  check_vocab(all, s.vocab_size, s.path);
  TokenView train = all, val;
  std::string split;
  if (s.val_path.empty()) {
    // Rounded, not floored: 100 * (1 - 0.9) is 9.999..., and a split should not lose a token
    // to floating point.
    const std::int64_t n_train = all.n - std::llround(static_cast<double>(all.n) * s.val_fraction);
    train = all.sub(0, n_train);
    val = all.sub(n_train, all.n - n_train);
    check_split(train, s.seq_len, s.path,
                "training split (first " + percent(1.0 - s.val_fraction) + " of " +
                    std::to_string(all.n) + " tokens)");
    check_split(val, s.seq_len, s.path,
                "validation split (last " + percent(s.val_fraction) + " of " +
                    std::to_string(all.n) + " tokens)");
    split = "train " + std::to_string(train.n) + " tokens (first " +
            percent(1.0 - s.val_fraction) + "), val " + std::to_string(val.n) + " (last " +
            percent(s.val_fraction) + ")";
  } else {
    val = tokens_of(std::make_shared<const DataFile>(s.val_path));
    check_vocab(val, s.vocab_size, s.val_path);
    check_split(train, s.seq_len, s.path, "training split (the whole file)");
    check_split(val, s.seq_len, s.val_path, "validation split (the whole file)");
    split = "train " + std::to_string(train.n) + " tokens, val " + std::to_string(val.n) +
            " tokens from " + s.val_path;
  }
  const std::string text = std::string(to_string(s.kind)) + " source " + s.path + ": " + split +
                           ", " + std::to_string((val.n - 1) / s.seq_len) +
                           " validation windows of " + std::to_string(s.seq_len) + ", vocab " +
                           std::to_string(s.vocab_size);
  return std::make_unique<WindowSource>(train, val, s, text);
}

}  // namespace

std::unique_ptr<TokenSource> make_text_source(const SourceSpec& spec) {
  return open_windows(spec, text_tokens);
}

std::unique_ptr<TokenSource> make_tokens_source(const SourceSpec& spec) {
  return open_windows(spec, shard_tokens);
}

}  // namespace pdtrain::data
