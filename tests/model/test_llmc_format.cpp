// llm.c's GPT-2 checkpoint format: the byte layout is exactly llm.c's (header ints at their
// offsets, parameters in llm.c's order), a round trip is bit-identical, and every malformed or
// mismatching file is an ExitCode::data error naming the field and the file.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "pdtrain/core/error.hpp"
#include "pdtrain/model/catalog.hpp"
#include "pdtrain/model/llmc_format.hpp"

#include "../support/model_shapes.hpp"

namespace pdtrain {
namespace {

// L=2, NH=4, C=16, V=50 padded to Vp=128, maxT=10: the numbers the tests below write by hand.
using test::tiny_shape;

std::string temp_path(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return ::testing::TempDir() + "pdtrain_llmc_" + info->name() + "_" + name;
}

std::vector<unsigned char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::int32_t le32_at(const std::vector<unsigned char>& b, std::size_t at) {
  return static_cast<std::int32_t>(static_cast<std::uint32_t>(b[at]) | b[at + 1] << 8 |
                                   b[at + 2] << 16 | static_cast<std::uint32_t>(b[at + 3]) << 24);
}

void put_le32(std::vector<unsigned char>& b, std::size_t at, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + i] = static_cast<unsigned char>(v >> (8 * i));
}

float float_at(const std::vector<unsigned char>& b, std::size_t at) {
  const std::uint32_t u = static_cast<std::uint32_t>(le32_at(b, at));
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// A file built by hand, independently of write_llmc: header ints (the rest zero) followed by
// `n_floats` little-endian floats whose value is their index.
std::vector<unsigned char> hand_file(std::initializer_list<std::int32_t> header, std::int64_t n_floats) {
  std::vector<unsigned char> b(1024 + 4 * static_cast<std::size_t>(n_floats), 0);
  std::size_t at = 0;
  for (std::int32_t v : header) {
    put_le32(b, at, static_cast<std::uint32_t>(v));
    at += 4;
  }
  for (std::int64_t i = 0; i < n_floats; ++i) {
    const float f = static_cast<float>(i);
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    put_le32(b, 1024 + 4 * static_cast<std::size_t>(i), u);
  }
  return b;
}

// llm.c's count, written out: Vp*C + maxT*C + L*(12 C^2 + 13 C) + 2 C.
std::int64_t llmc_count(std::int64_t Vp, std::int64_t maxT, std::int64_t L, std::int64_t C) {
  return Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C;
}

// The header of tiny_shape(): magic, version, maxT, V, L, NH, C, Vp.
std::vector<unsigned char> small_file() { return hand_file({20240326, 3, 10, 50, 2, 4, 16, 128}, llmc_count(128, 10, 2, 16)); }

// Runs fn, expecting Error(ExitCode::data) whose message contains every one of `parts`.
void expect_data_error(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::data) << e.what();
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message '" << msg << "' lacks '" << p << "'";
    return;
  }
  ADD_FAILURE() << "expected pdtrain::Error(ExitCode::data)";
}

std::vector<float> random_params(const ParamCatalog& cat, std::uint32_t seed) {
  // Arbitrary bit patterns (NaN payloads, -0, denormals included): the round trip must keep bits.
  std::mt19937 gen(seed);
  std::vector<float> p(static_cast<std::size_t>(cat.total_numel()));
  for (float& f : p) {
    const std::uint32_t u = gen();
    std::memcpy(&f, &u, 4);
  }
  return p;
}

