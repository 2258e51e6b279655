// Tests of the data layer: batches are pure functions of (seed, step, sequence index), the
// synthetic task has the structure and entropy floor it claims, and file sources read exactly
// the bytes/tokens of their files and reject malformed ones with a data error.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "pdtrain/core/error.hpp"
#include "pdtrain/core/rng.hpp"
#include "pdtrain/data/data_file.hpp"
#include "pdtrain/data/sources.hpp"
#include "pdtrain/data/token_shard.hpp"
#include "pdtrain/data/token_source.hpp"

namespace pdtrain::data {
namespace {

using Tokens = std::vector<std::int32_t>;

const std::string kShakespeare = std::string(PDTRAIN_DATA_DIR) + "/tinyshakespeare.txt";

Tokens train(const TokenSource& s, std::int64_t T, std::int64_t step, std::int64_t first,
             std::int64_t count) {
  Tokens out(count * (T + 1), -1);
  s.train_sequences(step, first, count, out.data());
  return out;
}

Tokens val(const TokenSource& s, std::int64_t T, std::int64_t batch, std::int64_t bs,
           std::int64_t first, std::int64_t count) {
  Tokens out(count * (T + 1), -1);
  s.val_sequences(batch, bs, first, count, out.data());
  return out;
}

Tokens seq(const Tokens& batch, std::int64_t T, std::int64_t j) {
  return Tokens(batch.begin() + j * (T + 1), batch.begin() + (j + 1) * (T + 1));
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The split rule: the validation tail is round(n * val_fraction) tokens.
std::int64_t train_tokens(std::size_t n, double val_fraction) {
  return static_cast<std::int64_t>(n) - std::llround(static_cast<double>(n) * val_fraction);
}

Tokens bytes_at(const std::string& text, std::int64_t start, std::int64_t len) {
  Tokens out;
  for (std::int64_t i = start; i < start + len; ++i)
    out.push_back(static_cast<unsigned char>(text.at(i)));
  return out;
}

std::vector<std::string>& temp_files() {
  static std::vector<std::string> files;
  return files;
}

// Removes this process's temporary files when the tests end, failed or not.
class TempCleanup : public testing::Environment {
 public:
  void TearDown() override {
    for (const auto& f : temp_files()) std::filesystem::remove(f);
  }
};
[[maybe_unused]] testing::Environment* const kTempCleanup =
    testing::AddGlobalTestEnvironment(new TempCleanup);

// A unique path per test and process: ctest may run the tests of this binary in parallel.
std::string temp_path(const std::string& name) {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  temp_files().push_back(testing::TempDir() + "pdtrain_data_" + info->name() + "_" +
                         std::to_string(::getpid()) + "_" + name);
  return temp_files().back();
}

void write_bytes(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// A shard with an arbitrary header, for the malformed cases write_token_shard cannot make.
std::vector<std::uint8_t> raw_shard(std::int32_t magic, std::int32_t version, std::int32_t count,
                                    const std::vector<std::uint16_t>& tokens) {
  std::vector<std::uint8_t> b(1024, 0);
  const std::int32_t head[3] = {magic, version, count};
  for (int k = 0; k < 3; ++k)
    for (int byte = 0; byte < 4; ++byte)
      b[4 * k + byte] = static_cast<std::uint8_t>(static_cast<std::uint32_t>(head[k]) >> (8 * byte));
  for (auto t : tokens) {
    b.push_back(static_cast<std::uint8_t>(t));
    b.push_back(static_cast<std::uint8_t>(t >> 8));
  }
  return b;
}

std::vector<std::uint16_t> ramp(std::int64_t n, std::int64_t vocab) {
  std::vector<std::uint16_t> t(n);
  for (std::int64_t i = 0; i < n; ++i) t[i] = static_cast<std::uint16_t>((i * 7919 + 13) % vocab);
  return t;
}

// Runs `f`, expecting Error(ExitCode::data) whose message contains every needle.
template <class F>
void expect_data_error(F&& f, const std::vector<std::string>& needles) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::data) << e.what();
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "message '" << e.what() << "' lacks '" << n << "'";
    return;
  }
  ADD_FAILURE() << "no pdtrain::Error thrown";
}

// --- properties every source must have -------------------------------------------------

// Any split of a batch into contiguous slices (as ranks would take them) reproduces it.
void expect_layout_independent(const TokenSource& s, std::int64_t T, std::int64_t B) {
  const Tokens full = train(s, T, 5, 0, B);
  const Tokens full_val = val(s, T, 3, B, 0, B);
  for (std::int64_t ranks : std::vector<std::int64_t>{1, 2, 3, 4, 5, B}) {
    Tokens joined, joined_val;
    for (std::int64_t r = 0; r < ranks; ++r) {
      const std::int64_t first = r * B / ranks, count = (r + 1) * B / ranks - first;
      const Tokens part = train(s, T, 5, first, count);
      const Tokens part_val = val(s, T, 3, B, first, count);
      joined.insert(joined.end(), part.begin(), part.end());
      joined_val.insert(joined_val.end(), part_val.begin(), part_val.end());
    }
    EXPECT_EQ(joined, full) << ranks << " slices";
    EXPECT_EQ(joined_val, full_val) << ranks << " slices";
  }
}

void expect_deterministic_and_distinct(const TokenSource& s, std::int64_t T, std::int64_t B) {
  EXPECT_EQ(train(s, T, 7, 0, B), train(s, T, 7, 0, B));
  EXPECT_NE(train(s, T, 7, 0, B), train(s, T, 8, 0, B));
  EXPECT_NE(train(s, T, 7, 0, B), val(s, T, 7, B, 0, B));
  EXPECT_EQ(val(s, T, 2, B, 0, B), val(s, T, 2, B, 0, B));
  EXPECT_NE(val(s, T, 2, B, 0, B), val(s, T, 3, B, 0, B));
  // Sequences within one batch differ from each other too.
  const Tokens b = train(s, T, 7, 0, B);
  EXPECT_NE(seq(b, T, 0), seq(b, T, 1));
  // Every token is written (the buffers start at -1).
  for (auto t : b) EXPECT_GE(t, 0);
}

// Validation sequence j of batch b is window b*bs + j whatever bs is.
void expect_val_independent_of_batch_size(const TokenSource& s, std::int64_t T) {
  const Tokens by8 = val(s, T, 0, 8, 0, 8);
  const Tokens by4 = val(s, T, 1, 4, 0, 4);  // windows 4..7
  EXPECT_EQ(Tokens(by8.begin() + 4 * (T + 1), by8.end()), by4);
}

// All of the above for sequences of T tokens.
void expect_source_properties(const TokenSource& s, std::int64_t T) {
  expect_layout_independent(s, T, 12);
  expect_deterministic_and_distinct(s, T, 8);
  expect_val_independent_of_batch_size(s, T);
}

SourceSpec synthetic_spec(std::int64_t V = 64, std::int64_t T = 64, std::int64_t lag = 8,
                          double p = 0.75) {
  return {.vocab_size = V, .seq_len = T, .copy_lag = lag, .copy_prob = p};
}

// --- synthetic -----------------------------------------------------------------------------

TEST(Synthetic, LayoutIndependentDeterministicDistinct) {
  const auto s = make_token_source(synthetic_spec());
  expect_source_properties(*s, 64);
}

// Train and val are different streams: no validation window equals any training sequence of
// the same indices (a shared key would make val window w equal step w's sequence 0, say).
TEST(Synthetic, TrainAndValNeverCoincide) {
  const std::int64_t T = 16;
  const auto s = make_token_source(synthetic_spec(64, T));
  std::set<Tokens> seen;
  for (std::int64_t step = 0; step < 64; ++step) {
    const Tokens b = train(*s, T, step, 0, 8);
    for (std::int64_t i = 0; i < 8; ++i) seen.insert(seq(b, T, i));
  }
  const Tokens v = val(*s, T, 0, 512, 0, 512);
  for (std::int64_t w = 0; w < 512; ++w) EXPECT_EQ(seen.count(seq(v, T, w)), 0u) << "window " << w;
}

TEST(Synthetic, SameAfterRestartDifferentWithSeed) {
  SourceSpec spec = synthetic_spec();
  const Tokens a = train(*make_token_source(spec), 64, 11, 0, 4);
  EXPECT_EQ(a, train(*make_token_source(spec), 64, 11, 0, 4));
  spec.seed = 7;
  EXPECT_NE(a, train(*make_token_source(spec), 64, 11, 0, 4));
}

TEST(Synthetic, TokensInRangeAndUniform) {
  const std::int64_t V = 64, T = 64, N = 2000;
  const Tokens b = train(*make_token_source(synthetic_spec(V, T)), T, 0, 0, N);
  std::vector<std::int64_t> hist(V, 0);
  for (auto t : b) {
    ASSERT_GE(t, 0);
    ASSERT_LT(t, V);
    ++hist[t];
  }
  // Copies preserve the marginal: every token is uniform. ~2031 per bin, std ~45.
  const double mean = static_cast<double>(b.size()) / V;
  for (std::int64_t v = 0; v < V; ++v) EXPECT_NEAR(hist[v], mean, 0.15 * mean) << "token " << v;
}

// Fraction of positions t >= lag with x_t == x_{t-d}.
double match_rate(const Tokens& b, std::int64_t T, std::int64_t N, std::int64_t lag,
                  std::int64_t d) {
  std::int64_t hits = 0, total = 0;
  for (std::int64_t i = 0; i < N; ++i)
    for (std::int64_t t = std::max(lag, d); t <= T; ++t, ++total)
      hits += b[i * (T + 1) + t] == b[i * (T + 1) + t - d];
  return static_cast<double>(hits) / total;
}

TEST(Synthetic, CopyStructureAtExpectedRate) {
  const std::int64_t V = 64, T = 64, lag = 8, N = 2000;
  const double p = 0.75;
  const auto s = make_token_source(synthetic_spec(V, T, lag, p));
  const Tokens tr = train(*s, T, 3, 0, N), va = val(*s, T, 0, N, 0, N);
  // ~114k samples: std ~0.0013 of the rate.
  const double expect = p + (1 - p) / V;
  EXPECT_NEAR(match_rate(tr, T, N, lag, lag), expect, 0.01);
  EXPECT_NEAR(match_rate(va, T, N, lag, lag), expect, 0.01);
  // Other distances carry no structure: only chance matches.
  EXPECT_NEAR(match_rate(tr, T, N, lag, lag - 1), 1.0 / V, 0.01);
  EXPECT_NEAR(match_rate(tr, T, N, lag, lag + 1), 1.0 / V, 0.01);
  // The first lag tokens never copy: no match rate above chance between them.
  std::int64_t early = 0;
  for (std::int64_t i = 0; i < N; ++i)
    for (std::int64_t t = 1; t < lag; ++t) early += tr[i * (T + 1) + t] == tr[i * (T + 1)];
  EXPECT_NEAR(static_cast<double>(early) / (N * (lag - 1)), 1.0 / V, 0.01);
}

// Average loss of the Bayes-optimal predictor, which knows lag and p: the generated tokens
// (not the formula) decide each term, so a wrong generator or a wrong formula both show.
double monte_carlo_floor(const SourceSpec& spec, std::int64_t N) {
  const auto s = make_token_source(spec);
  const std::int64_t V = spec.vocab_size, T = spec.seq_len, lag = spec.copy_lag;
  const double p = spec.copy_prob, q = (1 - p) / V;
  const Tokens b = train(*s, T, 0, 0, N);
  double loss = 0;
  for (std::int64_t i = 0; i < N; ++i) {
    const std::int32_t* x = b.data() + i * (T + 1);
    for (std::int64_t t = 1; t <= T; ++t) {
      if (t < lag) loss += std::log(static_cast<double>(V));
      else loss -= std::log(x[t] == x[t - lag] ? p + q : q);
    }
  }
  return loss / static_cast<double>(N * T);
}

TEST(Synthetic, EntropyFloorMatchesMonteCarlo) {
  const std::vector<SourceSpec> cases = {
      synthetic_spec(64, 64, 8, 0.75),  // the default deck
      synthetic_spec(5, 12, 3, 0.5),    // small vocab: chance copies matter
      synthetic_spec(16, 10, 10, 0.9),  // lag == seq_len: one copying target
      synthetic_spec(50, 32, 1, 0.3),   // lag 1: every target can copy
  };
  for (const auto& spec : cases) {
    const auto s = make_token_source(spec);
    ASSERT_TRUE(s->entropy_floor().has_value());
    const double floor = *s->entropy_floor();
    const double mc = monte_carlo_floor(spec, 8000);
    EXPECT_NEAR(mc, floor, 0.01 * floor)
        << "V " << spec.vocab_size << " T " << spec.seq_len << " lag " << spec.copy_lag;
    EXPECT_LT(floor, std::log(static_cast<double>(spec.vocab_size)));
    EXPECT_GT(floor, 0.0);
  }
}

TEST(Synthetic, EntropyFloorEdgeCases) {
  const double ln64 = std::log(64.0);
  // Hand value for the default: q = 0.25/64, H = -(p+q)ln(p+q) - 63 q ln q.
  const double q = 0.25 / 64, h = -(0.75 + q) * std::log(0.75 + q) - 63 * q * std::log(q);
  EXPECT_NEAR(synthetic_entropy_floor(64, 64, 8, 0.75), (7 * ln64 + 57 * h) / 64, 1e-12);
  EXPECT_NEAR(synthetic_entropy_floor(64, 64, 8, 0.0), ln64, 1e-12);    // no copies
  EXPECT_NEAR(synthetic_entropy_floor(64, 64, 100, 0.75), ln64, 1e-12); // lag beyond window
  EXPECT_NEAR(synthetic_entropy_floor(64, 64, 8, 1.0), 7 * ln64 / 64, 1e-12);  // perfect copies
  EXPECT_NEAR(monte_carlo_floor(synthetic_spec(64, 64, 8, 1.0), 50), 7 * ln64 / 64, 1e-12);
}

TEST(Synthetic, DescribeMentionsParameters) {
  const std::string d = make_token_source(synthetic_spec())->describe();
  EXPECT_NE(d.find("synthetic"), std::string::npos) << d;
  EXPECT_NE(d.find("vocab 64"), std::string::npos) << d;
  EXPECT_NE(d.find("copy_lag 8"), std::string::npos) << d;
}

TEST(Spec, InvalidFieldsAreDataErrors) {
  auto bad = [](auto edit, const std::string& needle) {
    SourceSpec s = synthetic_spec();
    edit(s);
    expect_data_error([&] { make_token_source(s); }, {needle});
  };
  bad([](SourceSpec& s) { s.vocab_size = 0; }, "vocab_size");
  bad([](SourceSpec& s) { s.seq_len = 0; }, "seq_len");
  bad([](SourceSpec& s) { s.batch_size = 0; }, "batch_size");
  bad([](SourceSpec& s) { s.copy_lag = 0; }, "copy_lag");
  bad([](SourceSpec& s) { s.copy_prob = 1.5; }, "copy_prob");
  bad([](SourceSpec& s) { s.copy_prob = std::nan(""); }, "copy_prob");
  bad([](SourceSpec& s) { s.kind = SourceKind::text; }, "path");
  bad([](SourceSpec& s) { s.kind = SourceKind::tokens; s.path = "x"; s.val_fraction = 0; },
      "val_fraction");
  bad([](SourceSpec& s) { s.kind = SourceKind::text; s.path = "/nonexistent/pdtrain.txt"; },
      "/nonexistent/pdtrain.txt");
}

TEST(Spec, KindNames) {
  for (auto k : {SourceKind::synthetic, SourceKind::text, SourceKind::tokens})
    EXPECT_EQ(source_kind_from_string(to_string(k)), k);
  EXPECT_FALSE(source_kind_from_string("bytes").has_value());
}

TEST(Spec, CallerBugsAreInvalidArgument) {
  const auto s = make_token_source(synthetic_spec());
  Tokens out(10 * 65);
  EXPECT_THROW(s->train_sequences(-1, 0, 1, out.data()), std::invalid_argument);
  EXPECT_THROW(s->train_sequences(0, -1, 1, out.data()), std::invalid_argument);
  EXPECT_THROW(s->train_sequences(0, 0, 1, nullptr), std::invalid_argument);
  EXPECT_THROW(s->val_sequences(0, 4, 2, 3, out.data()), std::invalid_argument);  // past batch
  EXPECT_THROW(s->val_sequences(0, 0, 0, 0, out.data()), std::invalid_argument);
  EXPECT_NO_THROW(s->train_sequences(0, 0, 0, nullptr));
}

// --- text ---------------------------------------------------------------------------------

SourceSpec text_spec(std::int64_t T = 64) {
  return {.kind = SourceKind::text, .path = kShakespeare, .vocab_size = 256, .seq_len = T};
}

TEST(Text, ShakespeareTrainWindowsAreItsBytes) {
  const std::string text = read_file(kShakespeare);
  ASSERT_GT(text.size(), 1000000u) << kShakespeare;
  const SourceSpec spec = text_spec();
  const std::int64_t T = spec.seq_len, B = 16;
  const std::int64_t n_train = train_tokens(text.size(), 0.1);
  const auto s = make_token_source(spec);
  for (std::int64_t step : {0, 1, 999}) {
    const Tokens b = train(*s, T, step, 0, B);
    for (std::int64_t i = 0; i < B; ++i) {
      // The start the spec prescribes, and the window the file holds there.
      const auto start = static_cast<std::int64_t>(
          rng_below(rng_key(spec.seed, kTrainTag, step, i), 0, n_train - T));
      ASSERT_LE(start + T, n_train - 1);
      EXPECT_EQ(seq(b, T, i), bytes_at(text, start, T + 1)) << "step " << step << " seq " << i;
    }
  }
}

TEST(Text, TrainStaysInsideTrainingSplit) {
  // A short file: the training split is 90 bytes, so offsets cover the range and ends.
  std::string text;
  for (int i = 0; i < 100; ++i) text += static_cast<char>('a' + i % 26);
  text[89] = '#';  // last training byte
  text[90] = '!';  // first validation byte: must never appear in training sequences
  const std::string path = temp_path("small.txt");
  write_bytes(path, std::vector<std::uint8_t>(text.begin(), text.end()));
  SourceSpec spec = text_spec(8);
  spec.path = path;
  const auto s = make_token_source(spec);
  bool saw_last = false;
  for (std::int64_t step = 0; step < 200; ++step) {
    const Tokens b = train(*s, 8, step, 0, 4);
    for (auto t : b) EXPECT_NE(t, '!');
    for (auto t : b) saw_last |= t == '#';
  }
  EXPECT_TRUE(saw_last);  // the last training byte is reachable
}

TEST(Text, ValidationWindowsConsecutiveAndWrap) {
  const std::string text = read_file(kShakespeare);
  const SourceSpec spec = text_spec();
  const std::int64_t T = spec.seq_len, bs = 16;
  const std::int64_t n_train = train_tokens(text.size(), 0.1);
  const std::int64_t n_val = static_cast<std::int64_t>(text.size()) - n_train;
  const std::int64_t windows = (n_val - 1) / T;
  const auto s = make_token_source(spec);
  // Window w starts at w*T of the validation split, whatever batch holds it.
  for (std::int64_t w : {std::int64_t{0}, std::int64_t{1}, std::int64_t{17}, windows - 1}) {
    const Tokens b = val(*s, T, w / bs, bs, w % bs, 1);
    EXPECT_EQ(b, bytes_at(text, n_train + w * T, T + 1)) << "window " << w;
  }
  // Consecutive, non-overlapping: a window's last token is the next one's first.
  const Tokens b0 = val(*s, T, 0, bs, 0, bs);
  for (std::int64_t j = 0; j + 1 < bs; ++j) EXPECT_EQ(b0[j * (T + 1) + T], b0[(j + 1) * (T + 1)]);
  // Past the last whole window it wraps to window 0 (and the next batch continues).
  for (std::int64_t w : {windows, windows + 5, 3 * windows + 2}) {
    const Tokens b = val(*s, T, w / bs, bs, w % bs, 1);
    EXPECT_EQ(b, bytes_at(text, n_train + (w % windows) * T, T + 1)) << "window " << w;
  }
}

TEST(Text, LayoutIndependentDeterministicDistinct) {
  const auto s = make_token_source(text_spec());
  expect_source_properties(*s, 64);
}

TEST(Text, DescribeNamesFileAndCounts) {
  const std::string d = make_token_source(text_spec())->describe();
  EXPECT_NE(d.find("text"), std::string::npos) << d;
  EXPECT_NE(d.find("tinyshakespeare.txt"), std::string::npos) << d;
  EXPECT_NE(d.find("1003855"), std::string::npos) << d;  // training tokens: 1115394 - 111539
  EXPECT_NE(d.find("111539"), std::string::npos) << d;   // validation tokens: round(111539.4)
  EXPECT_NE(d.find("vocab 256"), std::string::npos) << d;
  EXPECT_FALSE(make_token_source(text_spec())->entropy_floor().has_value());
}

TEST(Text, ByteBeyondVocabNamesOffsetAndValue) {
  SourceSpec spec = text_spec();
  spec.vocab_size = 64;  // "First Citizen": 'F' is 70
  expect_data_error([&] { make_token_source(spec); },
                    {"tinyshakespeare.txt", "byte offset 0", "70", "vocab_size 64"});
  // An offending byte later in the file, and one in a separate validation file.
  const std::string path = temp_path("bytes.txt"), vpath = temp_path("val.txt");
  std::vector<std::uint8_t> bytes(300, 'a');
  bytes[123] = 200;
  write_bytes(path, bytes);
  spec.path = path;
  spec.vocab_size = 128;
  spec.seq_len = 8;
  expect_data_error([&] { make_token_source(spec); }, {path, "byte offset 123", "200"});
  bytes[123] = 'a';
  write_bytes(path, bytes);
  bytes[7] = 130;
  write_bytes(vpath, bytes);
  spec.val_path = vpath;
  expect_data_error([&] { make_token_source(spec); }, {vpath, "byte offset 7", "130"});
}

TEST(Text, SeparateValidationFile) {
  const std::string path = temp_path("train.txt"), vpath = temp_path("val.txt");
  write_bytes(path, std::vector<std::uint8_t>(40, 'x'));
  std::vector<std::uint8_t> v;
  // 32 = 4 * 8 tokens but only 3 whole windows: window 3 would need a 33rd token.
  for (int i = 0; i < 32; ++i) v.push_back(static_cast<std::uint8_t>('A' + i));
  write_bytes(vpath, v);
  SourceSpec spec = text_spec(8);
  spec.path = path;
  spec.val_path = vpath;
  spec.val_fraction = 0;  // ignored with a validation file
  const auto s = make_token_source(spec);
  for (auto t : train(*s, 8, 0, 0, 4)) EXPECT_EQ(t, 'x');  // the whole file is training
  // (32 - 1) / 8 = 3 windows: 'A'.., 'I'.., 'Q'..; window 3 wraps to 'A'.
  const Tokens b = val(*s, 8, 0, 4, 0, 4);
  EXPECT_EQ(b[0], 'A');
  EXPECT_EQ(b[9], 'I');
  EXPECT_EQ(b[18], 'Q');
  EXPECT_EQ(b[26], 'Y');  // the last token of the last whole window
  EXPECT_EQ(b[27], 'A');
}

TEST(Text, SplitsTooSmall) {
  const std::string path = temp_path("tiny.txt");
  write_bytes(path, std::vector<std::uint8_t>(100, 'z'));
  SourceSpec spec = text_spec(16);  // validation: last 10 bytes < 17
  spec.path = path;
  expect_data_error([&] { make_token_source(spec); }, {path, "validation split", "10 tokens", "17"});
  spec.val_fraction = 0.9;  // training: first 10 bytes
  expect_data_error([&] { make_token_source(spec); }, {path, "training split", "10 tokens", "17"});
  write_bytes(path, {});
  spec.val_fraction = 0.5;
  expect_data_error([&] { make_token_source(spec); }, {path, "0 tokens"});
}

// --- tokens (llm.c shards) ----------------------------------------------------------------

SourceSpec tokens_spec(const std::string& path, std::int64_t T = 16) {
  return {.kind = SourceKind::tokens, .path = path, .vocab_size = 50257, .seq_len = T};
}

TEST(Tokens, GoodShardReadsItsTokens) {
  const std::string path = temp_path("good.bin");
  const std::vector<std::uint16_t> toks = ramp(1000, 50257);
  write_token_shard(path, toks);
  ASSERT_EQ(std::filesystem::file_size(path), 1024u + 2 * 1000u);
  const SourceSpec spec = tokens_spec(path);
  const std::int64_t T = spec.seq_len, n_train = 900;
  const auto s = make_token_source(spec);
  const Tokens b = train(*s, T, 4, 0, 8);
  for (std::int64_t i = 0; i < 8; ++i) {
    const auto start =
        static_cast<std::int64_t>(rng_below(rng_key(spec.seed, kTrainTag, 4, i), 0, n_train - T));
    for (std::int64_t t = 0; t <= T; ++t) EXPECT_EQ(b[i * (T + 1) + t], toks[start + t]);
  }
  // 100 validation tokens: (100 - 1) / 16 = 6 windows; window 6 is window 0 again.
  const Tokens v = val(*s, T, 0, 7, 0, 7);
  for (std::int64_t w = 0; w < 7; ++w)
    for (std::int64_t t = 0; t <= T; ++t)
      EXPECT_EQ(v[w * (T + 1) + t], toks[n_train + (w % 6) * T + t]) << "window " << w;
  // Large token values survive the little-endian decode.
  EXPECT_NE(s->describe().find("900"), std::string::npos) << s->describe();
  const std::vector<std::uint16_t> high = {50256, 256, 255, 1, 0, 50000, 40000, 65535 % 50257};
  std::vector<std::uint16_t> more(200, 50256);
  std::copy(high.begin(), high.end(), more.begin() + 180);
  write_token_shard(path, more);
  const Tokens v2 = val(*make_token_source(spec), T, 0, 1, 0, 1);
  for (std::size_t k = 0; k < high.size(); ++k) EXPECT_EQ(v2[k], high[k]);
}

TEST(Tokens, LayoutIndependentDeterministicDistinct) {
  const std::string path = temp_path("layout.bin");
  write_token_shard(path, ramp(5000, 50257));
  const auto s = make_token_source(tokens_spec(path, 32));
  expect_source_properties(*s, 32);
}

TEST(Tokens, SeparateValidationShard) {
  const std::string path = temp_path("train.bin"), vpath = temp_path("val.bin");
  write_token_shard(path, std::vector<std::uint16_t>(50, 7));
  write_token_shard(vpath, ramp(40, 1000));
  SourceSpec spec = tokens_spec(path, 8);
  spec.val_path = vpath;
  const auto s = make_token_source(spec);
  for (auto t : train(*s, 8, 0, 0, 3)) EXPECT_EQ(t, 7);
  const auto vt = ramp(40, 1000);
  const Tokens v = val(*s, 8, 1, 2, 0, 1);  // window 2
  for (std::int64_t t = 0; t <= 8; ++t) EXPECT_EQ(v[t], vt[16 + t]);
}

TEST(Tokens, Errors) {
  const std::string path = temp_path("bad.bin");
  const auto toks = ramp(200, 50257);
  const SourceSpec spec = tokens_spec(path);
  auto expect = [&](const std::vector<std::uint8_t>& bytes, std::vector<std::string> needles) {
    write_bytes(path, bytes);
    needles.push_back(path);
    expect_data_error([&] { make_token_source(spec); }, needles);
  };
  expect(raw_shard(20240521, 1, 200, toks), {"magic", "20240521", "20240520"});
  expect(raw_shard(20240520, 2, 200, toks), {"version", "2"});
  std::vector<std::uint8_t> truncated = raw_shard(20240520, 1, 200, toks);
  truncated.resize(truncated.size() - 3);
  expect(truncated, {"size", "1421", "200", "1424"});
  expect(raw_shard(20240520, 1, 201, toks), {"size", "201", "1426"});  // count too large
  expect(raw_shard(20240520, 1, -5, {}), {"negative", "-5"});
  expect(std::vector<std::uint8_t>(100, 0), {"100 bytes", "shorter", "header"});
  expect({}, {"0 bytes", "shorter"});
  auto out_of_vocab = toks;
  out_of_vocab[150] = 60000;
  expect(raw_shard(20240520, 1, 200, out_of_vocab), {"token index 150", "60000", "50257"});
  expect(raw_shard(20240520, 1, 16, ramp(16, 50257)), {"training split", "14 tokens", "17"});
  expect(raw_shard(20240520, 1, 100, ramp(100, 50257)), {"validation split", "10 tokens", "17"});
  std::filesystem::remove(path);
  expect_data_error([&] { make_token_source(spec); }, {path, "cannot open"});
  expect_data_error([&] { make_token_source(tokens_spec(testing::TempDir())); },
                    {"not a regular file"});
}

TEST(Tokens, SmallVocabRejectsLargeTokenInValidationShard) {
  const std::string path = temp_path("t.bin"), vpath = temp_path("v.bin");
  write_token_shard(path, ramp(100, 64));
  auto v = ramp(100, 64);
  v[42] = 64;
  write_token_shard(vpath, v);
  SourceSpec spec = tokens_spec(path);
  spec.vocab_size = 64;
  spec.val_path = vpath;
  expect_data_error([&] { make_token_source(spec); }, {vpath, "token index 42", "64"});
}

TEST(SplitInputsTargets, TargetsAreTheInputsShiftedByOneToken) {
  // Two sequences of seq_len + 1 = 4 tokens.
  const Tokens seq = {10, 11, 12, 13, 20, 21, 22, 23};
  Tokens inputs(6), targets(6);
  split_inputs_targets(seq.data(), 2, 3, inputs.data(), targets.data());
  EXPECT_EQ(inputs, (Tokens{10, 11, 12, 20, 21, 22}));
  EXPECT_EQ(targets, (Tokens{11, 12, 13, 21, 22, 23}));
}

TEST(DataFile, ReadsAndMoves) {
  const std::string path = temp_path("m.bin");
  write_bytes(path, {1, 2, 3});
  DataFile a(path);
  ASSERT_EQ(a.size(), 3);
  DataFile b(std::move(a));
  std::uint8_t byte = 0;
  b.read(2, 1, &byte);
  EXPECT_EQ(byte, 3);
  EXPECT_EQ(b.path(), path);
}

// A FIFO would block open() until a writer came; it is refused before it is opened.
TEST(DataFile, RefusesAFifoWithoutBlocking) {
  const std::string path = temp_path("fifo");
  std::remove(path.c_str());
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  expect_data_error([&] { DataFile f(path); }, {path, "FIFO", "not a regular file"});
  expect_data_error([&] { DataFile f(testing::TempDir()); }, {"a directory"});
}

// A file that shrinks under a running job is an error naming it, not SIGBUS.
TEST(DataFile, TruncatedWhileOpenIsAnErrorNamingTheFile) {
  const std::string path = temp_path("shrinks.bin");
  write_bytes(path, std::vector<std::uint8_t>(4096, 7));
  DataFile f(path);
  ASSERT_EQ(::truncate(path.c_str(), 100), 0);
  std::vector<std::uint8_t> out(16);
  expect_data_error([&] { f.read(4000, out.size(), out.data()); },
                    {path, "changed while the job was running", "4096 bytes, now 100 bytes"});
}

TEST(WindowSource, FileTruncatedAfterOpeningEndsTheReadNamingTheFile) {
  const std::string path = temp_path("corpus_shrinks.txt");
  write_bytes(path, std::vector<std::uint8_t>(10000, 5));
  SourceSpec spec;
  spec.kind = SourceKind::text;
  spec.path = path;
  spec.vocab_size = 64;
  spec.seq_len = 8;
  const auto source = make_token_source(spec);
  ASSERT_EQ(::truncate(path.c_str(), 50), 0);
  std::vector<std::int32_t> seq(9);
  expect_data_error([&] { source->train_sequences(1, 0, 1, seq.data()); },
                    {path, "changed while the job was running"});
}

}  // namespace
}  // namespace pdtrain::data