TEST(LlmcFormat, ParamCountIsLlmcs) {
  const ModelShape s = tiny_shape();
  ASSERT_EQ(s.padded_vocab, 128);
  const ParamCatalog cat(s);
  EXPECT_EQ(cat.total_numel(), llmc_count(128, 10, 2, 16));
  EXPECT_EQ(cat.total_numel(), 8800);
  const LlmcHeader h{20240326, 3, 10, 50, 2, 4, 16, 128};
  EXPECT_EQ(llmc_param_count(h), cat.total_numel());
  // GPT-2 124M as llm.c ships it: 124,475,904 parameters.
  const LlmcHeader gpt2{20240326, 3, 1024, 50257, 12, 12, 768, 50304};
  EXPECT_EQ(llmc_param_count(gpt2), 124475904);
  const ModelShape gpt2_124m = resolve_model_shape(
      {.n_layer = 12, .n_head = 12, .d_model = 768, .vocab_size = 50257, .seq_len = 1024});
  EXPECT_EQ(ParamCatalog(gpt2_124m).total_numel(), 124475904);
}

TEST(LlmcFormat, RoundTripIsBitIdentical) {
  const ParamCatalog cat(tiny_shape());
  const std::vector<float> params = random_params(cat, 1234);
  const std::string path = temp_path("model.bin");
  write_llmc(path, cat, params.data());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  const LlmcHeader h = read_llmc_header(path);
  EXPECT_EQ(h.magic, 20240326);
  EXPECT_EQ(h.version, 3);
  EXPECT_EQ(h.max_seq_len, 10);
  EXPECT_EQ(h.vocab_size, 50);
  EXPECT_EQ(h.n_layer, 2);
  EXPECT_EQ(h.n_head, 4);
  EXPECT_EQ(h.channels, 16);
  EXPECT_EQ(h.padded_vocab_size, 128);

  std::vector<float> back;
  read_llmc_params(path, cat, back);
  ASSERT_EQ(back.size(), params.size());
  EXPECT_EQ(std::memcmp(back.data(), params.data(), params.size() * 4), 0);

  // Writing again over an existing file (different values) replaces it.
  const std::vector<float> params2 = random_params(cat, 99);
  write_llmc(path, cat, params2.data());
  read_llmc_params(path, cat, back);
  EXPECT_EQ(std::memcmp(back.data(), params2.data(), params2.size() * 4), 0);
}

TEST(LlmcFormat, FileLayoutIsLlmcs) {
  const ParamCatalog cat(tiny_shape());
  std::vector<float> params(static_cast<std::size_t>(cat.total_numel()));
  for (std::size_t i = 0; i < params.size(); ++i) params[i] = static_cast<float>(i) + 0.5f;
  const std::string path = temp_path("model.bin");
  write_llmc(path, cat, params.data());
  const std::vector<unsigned char> b = read_bytes(path);

  const std::int64_t Vp = 128, maxT = 10, L = 2, C = 16;
  ASSERT_EQ(static_cast<std::int64_t>(b.size()), 1024 + 4 * llmc_count(Vp, maxT, L, C));
  const std::int32_t expect_header[8] = {20240326, 3, 10, 50, 2, 4, 16, 128};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(le32_at(b, 4 * i), expect_header[i]) << "header int " << i;
  for (int i = 8; i < 256; ++i) EXPECT_EQ(le32_at(b, 4 * i), 0) << "header int " << i;

  // The first float after the header is wte[0][0].
  EXPECT_EQ(float_at(b, 1024), params[0]);
  // llm.c's offsets, by hand: wte, wpe, ln1w [L,C], ln1b [L,C], then qkvw [L,3C,C].
  const std::int64_t qkvw = Vp * C + maxT * C + L * C + L * C;
  const std::int64_t qkvw_layer1 = qkvw + 3 * C * C;
  EXPECT_EQ(float_at(b, 1024 + 4 * qkvw_layer1), static_cast<float>(qkvw_layer1) + 0.5f);
  // ...and the catalogue's block for h.1.qkvw row 0 col 0 maps there.
  bool found = false;
  for (const BlockInfo& blk : cat.blocks())
    if (blk.tensor == TensorId::qkvw && blk.layer == 1 && blk.row0 == 0 && blk.col0 == 0) {
      EXPECT_EQ(cat.canonical_index(blk, 0, 0), qkvw_layer1);
      found = true;
    }
  EXPECT_TRUE(found);
  // wpe[0][0] follows the Vp rows of wte (padded rows included); lnfb[C-1] is the last float.
  EXPECT_EQ(float_at(b, 1024 + 4 * Vp * C), static_cast<float>(Vp * C) + 0.5f);
  const std::int64_t last = llmc_count(Vp, maxT, L, C) - 1;
  EXPECT_EQ(float_at(b, b.size() - 4), static_cast<float>(last) + 0.5f);
}

TEST(LlmcFormat, ReadsAHandBuiltFileKeepingPaddedRows) {
  // Built without write_llmc; padded wte rows 50..127 hold nonzero values and are kept.
  const std::string path = temp_path("hand.bin");
  write_bytes(path, small_file());
  const ParamCatalog cat(tiny_shape());
  std::vector<float> p;
  read_llmc_params(path, cat, p);
  ASSERT_EQ(static_cast<std::int64_t>(p.size()), cat.total_numel());
  for (std::size_t i = 0; i < p.size(); ++i) ASSERT_EQ(p[i], static_cast<float>(i)) << "element " << i;
  EXPECT_EQ(p[static_cast<std::size_t>(127 * 16)], 127.0f * 16);  // wte[127][0], a padded row
}

TEST(LlmcFormat, ShapeFromHeader) {
  const LlmcHeader h{20240326, 3, 10, 50, 2, 4, 16, 128};
  const ModelShape s = shape_from_llmc(h, 8, "m.bin");
  EXPECT_EQ(s.n_layer, 2);
  EXPECT_EQ(s.n_head, 4);
  EXPECT_EQ(s.d_model, 16);
  EXPECT_EQ(s.vocab_size, 50);
  EXPECT_EQ(s.padded_vocab, 128);
  EXPECT_EQ(s.seq_len, 8);
  EXPECT_EQ(s.max_seq_len, 10);
  EXPECT_NO_THROW(check_llmc_shape(h, s, "m.bin"));
  EXPECT_NO_THROW(check_llmc_shape(h, tiny_shape(), "m.bin"));
  EXPECT_EQ(ParamCatalog(s).total_numel(), llmc_param_count(h));
}

TEST(LlmcFormat, SeqLenBeyondMaxSeqLen) {
  const LlmcHeader h{20240326, 3, 10, 50, 2, 4, 16, 128};
  expect_data_error([&] { shape_from_llmc(h, 11, "/x/m.bin"); },
                    {"model.seq_len = 11", "max_seq_len = 10", "/x/m.bin"});
  EXPECT_NO_THROW(shape_from_llmc(h, 10, "/x/m.bin"));
  ModelShape s = tiny_shape();
  s.seq_len = 12;
  expect_data_error([&] { check_llmc_shape(h, s, "/x/m.bin"); },
                    {"model.seq_len = 12", "max_seq_len = 10", "/x/m.bin"});
}

TEST(LlmcFormat, ShapeMismatchNamesTheField) {
  const std::string path = temp_path("model.bin");
  write_bytes(path, small_file());
  const LlmcHeader h = read_llmc_header(path);
  struct Mismatch {
    std::int64_t ModelShape::*field;
    std::int64_t value;
    std::string message;
  };
  for (const Mismatch& m : {
           Mismatch{&ModelShape::n_layer, 6, "model.n_layer = 6 in the deck but num_layers = 2"},
           Mismatch{&ModelShape::n_head, 2, "model.n_head = 2 in the deck but num_heads = 4"},
           Mismatch{&ModelShape::d_model, 32, "model.d_model = 32 in the deck but channels = 16"},
           Mismatch{&ModelShape::vocab_size, 64,
                    "model.vocab_size = 64 in the deck but vocab_size = 50"},
           Mismatch{&ModelShape::padded_vocab, 256,
                    "model.padded_vocab_size = 256 in the deck but padded_vocab_size = 128"},
           Mismatch{&ModelShape::max_seq_len, 8,
                    "model.max_seq_len = 8 in the deck but max_seq_len = 10"}}) {
    ModelShape s = tiny_shape();
    s.*m.field = m.value;
    expect_data_error([&] { check_llmc_shape(h, s, path); }, {m.message + " in " + path});
  }

  // read_llmc_params checks the catalogue's shape before reading anything.
  ModelShape wrong = tiny_shape();
  wrong.n_layer = 3;
  std::vector<float> p;
  expect_data_error([&] { read_llmc_params(path, ParamCatalog(wrong), p); },
                    {"model.n_layer = 3 in the deck but num_layers = 2 in " + path});
}

TEST(LlmcFormat, HeaderErrorsNameTheFieldAndTheFile) {
  const std::int64_t n = llmc_count(128, 10, 2, 16);
  struct Case {
    const char* what;
    std::vector<unsigned char> bytes;
    std::vector<std::string> parts;
  };
  std::vector<Case> cases;
  cases.push_back({"wrong magic", hand_file({20240325, 3, 10, 50, 2, 4, 16, 128}, n),
                   {"magic", "20240325", "20240326"}});
  cases.push_back({"bf16", hand_file({20240326, 5, 10, 50, 2, 4, 16, 128}, n / 2),
                   {"version = 5", "bf16", "version 3"}});
  cases.push_back({"version 1", hand_file({20240326, 1, 10, 50, 2, 4, 16, 128}, n),
                   {"version = 1"}});
  cases.push_back({"zero layers", hand_file({20240326, 3, 10, 50, 0, 4, 16, 128}, n),
                   {"num_layers = 0", "positive"}});
  cases.push_back({"negative channels", hand_file({20240326, 3, 10, 50, 2, 4, -16, 128}, n),
                   {"channels = -16", "positive"}});
  cases.push_back({"heads do not divide channels", hand_file({20240326, 3, 10, 50, 2, 3, 16, 128}, n),
                   {"channels = 16", "num_heads = 3"}});
  cases.push_back({"padded vocab too small", hand_file({20240326, 3, 10, 50, 2, 4, 16, 40}, n),
                   {"padded_vocab_size = 40", "vocab_size = 50"}});
  std::vector<unsigned char> truncated = small_file();
  truncated.resize(truncated.size() - 4);
  const std::string want = std::to_string(1024 + 4 * n);
  cases.push_back({"truncated", truncated,
                   {"file size", std::to_string(1024 + 4 * n - 4), want, std::to_string(n)}});
  std::vector<unsigned char> extra = small_file();
  extra.push_back(0);
  cases.push_back({"extra bytes", extra,
                   {"file size", std::to_string(1024 + 4 * n + 1), want, "extra bytes"}});
  cases.push_back({"short header", std::vector<unsigned char>(1000, 0),
                   {"short header", "1000", "1024"}});

  for (std::size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].what);
    const std::string path = temp_path("case" + std::to_string(i) + ".bin");
    write_bytes(path, cases[i].bytes);
    std::vector<std::string> parts = cases[i].parts;
    parts.push_back(path);
    try {
      read_llmc_header(path);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::data);
      const std::string msg = e.what();
      for (const std::string& p : parts)
        EXPECT_NE(msg.find(p), std::string::npos) << "message '" << msg << "' lacks '" << p << "'";
    }
    // read_llmc_params validates the header the same way.
    std::vector<float> p;
    expect_data_error([&] { read_llmc_params(path, ParamCatalog(tiny_shape()), p); }, {path});
  }
}

TEST(LlmcFormat, MissingFile) {
  const std::string path = temp_path("does_not_exist.bin");
  expect_data_error([&] { read_llmc_header(path); }, {path, "cannot open"});
}

TEST(LlmcFormat, UnwritablePathIsARuntimeErrorNamingTheFile) {
  const ParamCatalog cat(tiny_shape());
  const std::vector<float> params(static_cast<std::size_t>(cat.total_numel()), 0.0f);
  const std::string path = temp_path("no_such_dir") + "/model.bin";
  try {
    write_llmc(path, cat, params.data());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::runtime);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pdtrain
